package reconciler

import (
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// drainBed is a Service with a TCP and a UDP port whose EndpointSlice a
// test changes, built by model.Build and applied by a Reconciler on fakes.
type drainBed struct {
	t    *testing.T
	ipvs *fake.IPVS
	r    *Reconciler
	clk  *clocktesting.FakeClock
	svc  *corev1.Service
	tcp  ktypes.VSKey
	udp  ktypes.VSKey
}

func newDrainBed(t *testing.T) *drainBed {
	r, ipvs, _, clk := newClockedReconciler(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)},
			}},
	}
	return &drainBed{t: t, ipvs: ipvs, r: r, clk: clk, svc: svc,
		tcp: ktypestest.VSKey("10.96.0.10:80", ktypes.TCP), udp: ktypestest.VSKey("10.96.0.10:53", ktypes.UDP)}
}

// setEndpoints builds the Service's plan from one slice with these
// endpoints and hands it to the reconciler.
func (b *drainBed) setEndpoints(eps ...discoveryv1.Endpoint) {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "a-1", Labels: map[string]string{discoveryv1.LabelServiceName: "a"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)},
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](5353)},
		},
	}
	p := model.Build(model.ServiceOf(b.svc), []*model.EndpointSlice{model.SliceOf(slice)}, model.NodeInfo{Name: "node-a"},
		model.BuildConfig{Scheduler: scheduler.Spec{Name: "rr"}})
	b.r.SetPlan(types.NamespacedName{Namespace: "default", Name: "a"}, &p)
}

func endpoint(addr string, ready, serving bool, terminating *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: terminating}}
}

func (b *drainBed) conns(vs ktypes.VSKey, rs string, active, inactive int) {
	b.t.Helper()
	port := uint16(8080)
	if vs.Protocol == ktypes.UDP {
		port = 5353
	}
	if err := b.ipvs.SetConns(vs, ktypes.RSKey{Address: netip.MustParseAddr(rs), Port: port}, active, inactive); err != nil {
		b.t.Fatal(err)
	}
}

func (b *drainBed) expectKernel(what string, want ...string) {
	b.t.Helper()
	callsDiffStrings(b.t, what, want, b.ipvs.Dump())
}

func callsDiffStrings(t *testing.T, what string, want, got []string) {
	t.Helper()
	calls := make([]fake.Call, len(got))
	for i, g := range got {
		calls[i] = fake.Call(g)
	}
	callsDiff(t, what, want, calls)
}

// TestReconcilerDrainsNotServingEndpoint: an endpoint that stops serving
// (terminating with serving=false, or failing readiness) keeps its TCP real
// server at weight 0 while the kernel counts connections on it: new
// connections go elsewhere, established ones go on. Its UDP real server
// goes at once, with its flows' conntrack entries (kube-proxy's rule: a
// client that keeps its source port is scheduled afresh). The TCP real
// server also stays while busy when the endpoint leaves the slice (as in
// kube-proxy's IPVS mode), and goes at the first check after its
// connections end. A not-serving endpoint that the kernel does not hold is
// never added, and a restarted agent keeps what it finds draining.
func TestReconcilerDrainsNotServingEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name        string
		terminating *bool
	}{
		{"terminating, not serving", ptr.To(true)},
		{"failing readiness", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newDrainBed(t)
			ct := &fake.Conntrack{}
			b.r.SetConntrack(ct)
			b.setEndpoints(endpoint("10.0.1.2", true, true, nil), endpoint("10.0.2.2", true, true, nil))
			mustSync(t, b.r, true)
			b.conns(b.tcp, "10.0.1.2", 1, 0)
			b.conns(b.udp, "10.0.1.2", 0, 1)
			b.ipvs.ResetCalls()

			// 10.0.1.2 stops serving; 10.0.3.2, never ready, joins.
			b.setEndpoints(endpoint("10.0.1.2", false, false, tc.terminating), endpoint("10.0.2.2", true, true, nil),
				endpoint("10.0.3.2", false, false, nil))
			mustSync(t, b.r, false)
			callsDiff(t, "writes when the endpoint stops serving (the UDP loss first: udpLosses)", []string{
				"DeleteRealServer 10.96.0.10:53/UDP 10.0.1.2:5353",
				"UpdateRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=0",
			}, b.ipvs.Writes())
			callsDiff(t, "conntrack clears", []string{"ClearUDP 10.96.0.10:53/UDP 10.0.1.2:5353"}, ct.Calls())
			b.expectKernel("kernel while draining",
				"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=0", "  -> 10.0.2.2:8080 w=1",
				"10.96.0.10:53/UDP rr", "  -> 10.0.2.2:5353 w=1")

			// A check is due soon, not before; the connection goes on.
			next := b.r.NextRetry()
			if next.IsZero() || next.Sub(b.clk.Now()) > 5*time.Second {
				t.Fatalf("the check of the draining real servers is at %v, want within 5s of %v", next, b.clk.Now())
			}
			if b.r.Pending() {
				t.Errorf("a sync is pending before the drain check is due")
			}
			b.clk.SetTime(next)
			if !b.r.Pending() {
				t.Fatalf("the drain check is due, yet no sync is pending")
			}
			b.ipvs.ResetCalls()
			mustSync(t, b.r, false)
			callsDiff(t, "writes of the drain check while busy", nil, b.ipvs.Writes())
			callsDiff(t, "reads of the drain check", []string{"ListRealServers 10.96.0.10:80/TCP"}, b.ipvs.Reads())

			// A restart finds the TCP real server still busy: it stays.
			r2 := NewReconciler(b.ipvs, fake.NewLinks(node), Config{Ownership: testOwnership()}, zap.NewNop())
			b.r = r2
			b.setEndpoints(endpoint("10.0.1.2", false, false, tc.terminating), endpoint("10.0.2.2", true, true, nil),
				endpoint("10.0.3.2", false, false, nil))
			b.ipvs.ResetCalls()
			mustSync(t, r2, true)
			callsDiff(t, "writes of a restart", nil, b.ipvs.Writes())
			if r2.NextRetry().IsZero() {
				t.Errorf("after a restart, no check of the draining real server is scheduled")
			}

			// The endpoint leaves the slice: busy, its TCP real server
			// stays at weight 0.
			b.setEndpoints(endpoint("10.0.2.2", true, true, nil), endpoint("10.0.3.2", false, false, nil))
			mustSync(t, r2, false)
			callsDiff(t, "writes when the busy endpoint leaves", nil, b.ipvs.Writes())
			if r2.NextRetry().IsZero() {
				t.Errorf("the endpoint left busy: no check of its real server is scheduled")
			}
			// Its connection ends: it goes at the next check.
			b.conns(b.tcp, "10.0.1.2", 0, 0)
			mustSync(t, r2, true)
			callsDiff(t, "writes once its connection ended", []string{"DeleteRealServer 10.96.0.10:80/TCP 10.0.1.2:8080"}, b.ipvs.Writes())
			b.expectKernel("kernel at the end",
				"10.96.0.10:80/TCP rr", "  -> 10.0.2.2:8080 w=1",
				"10.96.0.10:53/UDP rr", "  -> 10.0.2.2:5353 w=1")
			if !r2.NextRetry().IsZero() {
				t.Errorf("a check is still scheduled with nothing draining: %v", r2.NextRetry())
			}
		})
	}
}
