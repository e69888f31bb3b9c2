package agent

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// settlePlan is a plan with one tunnelled virtual server and two real
// servers: one through the tunnel (forward), one on this node by NAT.
func settlePlan(forward ktypes.Forward, tunPort uint16) *model.ServicePlan {
	vs := model.VSPlan{Kind: model.KindExternalIP}
	vs.VSKey = ktypes.VSKey{Address: netip.MustParseAddr("192.0.2.10"), Protocol: ktypes.TCP, Port: 80}
	vs.Forward, vs.TunPort = forward, tunPort
	vs.InClusterTo = netip.MustParseAddrPort("10.96.0.20:80")
	vs.RealServers = []ktypes.RealServer{
		{RSKey: ktypes.RSKey{Address: netip.MustParseAddr("10.0.1.2"), Port: 8080}, Weight: 1, Forward: forward, TunPort: tunPort},
		{RSKey: ktypes.RSKey{Address: netip.MustParseAddr("10.0.2.2"), Port: 8080}, Weight: 1},
	}
	return &model.ServicePlan{Service: types.NamespacedName{Namespace: "default", Name: "web"}, VirtualServers: []model.VSPlan{vs}}
}

// forwards renders the methods of a plan: its virtual servers' (with the
// in-cluster redirect) and their real servers'.
func forwards(p *model.ServicePlan) []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, vs := range p.VirtualServers {
		out = append(out, vs.Address.String()+" "+vs.Forward.String()+" to "+vs.InClusterTo.String())
		for _, rs := range vs.RealServers {
			out = append(out, rs.Address.String()+" "+rs.Forward.String())
		}
	}
	return out
}

// TestTunnelSettle: a tunnel the plan asks for after the first build is
// NAT for the settle time (the plan as built untouched), then a tunnel;
// a change of method settles again; tunnels of the first build are
// settled at once; a Service gone forgets its tunnels.
func TestTunnelSettle(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 16, 0, 0, 0, time.UTC)
	n := types.NamespacedName{Namespace: "default", Name: "web"}
	s := newTunnelSettle(5 * time.Second)
	if got := forwards(s.apply(n, settlePlan(ktypes.ForwardTunnel, 0), t0)); !cmp.Equal(got, []string{"192.0.2.10 tunnel to 10.96.0.20:80", "10.0.1.2 tunnel", "10.0.2.2 nat"}) {
		t.Fatalf("first build: %v; want the tunnel at once (settled before the agent started)", got)
	}
	s.start()
	if !s.next().IsZero() {
		t.Fatalf("next %v; want none", s.next())
	}

	built := settlePlan(ktypes.ForwardGUE, 6080)
	got := s.apply(n, built, t0.Add(time.Second))
	if want := []string{"192.0.2.10 nat to invalid AddrPort", "10.0.1.2 nat", "10.0.2.2 nat"}; !cmp.Equal(forwards(got), want) {
		t.Errorf("gue asked at t0+1s: %v; want %v while it settles", forwards(got), want)
	}
	if want := []string{"192.0.2.10 gue to 10.96.0.20:80", "10.0.1.2 gue", "10.0.2.2 nat"}; !cmp.Equal(forwards(built), want) {
		t.Errorf("the plan as built became %v; want %v (the tunnel ends read it)", forwards(built), want)
	}
	if want := t0.Add(6 * time.Second); !s.next().Equal(want) {
		t.Errorf("next %v; want %v", s.next(), want)
	}
	if due := s.settled(t0.Add(5 * time.Second)); len(due) != 0 {
		t.Errorf("settled at t0+5s: %v; want none yet", due)
	}
	if due := s.settled(t0.Add(6 * time.Second)); !cmp.Equal(due, []types.NamespacedName{n}) {
		t.Errorf("settled at t0+6s: %v; want %v", due, n)
	}
	if got := forwards(s.apply(n, settlePlan(ktypes.ForwardGUE, 6080), t0.Add(6*time.Second))); got[1] != "10.0.1.2 gue" {
		t.Errorf("gue at t0+6s: %v; want the tunnel now", got)
	}
	if !s.next().IsZero() {
		t.Errorf("next %v after it settled; want none", s.next())
	}

	if got := forwards(s.apply(n, nil, t0.Add(7*time.Second))); got != nil {
		t.Errorf("Service gone: %v", got)
	}
	if got := forwards(s.apply(n, settlePlan(ktypes.ForwardGUE, 6080), t0.Add(8*time.Second))); got[1] != "10.0.1.2 nat" {
		t.Errorf("the Service again at t0+8s: %v; want nat while it settles anew", got)
	}
}

