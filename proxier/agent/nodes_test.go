package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// refRecorder records Events as "Kind/name Reason: message".
type refRecorder struct {
	mu     sync.Mutex
	events []string
}

func (r *refRecorder) Event(obj runtime.Object, _, reason, message string) {
	ref, _ := obj.(*corev1.ObjectReference)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref == nil {
		ref = &corev1.ObjectReference{Kind: fmt.Sprintf("%T", obj)}
	}
	r.events = append(r.events, fmt.Sprintf("%s/%s %s: %s", ref.Kind, ref.Name, reason, message))
}

func (r *refRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *refRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Eventf(obj, eventtype, reason, format, args...)
}

// take returns the Events recorded since the last call.
func (r *refRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// mustParseAll parses each of ss.
func mustParseAll[T any](t *testing.T, parse func(string) (T, error), ss []string) []T {
	t.Helper()
	out := make([]T, len(ss))
	for i, s := range ss {
		var err error
		if out[i], err = parse(s); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func testNode(name string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	return n
}

func nodesProxier(links *fake.Links, ipvs *fake.IPVS, events *refRecorder, ranges ...netip.Prefix) *Proxier {
	return New(Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Hour,
		RouteServiceRanges: len(ranges) > 0, ServiceRanges: ranges},
		nil, ipvs, links, events, nil, zap.NewNop())
}

// TestOtherNodesAddressNotProgrammed: an externalIP that is another Node's
// address is neither a virtual server nor bound on this node, with an
// Event naming that Node; the Node's arrival and departure rebuild the
// Service at the next partial sync. Before, the agent watched only its own
// Node: the address was bound here, and this node took every packet to
// node-b (its kubelet, its sshd).
func TestOtherNodesAddressNotProgrammed(t *testing.T) {
	ipvs, links, events := fake.NewIPVS(), fake.NewLinks(node), &refRecorder{}
	p := nodesProxier(links, ipvs, events)
	svc := testService("web", "10.96.0.10", "rr")
	svc.Spec.ExternalIPs = []string{"192.168.0.11", "198.51.100.5"}
	p.tracker.onNode(testNode("node-a", node.String()), false)
	p.tracker.onService(svc, false)
	p.tracker.onSlice(testSlice("web", "10.0.1.2"), false)
	p.tracker.onService(testService("db", "10.96.0.11", "rr"), false)
	sync := func(full bool) {
		t.Helper()
		if err := p.SyncOnce(full); err != nil {
			t.Fatal(err)
		}
	}
	sync(true)

	programmed := func(step string, want bool) {
		t.Helper()
		vip := netip.MustParseAddr("192.168.0.11")
		has := slices.Contains(ipvs.Dump(), "192.168.0.11:80/TCP rr")
		bound := slices.Contains(links.Addresses(testIface), vip)
		if has != want || bound != want {
			t.Errorf("%s: 192.168.0.11 has a virtual server: %v, bound: %v; want %v\n%s", step, has, bound, want, strings.Join(ipvs.Dump(), "\n"))
		}
		if !slices.Contains(ipvs.Dump(), "198.51.100.5:80/TCP rr") {
			t.Errorf("%s: the Service's other externalIP has no virtual server", step)
		}
	}
	programmed("no Node has the address", true)
	events.take()

	p.tracker.onNode(testNode("node-b", "192.168.0.11"), false)
	sync(false)
	programmed("Node node-b has it", false)
	want := []string{`Service/web IPVSProxyConfig: externalIP "192.168.0.11" is an address of Node node-b; served by that Node only, not programmed on this one`}
	if diff := cmp.Diff(want, events.take()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}

	p.tracker.onNode(testNode("node-b", "192.168.0.11"), true)
	sync(false)
	programmed("node-b deleted", true)
}

// TestServiceRangeHoldingANodeAddressNotRouted: a Service range that holds
// one of the node's own addresses, or another Node's (the node network),
// is not routed as local: the node would take all traffic to that address
// and cut itself off. It gets a log line and an Event, on the ServiceCIDR
// that asked for it or, when configured, on this Node; the other ranges
// are routed, and the clusterIPs of the refused one are bound one by one.
// Before, every range was routed.
func TestServiceRangeHoldingANodeAddressNotRouted(t *testing.T) {
	prefixes := func(ss ...string) []netip.Prefix { return mustParseAll(t, netip.ParsePrefix, ss) }
	addrs := func(ss ...string) []netip.Addr { return mustParseAll(t, netip.ParseAddr, ss) }
	for _, tc := range []struct {
		name       string
		configured []netip.Prefix // --service-cidrs
		watched    []netip.Prefix // from the ServiceCIDR "kubernetes"
		otherNode  string         // another Node's address
		wantRoutes []string
		wantBound  []netip.Addr
		wantEvents []string
	}{{
		name:       "configured range holds the node's own address",
		configured: prefixes("10.96.0.0/16", "192.168.0.0/16"),
		wantRoutes: []string{"10.96.0.0/16"},
		wantBound:  addrs("10.96.0.0", "192.168.5.1"), // the range's anchor, the refused range's clusterIP
		wantEvents: []string{"Node/node-a ServiceRangeNotRouted: Service range 192.168.0.0/16 holds the node address 192.168.0.10: not routed as local on node node-a (it would take that address's traffic); its clusterIPs are bound one by one"},
	}, {
		name:       "ServiceCIDR holds another Node's address",
		watched:    prefixes("10.96.0.0/16", "192.168.5.0/24"),
		otherNode:  "192.168.5.200",
		wantRoutes: []string{"10.96.0.0/16"},
		wantBound:  addrs("10.96.0.0", "192.168.5.1"), // the range's anchor, the refused range's clusterIP
		wantEvents: []string{"ServiceCIDR/kubernetes ServiceRangeNotRouted: Service range 192.168.5.0/24 holds the node address 192.168.5.200: not routed as local on node node-a (it would take that address's traffic); its clusterIPs are bound one by one"},
	}, {
		name:       "no Node in the range",
		watched:    prefixes("10.96.0.0/16", "192.168.5.0/24"),
		otherNode:  "192.168.6.200",
		wantRoutes: []string{"10.96.0.0/16", "192.168.5.0/24"},
		wantBound:  addrs("10.96.0.0", "192.168.5.0"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ipvs, links, events := fake.NewIPVS(), fake.NewLinks(node), &refRecorder{}
			p := nodesProxier(links, ipvs, events, tc.configured...)
			if tc.watched != nil {
				p.cfg.RouteServiceRanges = true
				sources := map[netip.Prefix]*corev1.ObjectReference{}
				for _, r := range tc.watched {
					sources[r] = &corev1.ObjectReference{Kind: "ServiceCIDR", Name: "kubernetes"}
				}
				p.tracker.setRanges(tc.watched, sources)
			}
			p.tracker.onNode(testNode("node-a", node.String()), false)
			if tc.otherNode != "" {
				p.tracker.onNode(testNode("node-b", tc.otherNode), false)
			}
			p.tracker.onService(testService("web", "10.96.0.10", "rr"), false)
			p.tracker.onService(testService("db", "192.168.5.1", "rr"), false)
			if err := p.SyncOnce(true); err != nil {
				t.Fatal(err)
			}
			var routes []string
			for _, r := range links.Routes(testIface) {
				routes = append(routes, r.String())
			}
			if diff := cmp.Diff(tc.wantRoutes, routes); diff != "" {
				t.Errorf("routes (-want +got):\n%s", diff)
			}
			bound := links.Addresses(testIface)
			if diff := cmp.Diff(tc.wantBound, bound, cmpopts.EquateComparable(netip.Addr{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("bound (-want +got):\n%s", diff)
			}
			if want := []string{"10.96.0.10:80/TCP rr", "192.168.5.1:80/TCP rr"}; !cmp.Equal(want, ipvs.Dump()) {
				t.Errorf("virtual servers %q; want %q", ipvs.Dump(), want)
			}
			if diff := cmp.Diff(tc.wantEvents, events.take()); diff != "" {
				t.Errorf("Events (-want +got):\n%s", diff)
			}
			// Reported once, not at every sync.
			if err := p.SyncOnce(true); err != nil {
				t.Fatal(err)
			}
			if got := events.take(); len(got) > 0 {
				t.Errorf("Events at the next sync: %q; want none", got)
			}
		})
	}
}

// TestOffLoopAddressesNeverOlderThanTheLoops: a resync's read off the loop
// took the node's addresses as it began, before an address was added and
// read in the loop; its adoption does not take the new address away (a
// renumbering's node ports vanished so on the bed): the next sync reads
// the addresses again in the loop. A read that agrees asks for nothing;
// one that differs because the kernel did change (a notification lost)
// is taken by that read again.
func TestOffLoopAddressesNeverOlderThanTheLoops(t *testing.T) {
	a, b, c := netip.MustParseAddr("192.168.56.11"), netip.MustParseAddr("192.168.56.241"), netip.MustParseAddr("192.168.56.7")
	kernel := []netip.Addr{a}
	tr := newTracker(Config{Clock: clock.RealClock{}}, func() ([]netip.Addr, error) { return slices.Clone(kernel), nil },
		func() {}, NewMetrics(nil), zap.NewNop())
	snap := func() []netip.Addr {
		t.Helper()
		in, err := tr.snapshot(false, 0)
		if err != nil {
			t.Fatal(err)
		}
		return in.node.NodePortAddresses
	}
	tr.nodeAddressesChanged()
	snap()
	kernel = []netip.Addr{a, b} // the renumbering's new address, read in the loop
	tr.nodeAddressesChanged()
	if got := snap(); !slices.Equal(got, []netip.Addr{a, b}) {
		t.Fatalf("node-port addresses %v after the loop's read, want %v", got, []netip.Addr{a, b})
	}
	if !tr.offLoopAddresses([]netip.Addr{a}) { // the stale read is adopted
		t.Error("a stale read off the loop asked for no sync")
	}
	if got := snap(); !slices.Equal(got, []netip.Addr{a, b}) {
		t.Errorf("node-port addresses %v after a stale read off the loop, want %v kept", got, []netip.Addr{a, b})
	}
	if tr.offLoopAddresses([]netip.Addr{a, b}) {
		t.Error("a read off the loop that agrees asked for a sync")
	}
	kernel = []netip.Addr{a, b, c} // added, its notification lost
	if !tr.offLoopAddresses(slices.Clone(kernel)) {
		t.Error("a read off the loop with a new address asked for no sync")
	}
	if got := snap(); !slices.Equal(got, []netip.Addr{c, a, b}) { // sorted
		t.Errorf("node-port addresses %v, want the kernel's %v", got, kernel)
	}
}

// TestAddressChangeRebuildsOnlyAddressedServices: a change of the node's
// addresses rebuilds, at once and whatever the batch bound, the Services
// whose plans hold them (node ports, externalIPs, LoadBalancer IPs) and
// the ones that changed, not every clusterIP: at 2,000 Services the
// rebuild of all of them was 11 s of a 17 s sync on a starved node (issue
// 45, case 4).
func TestAddressChangeRebuildsOnlyAddressedServices(t *testing.T) {
	kernel := []netip.Addr{netip.MustParseAddr("192.168.56.11")}
	tr := newTracker(Config{Clock: clock.RealClock{}}, func() ([]netip.Addr, error) { return slices.Clone(kernel), nil },
		func() {}, NewMetrics(nil), zap.NewNop())
	svc := func(name string, tweak func(*corev1.Service)) *corev1.Service {
		s := testService(name, "10.96.0.10", "rr")
		tweak(s)
		return s
	}
	for _, s := range []*corev1.Service{
		svc("cluster-ip", func(*corev1.Service) {}),
		svc("changed-cluster-ip", func(*corev1.Service) {}),
		svc("node-port", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }),
		svc("load-balancer", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }),
		svc("external-ip", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.168.56.11"} }),
		svc("ingress-only", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.168.56.200"}}
		}),
	} {
		tr.onService(s, false)
	}
	built := func() []string {
		t.Helper()
		in, err := tr.snapshot(false, batchFloor)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, si := range in.services {
			out = append(out, si.name.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := built(); len(got) != 6 {
		t.Fatalf("the first sync built %v, want every Service", got)
	}
	kernel = append(kernel, netip.MustParseAddr("192.168.56.241"))
	tr.nodeAddressesChanged()
	tr.onService(svc("changed-cluster-ip", func(s *corev1.Service) { s.Labels = map[string]string{"x": "y"} }), false)
	want := []string{"changed-cluster-ip", "external-ip", "ingress-only", "load-balancer", "node-port"}
	if diff := cmp.Diff(want, built()); diff != "" {
		t.Errorf("built after the address change (-want +got):\n%s", diff)
	}
	if got := built(); len(got) != 0 {
		t.Errorf("built at the next sync: %v, want none", got)
	}
}
