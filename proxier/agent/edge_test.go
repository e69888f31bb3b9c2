package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// TestTakeoverNodePortsSkipKubeProxyVIPs: while a node is taken over from
// kube-proxy, kube-ipvs0 still holds kube-proxy's VIPs; they are Service
// addresses, not the node's, so no node port gets a virtual server on them
// (<clusterIP>:<nodePort> could collide with a real Service port).
func TestTakeoverNodePortsSkipKubeProxyVIPs(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	for _, err := range []error{
		links.EnsureDummy(netlinkutil.KubeProxyInterface),
		links.AddAddress(netlinkutil.KubeProxyInterface, netip.MustParseAddr("10.96.0.10")),
		links.AddAddress(netlinkutil.KubeProxyInterface, netip.MustParseAddr("10.96.0.99")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	p := newEdgeProxier(ipvs, links, time.Minute, netlinkutil.KubeProxyInterface)
	syncNodePortWeb(t, p)
	want := []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "192.168.0.10:30080/TCP rr", "  -> 10.0.1.2:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("kernel during the takeover (-want +got):\n%s", diff)
	}
}

// TestExternalIPOnNodeAddress: a Service whose externalIP is the node's
// own address gets its virtual server, but the address is not bound to
// the proxy's interface (the node keeps it; its other ports keep working).
func TestExternalIPOnNodeAddress(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	p := newEdgeProxier(ipvs, links, time.Minute, "")
	svc := testService("web", "10.96.0.10", "rr")
	svc.Spec.ExternalIPs = []string{node.String(), "203.0.113.5"}
	p.tracker.onService(svc, false)
	p.tracker.onSlice(testSlice("web", "10.0.1.2"), false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "192.168.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1",
		"203.0.113.5:80/TCP rr", "  -> 10.0.1.2:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
	bound := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("203.0.113.5")}
	if diff := cmp.Diff(bound, links.Addresses(testIface), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("addresses on %s (-want +got):\n%s", testIface, diff)
	}

	// Deleting the Service deletes its virtual server on the node address,
	// by a partial sync and by a full one (which reads the kernel anew: the
	// virtual server, on a node address outside the node-port range, is
	// not owned by the rule, but the agent made it).
	for _, full := range []bool{false, true} {
		p.tracker.onService(svc, true)
		if err := p.SyncOnce(full); err != nil {
			t.Fatal(err)
		}
		if d := ipvs.Dump(); len(d) != 0 {
			t.Errorf("kernel after the Service is deleted (full sync %v): %v", full, d)
		}
		p.tracker.onService(svc, false)
		if err := p.SyncOnce(false); err != nil {
			t.Fatal(err)
		}
	}
}

// TestZoneChangeRebuildsAtOnce: the node's zone label comes from Node
// events, not from the periodic full sync: a relabelled Node re-routes
// zone-hinted Services at the next partial sync.
func TestZoneChangeRebuildsAtOnce(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	p := newEdgeProxier(ipvs, links, time.Hour, "")
	nodeIn := func(zone string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
	}
	sl := testSlice("web", "10.0.1.2")
	sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.2.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	sl.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	sl.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	p.tracker.onNode(nodeIn("zone-a"), false)
	p.tracker.onService(testService("web", "10.96.0.10", "rr"), false)
	p.tracker.onSlice(sl, false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1"}, ipvs.Dump()); diff != "" {
		t.Errorf("in zone-a (-want +got):\n%s", diff)
	}
	p.tracker.onNode(nodeIn("zone-b"), false)
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.96.0.10:80/TCP rr", "  -> 10.0.2.2:8080 w=1"}, ipvs.Dump()); diff != "" {
		t.Errorf("after the Node moved to zone-b, a partial sync (-want +got):\n%s", diff)
	}
}

// TestNodeAddressChangeFollowedAtOnce: when the kernel reports a change of
// the node's addresses, the next partial sync moves the node ports, not
// the periodic full sync.
func TestNodeAddressChangeFollowedAtOnce(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	p := newEdgeProxier(ipvs, links, time.Hour, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.watchNodeAddresses(ctx)
	syncNodePortWeb(t, p)
	links.SetNodeAddresses(netip.MustParseAddr("192.168.0.20"))
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "192.168.0.20:30080/TCP rr", "  -> 10.0.1.2:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("after the node's address changed, a partial sync (-want +got):\n%s", diff)
	}
}

