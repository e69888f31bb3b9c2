package model

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/runtime"
)

// fill sets every field reachable from v to a value that is not zero:
// each pointer, slice (two elements) and map (one entry) made anew.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Unix(1700000000, 0)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(v.Index(i))
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	}
}

// shared names the first pointer, slice or map that a and b share.
func shared(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return ""
		}
		if a.Pointer() == b.Pointer() {
			return path
		}
		return shared(a.Elem(), b.Elem(), path)
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				if s := shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); s != "" {
					return s
				}
			}
		}
	case reflect.Slice:
		if a.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
		for i := range a.Len() {
			if s := shared(a.Index(i), b.Index(i), path+"[]"); s != "" {
				return s
			}
		}
	case reflect.Map:
		if a.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
	}
	return ""
}

func TestDeepCopyObjectSharesNothing(t *testing.T) {
	for _, obj := range []runtime.Object{&Service{}, &EndpointSlice{}} {
		fill(reflect.ValueOf(obj).Elem())
		c := obj.DeepCopyObject()
		if d := cmp.Diff(obj, c, cmpopts.EquateComparable(netip.Addr{})); d != "" {
			t.Errorf("%T: copy differs (-orig +copy):\n%s", obj, d)
		}
		if s := shared(reflect.ValueOf(obj), reflect.ValueOf(c), reflect.TypeOf(obj).Elem().Name()); s != "" {
			t.Errorf("%T: the copy shares %s", obj, s)
		}
		if k := c.GetObjectKind().GroupVersionKind(); !k.Empty() {
			t.Errorf("%T: kind %v, want none", obj, k)
		}
	}
	if (*Service)(nil).DeepCopyObject().(*Service) != nil || (*EndpointSlice)(nil).DeepCopyObject().(*EndpointSlice) != nil {
		t.Error("a nil object's copy is not nil")
	}
}