// TestTunnelSettleInTheLoop: a Service created with
// ipvs-proxy.io/forwarding: tunnel after the agent started has its real
// server on another node written as NAT first, and updated in place to the
// tunnel once the settle time has passed on the clock, with no other event.
func TestTunnelSettleInTheLoop(t *testing.T) {
	b := newLoopBedWith(t, func(c *Config) { c.DSR = model.DSRConfig{GUEPort: 6080} })
	glue, ends := &planRecorder{}, &asBuiltRecorder{}
	b.p.AddConsumer(glue)
	b.p.AddConsumer(ends)
	b.run()
	b.idle()
	svc := testService("web", "10.96.0.20", "rr")
	svc.Annotations[model.AnnotationForwarding] = "tunnel"
	svc.Spec.ExternalIPs = []string{"192.0.2.10"}
	ctx := context.Background()
	sl := testSlice("web", "10.0.1.20")
	sl.Endpoints[0].NodeName = new("node-b")
	if _, err := b.client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const rs = "192.0.2.10:80/TCP 10.0.1.20:8080 w=1"
	b.eventually("the change reaching the loop", func() bool {
		b.p.tracker.mu.Lock()
		defer b.p.tracker.mu.Unlock()
		n := types.NamespacedName{Namespace: "default", Name: "web"}
		_, dirty := b.p.tracker.dirty[n]
		return dirty && b.p.tracker.services[n] != nil && len(b.p.tracker.slices[n]) > 0
	})
	b.clk.Step(time.Second) // past the minimum sync period
	b.eventually("the external real server, by NAT", func() bool { return len(b.calls("AddRealServer "+rs)) > 0 })
	b.idle()
	if got := b.calls("AddRealServer " + rs); len(got) != 1 || strings.Contains(got[0], "tunnel") {
		t.Fatalf("added %q; want it once, by NAT", got)
	}
	if g, e := glue.last(), ends.last(); g != "192.0.2.10 nat to invalid AddrPort" || e != "192.0.2.10 tunnel to 10.96.0.20:80" {
		t.Errorf("while it settles, the glue was given %q and the tunnel ends %q; want nat and the plan as built", g, e)
	}
	b.clk.Step(DefaultTunnelSettle)
	b.eventually("the tunnel", func() bool { return len(b.calls("UpdateRealServer "+rs+" tunnel")) == 1 })
	b.idle()
	if g := glue.last(); g != "192.0.2.10 tunnel to 10.96.0.20:80" {
		t.Errorf("once settled, the glue was given %q; want the tunnel", g)
	}
}

// planRecorder is a consumer that records the external virtual server of
// the plans it is given (as forwards renders it).
type planRecorder struct {
	mu    sync.Mutex
	plans []string
}

func (*planRecorder) Name() string    { return "recorder" }
func (*planRecorder) Sync(bool) error { return nil }
func (r *planRecorder) SetPlan(_ types.NamespacedName, p *model.ServicePlan) {
	for _, f := range forwards(p) {
		if strings.HasPrefix(f, "192.0.2.10 ") {
			r.mu.Lock()
			r.plans = append(r.plans, f)
			r.mu.Unlock()
		}
	}
}

func (r *planRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.plans) == 0 {
		return ""
	}
	return r.plans[len(r.plans)-1]
}

// asBuiltRecorder is a planRecorder that asks for plans as built.
type asBuiltRecorder struct{ planRecorder }

func (*asBuiltRecorder) AsBuilt() {}
