package v1alpha1

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestAddToScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj, err := scheme.New(GroupVersionKind())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := obj.(*IPVSProxyConfiguration); !ok {
		t.Errorf("scheme.New(%s) = %T", GroupVersionKind(), obj)
	}
	if gv := GroupVersion().String(); gv != "config.ipvs-proxy.io/v1alpha1" {
		t.Errorf("group version %s", gv)
	}
}

// setLists sets every list of v, a struct, to one item.
func setLists(v reflect.Value) {
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"item"}))
		case reflect.Struct:
			setLists(f)
		}
	}
}

// TestDeepCopy: the copy equals the original and shares no list with it.
func TestDeepCopy(t *testing.T) {
	c := &IPVSProxyConfiguration{HostnameOverride: "node-1"}
	c.IPVS.Scheduler = "wrr"
	setLists(reflect.ValueOf(c).Elem())
	cp, ok := c.DeepCopyObject().(*IPVSProxyConfiguration)
	if !ok {
		t.Fatalf("DeepCopyObject is a %T", c.DeepCopyObject())
	}
	if diff := cmp.Diff(c, cp); diff != "" {
		t.Errorf("copy (-original +copy):\n%s", diff)
	}
	var check func(a, b reflect.Value, path string)
	check = func(a, b reflect.Value, path string) {
		for i := range a.NumField() {
			name := path + "." + a.Type().Field(i).Name
			switch fa, fb := a.Field(i), b.Field(i); fa.Kind() {
			case reflect.Slice:
				fb.Index(0).SetString("changed")
				if fa.Index(0).String() != "item" {
					t.Errorf("%s is shared by the copy", name)
				}
			case reflect.Struct:
				check(fa, fb, name)
			}
		}
	}
	cp = c.DeepCopy()
	check(reflect.ValueOf(c).Elem(), reflect.ValueOf(cp).Elem(), "IPVSProxyConfiguration")
	if (*IPVSProxyConfiguration)(nil).DeepCopy() != nil {
		t.Error("a nil configuration's copy is not nil")
	}
}
