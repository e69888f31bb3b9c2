package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// pagedServices serves n Services in pages as an apiserver does, recording
// each call's options; failAt > 0 fails that call.
type pagedServices struct {
	n, failAt int
	calls     []metav1.ListOptions
}

func (s *pagedServices) list(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
	s.calls = append(s.calls, o)
	if len(s.calls) == s.failAt {
		return nil, apierrors.NewResourceExpired("continue token expired")
	}
	from := 0
	if o.Continue != "" {
		from, _ = strconv.Atoi(o.Continue)
	}
	to := min(from+int(o.Limit), s.n)
	l := &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "100"}}
	if to < s.n {
		l.Continue = strconv.Itoa(to)
		left := int64(s.n - to)
		l.RemainingItemCount = &left
	}
	for i := from; i < to; i++ {
		l.Items = append(l.Items, corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), ResourceVersion: strconv.Itoa(i + 1),
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, Annotations: map[string]string{"big": "x"}},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", i+1), Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		})
	}
	return l, nil
}

func (s *pagedServices) lister() *pagedListWatch {
	return &pagedListWatch{list: s.list, transform: model.Compact, page: 2,
		watch: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return nil, errors.New("no watch") }}
}

func TestPagedListKeepsCompactObjects(t *testing.T) {
	s := &pagedServices{n: 5}
	obj, err := s.lister().ListWithContext(context.Background(),
		metav1.ListOptions{ResourceVersion: "0", Limit: 500, LabelSelector: "a=b", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	// Three pages of 2, from the most recent state, the reflector's
	// selector kept, its version and limit not.
	want := []metav1.ListOptions{
		{LabelSelector: "a=b", Limit: 2},
		{LabelSelector: "a=b", Limit: 2, Continue: "2"},
		{LabelSelector: "a=b", Limit: 2, Continue: "4"},
	}
	if d := cmp.Diff(want, s.calls); d != "" {
		t.Errorf("list calls (-want +got):\n%s", d)
	}
	l := obj.(*compactList)
	if l.ResourceVersion != "100" || len(l.Items) != 5 {
		t.Fatalf("list at version %q with %d items, want 100 and 5", l.ResourceVersion, len(l.Items))
	}
	// What the reflector reads of it: the version and the items, each the
	// agent's compact Service.
	lm, err := meta.ListAccessor(obj)
	if err != nil || lm.GetResourceVersion() != "100" {
		t.Errorf("ListAccessor: %v, %v", lm, err)
	}
	items, err := meta.ExtractListWithAlloc(obj)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		svc, ok := it.(*model.Service)
		if !ok {
			t.Fatalf("item %d is a %T, want *model.Service", i, it)
		}
		if svc.Name != fmt.Sprintf("svc-%d", i) || svc.Spec.ClusterIP != fmt.Sprintf("10.96.0.%d", i+1) || svc.Annotations != nil {
			t.Errorf("item %d: %+v", i, svc)
		}
	}
}

func TestPagedListFailsWithTheExpiredContinuation(t *testing.T) {
	s := &pagedServices{n: 5, failAt: 2}
	_, err := s.lister().ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	// The reflector tells an expired list by the apiserver's error, and
	// lists again from the start.
	if !apierrors.IsResourceExpired(err) {
		t.Errorf("error %v, want the apiserver's Expired", err)
	}
}

func TestPagedListTransformMustMakeObjects(t *testing.T) {
	s := &pagedServices{n: 1}
	l := s.lister()
	l.transform = func(any) (any, error) { return "not an object", nil }
	if _, err := l.ListWithContext(context.Background(), metav1.ListOptions{}); err == nil {
		t.Error("a transform that made a string was taken")
	}
	l.transform = func(any) (any, error) { return nil, errors.New("boom") }
	if _, err := l.ListWithContext(context.Background(), metav1.ListOptions{}); err == nil {
		t.Error("a failed transform was taken")
	}
}

// TestPagedInformerSyncs runs the agent's Service informer on a fake
// clientset: the reflector lists with the paged lister (not a stream) and
// the cache holds the compact objects, then a watch event arrives.
func TestPagedInformerSyncs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other",
			Labels: map[string]string{"service.kubernetes.io/service-proxy-name": "x"}}})
	inf := serviceInformer(kubetest.New(client), newReacher(clock.RealClock{}, zap.NewNop()))
	if err := inf.SetTransform(model.Compact); err != nil {
		t.Fatal(err)
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	if _, err := client.CoreV1().Services("ns").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(inf.GetStore().ListKeys()) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("cache holds %v, want ns/a and ns/b", inf.GetStore().ListKeys())
		}
	}
	for _, o := range inf.GetStore().List() {
		if _, ok := o.(*model.Service); !ok {
			t.Errorf("cached a %T, want *model.Service", o)
		}
	}
	if _, ok, _ := inf.GetStore().GetByKey("ns/other"); ok {
		t.Error("another proxy's Service was cached")
	}
	// The reflector listed (with the selector), it did not stream.
	want, err := labels.Parse(ServiceSelector)
	if err != nil {
		t.Fatal(err)
	}
	var lists int
	for _, a := range client.Actions() {
		l, ok := a.(clienttesting.ListAction)
		if !ok || a.GetResource() != (schema.GroupVersionResource{Version: "v1", Resource: "services"}) {
			continue
		}
		lists++
		if sel := l.GetListRestrictions().Labels.String(); sel != want.String() {
			t.Errorf("listed with selector %q, want %q", sel, want)
		}
	}
	if lists == 0 {
		t.Error("the informer never listed Services")
	}
}
