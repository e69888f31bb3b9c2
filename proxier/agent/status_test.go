package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"

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

// failingConsumer is a consumer whose Sync fails with err (nil: succeeds),
// with fullOnly only its full syncs (the glue's restore runs only then);
// it records its syncs.
type failingConsumer struct {
	name     string
	err      error
	fullOnly bool
	syncs    int
}

func (c *failingConsumer) Name() string                                     { return c.name }
func (c *failingConsumer) SetPlan(types.NamespacedName, *model.ServicePlan) {}
func (c *failingConsumer) Sync(full bool) error {
	c.syncs++
	if c.fullOnly && !full {
		return nil
	}
	return c.err
}

// TestStatusFailingParts: Status names the node-wide parts whose last
// sync failed (a consumer, a finisher), by their generic names only, so
// that /healthz can say what fails without the errors' details (Service
// names, addresses); so do the ipvs_proxy_node_sync_failing gauge and an
// Event on the Node when they change. A success clears them.
func TestStatusFailingParts(t *testing.T) {
	events := record.NewFakeRecorder(10)
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	p := New(Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"}, IPv4: true,
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute},
		nil, fake.NewIPVS(), fake.NewLinks(node), events, metrics, zap.NewNop())
	glue := &failingConsumer{name: "iptables glue"}
	p.AddConsumer(glue)
	var finisherErr error
	p.AddFinisher("take over from kube-proxy", func(context.Context) error { return finisherErr })
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)

	const details = "; retried with backoff; details in ipvs-proxy's log on the node and in `ipvs-proxy status`"
	steps := []struct {
		name                string
		glueErr, finisherEr error
		want                []string
		wantErrHas          string // in LastError ("": none)
		wantEvents          []string
	}{
		{"the glue fails", errors.New("ipset add IPVSP-SERVICE 10.96.0.10,tcp:80: set is full"), nil,
			[]string{"iptables glue"}, "set is full", []string{"Warning NodeSyncFailed failing: iptables glue" + details}},
		{"it fails again: no new Event", errors.New("ipset add IPVSP-SERVICE 10.96.0.10,tcp:80: set is full"), nil,
			[]string{"iptables glue"}, "set is full", nil},
		{"the glue works, the finisher fails", nil, errors.New("chain KUBE-SERVICES in use"),
			[]string{"take over from kube-proxy"}, "KUBE-SERVICES", []string{"Warning NodeSyncFailed failing: take over from kube-proxy" + details}},
		{"all works", nil, nil, nil, "", []string{"Normal NodeSyncRecovered every node-wide part of the sync succeeds again"}},
	}
	for _, s := range steps {
		glue.err, finisherErr = s.glueErr, s.finisherEr
		if err := p.SyncOnce(true); (err == nil) != (s.wantErrHas == "") {
			t.Fatalf("%s: sync = %v", s.name, err)
		}
		st := p.Status()
		if diff := cmp.Diff(s.want, st.Failing); diff != "" {
			t.Errorf("%s: failing parts (-want +got):\n%s", s.name, diff)
		}
		if s.wantErrHas == "" && st.LastError != nil || s.wantErrHas != "" && (st.LastError == nil || !strings.Contains(st.LastError.Error(), s.wantErrHas)) {
			t.Errorf("%s: last error %v, want one with %q", s.name, st.LastError, s.wantErrHas)
		}
		if diff := cmp.Diff(s.want, failingSeries(t, reg)); diff != "" {
			t.Errorf("%s: ipvs_proxy_node_sync_failing (-want +got):\n%s", s.name, diff)
		}
		var got []string
		for len(events.Events) > 0 {
			got = append(got, <-events.Events)
		}
		if diff := cmp.Diff(s.wantEvents, got); diff != "" {
			t.Errorf("%s: Events (-want +got):\n%s", s.name, diff)
		}
	}
}

// failingSeries are the parts of ipvs_proxy_node_sync_failing's series
// at 1.
func failingSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, mf := range mfs {
		if mf.GetName() != "ipvs_proxy_node_sync_failing" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetGauge().GetValue() == 1 {
				parts = append(parts, m.GetLabel()[0].GetValue())
			}
		}
	}
	return parts
}

