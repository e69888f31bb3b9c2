package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

func newTestProxier(t *testing.T) (*Proxier, *fake.IPVS) {
	t.Helper()
	ipvs := fake.NewIPVS()
	cfg := Config{NodeName: "n1", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"}, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		IPv4: true, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute}
	return New(cfg, nil, ipvs, fake.NewLinks(node), nil, nil, zap.NewNop()), ipvs
}

func clusterIPService(name, ip string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
}

// TestStatusPendingSince: a received change is pending until a sync
// applies it; a failing sync keeps it pending, with the first time it was
// received; success clears it.
func TestStatusPendingSince(t *testing.T) {
	p, ipvs := newTestProxier(t)
	if st := p.Status(); !st.LastSuccessfulSync.IsZero() || !st.PendingSince.IsZero() {
		t.Fatalf("fresh proxier: %+v", st)
	}
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.LastSuccessfulSync.IsZero() || !st.PendingSince.IsZero() || st.Pending != 0 {
		t.Fatalf("after the first sync: %+v", st)
	}

	before := time.Now()
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	st := p.Status()
	if st.Pending != 1 || st.PendingSince.Before(before) {
		t.Fatalf("after a change: %+v, want one pending since %v", st, before)
	}
	queued := st.PendingSince

	// A failed kernel read is the node's failure: the change stays pending.
	errRead := errors.New("injected: no buffer space")
	ipvs.InjectErrors(func(c fake.Call) error {
		if c == "ListVirtualServers" {
			return errRead
		}
		return nil
	})
	if err := p.SyncOnce(true); !errors.Is(err, errRead) {
		t.Fatalf("SyncOnce = %v, want the injected error", err)
	}
	// A second change while failing does not make the pending time younger.
	p.tracker.onService(clusterIPService("b", "10.96.0.11"), false)
	if err := p.SyncOnce(true); !errors.Is(err, errRead) {
		t.Fatalf("SyncOnce = %v, want the injected error", err)
	}
	st = p.Status()
	if !st.PendingSince.Equal(queued) || !errors.Is(st.LastError, errRead) {
		t.Fatalf("while failing: %+v, want pending since %v and the error", st, queued)
	}

	ipvs.InjectErrors(nil)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	st = p.Status()
	if !st.PendingSince.IsZero() || st.LastError != nil || !st.LastSuccessfulSync.After(queued) {
		t.Fatalf("after recovery: %+v", st)
	}

	// A Service whose own write fails is that Service's failure: it is
	// retried alone and shows in its status; the node stays healthy.
	errBusy := errors.New("injected: busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddVirtualServer 10.96.0.12") {
			return errBusy
		}
		return nil
	})
	p.tracker.onService(clusterIPService("c", "10.96.0.12"), false)
	if err := p.SyncOnce(false); !errors.Is(err, errBusy) {
		t.Fatalf("SyncOnce = %v, want the injected error", err)
	}
	st = p.Status()
	if !st.PendingSince.IsZero() || !errors.Is(st.LastError, errBusy) {
		t.Fatalf("with one Service failing: %+v, want nothing pending and the error", st)
	}
	if sc, _ := p.rec.Status(types.NamespacedName{Namespace: "default", Name: "c"}); sc.Failures != 1 || !strings.Contains(sc.LastError, "injected: busy") {
		t.Errorf("status of the failing Service: %+v", sc)
	}
}

// TestStatusFailureWithoutChanges: a full resync that fails with nothing
// queued (the kernel refuses a repair) also starts the pending clock.
func TestStatusFailureWithoutChanges(t *testing.T) {
	p, ipvs := newTestProxier(t)
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	ipvs.InjectErrors(func(fake.Call) error { return errors.New("injected") })
	if err := p.SyncOnce(true); err == nil {
		t.Fatal("SyncOnce succeeded with every call failing")
	}
	if st := p.Status(); st.PendingSince.IsZero() || st.LastError == nil {
		t.Fatalf("after a failed resync: %+v", st)
	}
}

// TestStatusNodeEligible follows kube-proxy: the Node must exist, not be
// deleting, and not carry the autoscaler's to-be-deleted taint.
func TestStatusNodeEligible(t *testing.T) {
	p, _ := newTestProxier(t)
	if p.Status().NodeEligible {
		t.Fatal("eligible before the Node was seen")
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	p.tracker.onNode(n, false)
	if !p.Status().NodeEligible {
		t.Fatal("not eligible with a plain Node")
	}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	p.tracker.onNode(other, true)
	if !p.Status().NodeEligible {
		t.Fatal("another node's deletion changed eligibility")
	}
	tainted := n.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}
	p.tracker.onNode(tainted, false)
	if p.Status().NodeEligible {
		t.Fatal("eligible with the to-be-deleted taint")
	}
	p.tracker.onNode(n, false)
	deleting := n.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	p.tracker.onNode(deleting, false)
	if p.Status().NodeEligible {
		t.Fatal("eligible while being deleted")
	}
	p.tracker.onNode(n, false)
	p.tracker.onNode(n, true)
	if p.Status().NodeEligible {
		t.Fatal("eligible after the Node was deleted")
	}
}

// TestLatencyOfChangeThatFailedFirst: a change whose first sync fails is
// measured when a retry lands it, from the time the change was made.
// (Before the redesign, such a change yielded no sample at all.)
func TestLatencyOfChangeThatFailedFirst(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	ipvs := fake.NewIPVS()
	reg := prometheus.NewRegistry()
	cfg := Config{NodeName: "n1", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"}, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		IPv4: true, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute, Clock: clk}
	p := New(cfg, nil, ipvs, fake.NewLinks(node), nil, NewMetrics(reg), zap.NewNop())
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	samples := func() (n uint64, sum float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kubeproxy_network_programming_duration_seconds" {
				h := mf.GetMetric()[0].GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
		return 0, 0
	}
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddVirtualServer") {
			return errors.New("injected: busy")
		}
		return nil
	})
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	clk.Step(time.Second)
	if err := p.SyncOnce(false); err == nil {
		t.Fatal("the sync succeeded with the write failing")
	}
	if n, _ := samples(); n != 0 {
		t.Fatalf("%d latency samples while the change is not in the kernel", n)
	}
	ipvs.InjectErrors(nil)
	clk.Step(time.Second) // the retry is due
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	if n, sum := samples(); n != 1 || sum != 2 {
		t.Errorf("latency: %d samples, sum %vs; want one of 2s (change to retry)", n, sum)
	}
}

// TestFinisherAfterFullSuccess: a finisher runs only after a sync in which
// everything succeeded, once; a failed finisher runs again after the next
// successful sync.
func TestFinisherAfterFullSuccess(t *testing.T) {
	p, ipvs := newTestProxier(t)
	runs, fail := 0, true
	p.AddFinisher("test", func(context.Context) error {
		runs++
		if fail {
			return errors.New("injected: not yet")
		}
		return nil
	})
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddVirtualServer") {
			return errors.New("injected: busy")
		}
		return nil
	})
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	if err := p.SyncOnce(true); err == nil {
		t.Fatal("sync succeeded with a failing write")
	}
	if runs != 0 {
		t.Fatalf("the finisher ran after a failed sync")
	}
	ipvs.InjectErrors(nil)
	if err := p.SyncOnce(true); err == nil || !strings.Contains(err.Error(), "not yet") {
		t.Fatalf("sync = %v, want the finisher's failure", err)
	}
	fail = false
	for range 2 {
		if err := p.SyncOnce(true); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 2 {
		t.Errorf("the finisher ran %d times, want 2 (one failure, one success, then never)", runs)
	}
}