// TestNodeAddressesFromTheResyncRead: a change of the node's addresses the
// kernel did not announce is found by the periodic resync's read off the
// loop: the sync that adopts the read sees them differ from the loop's and
// has the next sync read them once in the loop (the read off the loop may
// be older than the loop's own: TestOffLoopAddressesNeverOlderThanTheLoops),
// which moves the node ports.
func TestNodeAddressesFromTheResyncRead(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	p := newEdgeProxier(ipvs, links, time.Hour, "")
	p.SetResyncReader(ipvs, links)
	syncNodePortWeb(t, p)
	links.SetNodeAddresses(netip.MustParseAddr("192.168.0.20")) // no watcher: unannounced
	run, ok := p.rec.StartResyncRead()
	if !ok {
		t.Fatal("no resync read off the loop")
	}
	run()
	links.ResetCalls()
	for _, full := range []bool{true, false} {
		if err := p.SyncOnce(full); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(slices.DeleteFunc(links.Reads(), func(c fake.Call) bool { return c != "ListNodeAddresses" })); n != 1 {
		t.Errorf("the loop read the node's addresses %d times; want once (the resync's read found them changed)", n)
	}
	want := []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "192.168.0.20:30080/TCP rr", "  -> 10.0.1.2:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("after the resync found the node's new address (-want +got):\n%s", diff)
	}
}

// syncNodePortWeb gives p the NodePort Service web (10.96.0.10:80, node
// port 30080, endpoint 10.0.1.2) and syncs it in full.
func syncNodePortWeb(t *testing.T, p *Proxier) {
	t.Helper()
	svc := testService("web", "10.96.0.10", "rr")
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	p.tracker.onService(svc, false)
	p.tracker.onSlice(testSlice("web", "10.0.1.2"), false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
}

// newEdgeProxier is the proxier of these tests on the fakes: node-a, the
// default node-port range, quick syncs; adopt names a kube-proxy interface
// taken over ("" for none).
func newEdgeProxier(ipvs *fake.IPVS, links *fake.Links, syncPeriod time.Duration, adopt string) *Proxier {
	return New(Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: syncPeriod,
		AdoptInterface: adopt},
		nil, ipvs, links, nil, nil, zap.NewNop())
}

// TestTombstones: a deletion the informer missed comes as a tombstone,
// with the last object the cache held or only its key; either way the
// Service's and the slice's virtual servers go, and the other Service's
// stay.
func TestTombstones(t *testing.T) {
	for _, withObj := range []bool{true, false} {
		t.Run(fmt.Sprintf("object=%v", withObj), func(t *testing.T) {
			ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
			p := newEdgeProxier(ipvs, links, time.Minute, "")
			web, sl := testService("web", "10.96.0.10", "rr"), testSlice("web", "10.0.1.2")
			p.tracker.onService(web, false)
			p.tracker.onSlice(sl, false)
			p.tracker.onService(testService("db", "10.96.0.11", "rr"), false)
			p.tracker.onSlice(testSlice("db", "10.0.1.3"), false)
			if err := p.SyncOnce(true); err != nil {
				t.Fatal(err)
			}
			tomb := func(key string, obj any) cache.DeletedFinalStateUnknown {
				if !withObj {
					obj = nil
				}
				return cache.DeletedFinalStateUnknown{Key: key, Obj: obj}
			}
			p.tracker.onSlice(tomb(sl.Namespace+"/"+sl.Name, model.SliceOf(sl)), true)
			if err := p.SyncOnce(false); err != nil {
				t.Fatal(err)
			}
			want := []string{"10.96.0.10:80/TCP rr", "10.96.0.11:80/TCP rr", "  -> 10.0.1.3:8080 w=1"}
			if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
				t.Errorf("after the slice's tombstone (-want +got):\n%s", diff)
			}
			p.tracker.onService(tomb(web.Namespace+"/"+web.Name, model.ServiceOf(web)), true)
			if err := p.SyncOnce(false); err != nil {
				t.Fatal(err)
			}
			want = []string{"10.96.0.11:80/TCP rr", "  -> 10.0.1.3:8080 w=1"}
			if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
				t.Errorf("after the Service's tombstone (-want +got):\n%s", diff)
			}
		})
	}
}
