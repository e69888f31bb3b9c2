package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// refusingConsumer is a consumer.ServiceReporter that fails one Service
// while told to, counting its syncs.
type refusingConsumer struct {
	fail  map[types.NamespacedName]string
	syncs int
}

func (c *refusingConsumer) Name() string                                     { return "test consumer" }
func (c *refusingConsumer) SetPlan(types.NamespacedName, *model.ServicePlan) {}
func (c *refusingConsumer) Sync(bool) error                                  { c.syncs++; return nil }
func (c *refusingConsumer) ServiceFailures() map[types.NamespacedName]string { return c.fail }
func (c *refusingConsumer) Retry() bool                                      { return len(c.fail) > 0 }

// TestServiceFailuresReported: a Service the model refuses (over a limit)
// and one a consumer refuses fail alone, as a failed IPVS write does: each
// is in the problems with why, gets a ServiceNotProgrammed Event, and the
// node is healthy (nothing failing, nothing pending); the consumer that
// asked is synced again after its backoff; when the failure ends, the
// Service gets a ServiceProgrammed Event and leaves the problems.
func TestServiceFailuresReported(t *testing.T) {
	ipvs := fake.NewIPVS()
	events := record.NewFakeRecorder(20)
	cfg := Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute,
		RetryBase: time.Second, Limits: model.Limits{VirtualServers: 1}}
	p := New(cfg, nil, ipvs, fake.NewLinks(node), events, nil, zap.NewNop())
	cons := &refusingConsumer{fail: map[types.NamespacedName]string{{Namespace: "default", Name: "web"}: "set IPVSP-X refused entry e"}}
	p.AddConsumer(cons)
	wide := testService("wide", "10.96.0.11", "rr")
	wide.Spec.Ports = append(wide.Spec.Ports, wide.Spec.Ports[0])
	wide.Spec.Ports[1].Name, wide.Spec.Ports[1].Port = "other", 81
	p.tracker.onService(wide, false)
	p.tracker.onService(testService("web", "10.96.0.10", "rr"), false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatalf("sync: %v (a Service's failure is not the node's)", err)
	}
	var got []string
	for _, s := range p.ServiceProblems() {
		got = append(got, s.Service.String()+": "+s.LastError)
	}
	want := []string{
		"default/web: test consumer: set IPVSP-X refused entry e",
		"default/wide: not programmed: the Service wants 2 virtual servers (ports × addresses), more than the limit of 1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if st := p.Status(); st.Failing != nil || !st.PendingSince.IsZero() {
		t.Errorf("status %+v: want nothing failing or pending", st)
	}
	if n := len(drainEvents(events, "ServiceNotProgrammed")); n != 2 {
		t.Errorf("%d ServiceNotProgrammed Events, want 2", n)
	}
	if p.consumers.retrying() || !p.consumers.due(p.clock.Now().Add(2*time.Second)) {
		t.Error("the consumer's refusals: want it due again after its backoff, without the node failing")
	}

	cons.fail = nil
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	if probs := p.ServiceProblems(); len(probs) != 1 || probs[0].Service.Name != "wide" {
		t.Errorf("problems after the consumer took web: %+v, want wide's alone", probs)
	}
	if n := len(drainEvents(events, "ServiceProgrammed")); n != 1 {
		t.Errorf("%d ServiceProgrammed Events, want 1 (web)", n)
	}
}

// drainEvents reads the recorded Events and returns those of a reason.
func drainEvents(r *record.FakeRecorder, reason string) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			if strings.Contains(e, " "+reason+" ") {
				out = append(out, e)
			}
		default:
			return out
		}
	}
}