// TestStatusLoopHeartbeat: the sync loop beats as it starts and finishes
// each iteration, on the proxier's clock; zero before it runs.
func TestStatusLoopHeartbeat(t *testing.T) {
	b := newLoopBed(t, clusterIPService("a", "10.96.0.10"))
	if beat := b.p.Status().LoopHeartbeat; !beat.IsZero() {
		t.Fatalf("heartbeat %v before Run", beat)
	}
	b.run()
	b.eventually("the first sync", func() bool { return !b.p.Status().LastSuccessfulSync.IsZero() })
	b.idle()
	if beat := b.p.Status().LoopHeartbeat; !beat.Equal(b.clk.Now()) {
		t.Errorf("heartbeat %v after the first sync, want the clock's %v", beat, b.clk.Now())
	}
	b.clk.Step(time.Hour) // the periodic sync
	b.eventually("a beat at the periodic sync", func() bool { return b.p.Status().LoopHeartbeat.Equal(b.clk.Now()) })
}

// TestFailedParts: the parts named in a sync's node-wide error, each once,
// whatever the errors nest.
func TestFailedParts(t *testing.T) {
	glue := nodeFailure{part: "iptables glue", err: errors.New("iptables glue: exit status 1")}
	read := nodeFailure{part: "kernel read", err: errors.Join(errors.New("dump 1"), errors.New("dump 2"))}
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"none", nil, nil},
		{"one", glue, []string{"iptables glue"}},
		{"joined, sorted, once", errors.Join(glue, errors.Join(read, glue)), []string{"iptables glue", "kernel read"}},
		{"a part wrapping joined errors", read, []string{"kernel read"}},
		{"no part", errors.New("something else"), []string{"sync"}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, failedParts(tc.err)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestStatusPendingWhileConsumerRetries: a node-wide part that keeps
// failing (the iptables glue with a broken iptables-restore, which runs in
// its full syncs only) stays failing, and keeps the pending clock that
// /healthz reads running from its first failure, through the syncs between
// its retries: with nothing to do (a wake-up by an address notification),
// or partial ones in which its own partial sync succeeds (a Service
// changed); it stops once a retry succeeds.
func TestStatusPendingWhileConsumerRetries(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 13, 0, 0, 0, time.UTC))
	p := New(Config{NodeName: "n1", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"}, IPv4: true, Clock: clk,
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute, RetryBase: time.Second},
		nil, fake.NewIPVS(), fake.NewLinks(node), nil, nil, zap.NewNop())
	glue := &failingConsumer{name: "iptables glue", err: errors.New("injected: iptables-restore failed"), fullOnly: true}
	p.AddConsumer(glue)
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	if err := p.SyncOnce(true); err == nil {
		t.Fatal("sync succeeded with the glue failing")
	}
	first := p.Status().PendingSince
	if first.IsZero() {
		t.Fatal("nothing pending after the glue failed")
	}
	for i := range 5 {
		clk.Step(100 * time.Millisecond) // not yet due: the glue's backoff is 1 s
		if i%2 == 1 {                    // a change: a partial sync, in which the glue succeeds
			p.tracker.onService(clusterIPService(fmt.Sprint("b", i), fmt.Sprint("10.96.0.", 20+i)), false)
		}
		if err := p.SyncOnce(false); err == nil && i%2 == 1 {
			t.Fatalf("partial sync %d between the glue's retries succeeded; want the glue still failing", i)
		}
		if st := p.Status(); !st.PendingSince.Equal(first) || len(st.Failing) == 0 {
			t.Fatalf("after idle sync %d between the glue's retries: pending since %v, failing %v; want since %v, the glue failing",
				i, st.PendingSince, st.Failing, first)
		}
	}
	clk.Step(time.Second) // the retry is due, and fails again
	if err := p.SyncOnce(false); err == nil {
		t.Fatal("the glue's retry succeeded")
	}
	if st := p.Status(); !st.PendingSince.Equal(first) {
		t.Fatalf("after a failed retry: pending since %v, want %v (the first failure)", st.PendingSince, first)
	}
	glue.err = nil
	clk.Step(5 * time.Second)
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); !st.PendingSince.IsZero() || st.Failing != nil {
		t.Fatalf("after the glue's retry succeeded: %+v, want nothing pending or failing", st)
	}
}
