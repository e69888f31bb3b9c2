package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
)

// TestRelistMarksNothingDirty: a Service informer whose watch expires
// lists again (as after an apiserver outage) and delivers an update of
// every Service it holds, at the same version: the tracker marks none of
// them dirty, so the first sync after an outage rebuilds only what
// changed; a real change (a new version) after it still is.
func TestRelistMarksNothingDirty(t *testing.T) {
	tr := newTracker(Config{Clock: clock.RealClock{}}, nil, func() {}, NewMetrics(nil), zap.NewNop())
	svc := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "5"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	var lists atomic.Int32
	watches := make(chan *watch.FakeWatcher, 4)
	list := func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		lists.Add(1)
		return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []corev1.Service{svc}}, nil
	}
	watchFn := func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		w := watch.NewFake()
		watches <- w
		return w, nil
	}
	var infs informerSet
	inf := pagedInformer(list, watchFn, &corev1.Service{}, newReacher(clock.RealClock{}, zap.NewNop()))
	if _, err := infs.add(inf, handler(tr.onService)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	infs.start(ctx)
	defer func() { cancel(); infs.wait() }()
	dirty := func(name string) bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		_, ok := tr.dirty[types.NamespacedName{Namespace: "ns", Name: name}]
		return ok
	}
	first := nextWatch(t, watches)
	if !eventuallyTrue(func() bool { return dirty("a") }) {
		t.Fatal("the initial list did not mark ns/a dirty")
	}
	tr.mu.Lock()
	clear(tr.dirty)
	tr.mu.Unlock()

	first.Error(&apierrors.NewResourceExpired("too old resource version").ErrStatus)
	second := nextWatch(t, watches)
	if lists.Load() != 2 {
		t.Fatalf("%d lists, want the informer to list again after its watch expired", lists.Load())
	}
	// Another Service added after the relist: once it is dirty, the
	// handler has seen the relist's updates (one handler, in order).
	b := svc.DeepCopy()
	b.Name, b.ResourceVersion = "b", "6"
	second.Add(b)
	if !eventuallyTrue(func() bool { return dirty("b") }) {
		t.Fatal("ns/b, added after the relist, was not marked dirty")
	}
	if dirty("a") {
		t.Error("the relist of an unchanged Service marked it dirty")
	}
	changed := svc.DeepCopy()
	changed.ResourceVersion, changed.Spec.Ports[0].Port = "7", 8080
	second.Modify(changed)
	if !eventuallyTrue(func() bool { return dirty("a") }) {
		t.Error("a change after the relist did not mark ns/a dirty")
	}
}

// eventuallyTrue polls cond for up to 5 s.
func eventuallyTrue(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func nextWatch(t *testing.T, watches <-chan *watch.FakeWatcher) *watch.FakeWatcher {
	t.Helper()
	select {
	case w := <-watches:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("no watch within 10 s")
		return nil
	}
}
