package proxier

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

const testIface = "ipvs-proxy0"

var (
	svcA = types.NamespacedName{Namespace: "default", Name: "a"}
	svcB = types.NamespacedName{Namespace: "default", Name: "b"}
	node = netip.MustParseAddr("192.168.0.10")
)

func testOwnership() model.Ownership {
	return model.Ownership{Interface: testIface, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}}
}

func newTestReconciler(t *testing.T) (*Reconciler, *fake.IPVS, *fake.Links) {
	t.Helper()
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(node)
	return NewReconciler(ipvs, links, testOwnership(), zap.NewNop()), ipvs, links
}

func vsKey(addrPort string, proto model.Protocol) model.VSKey {
	ap := netip.MustParseAddrPort(addrPort)
	return model.VSKey{Address: ap.Addr(), Protocol: proto, Port: ap.Port()}
}

// vsPlan builds a plan entry: addrPort of the VS, scheduler, real servers
// ("addr:port" weight 1, "addr:port@0" weight 0).
func vsPlan(kind model.AddressKind, addrPort, sched string, rss ...string) model.VSPlan {
	p := model.VSPlan{VirtualServer: model.VirtualServer{VSKey: vsKey(addrPort, model.TCP), Scheduler: sched}, Kind: kind}
	for _, r := range rss {
		weight := 1
		if a, ok := strings.CutSuffix(r, "@0"); ok {
			r, weight = a, 0
		}
		ap := netip.MustParseAddrPort(r)
		p.RealServers = append(p.RealServers, model.RealServer{RSKey: model.RSKey{Address: ap.Addr(), Port: ap.Port()}, Weight: weight})
	}
	return p
}

func plan(name types.NamespacedName, vss ...model.VSPlan) *model.ServicePlan {
	return &model.ServicePlan{Service: name, VirtualServers: vss}
}

func mustSync(t *testing.T, r *Reconciler, full bool) SyncStats {
	t.Helper()
	st, err := r.Sync(full)
	if err != nil {
		t.Fatalf("Sync(full=%v): %v", full, err)
	}
	return st
}

func callsDiff(t *testing.T, what string, want []string, got []fake.Call) {
	t.Helper()
	g := make([]string, len(got))
	for i, c := range got {
		g[i] = string(c)
	}
	if diff := cmp.Diff(want, g, cmp.Comparer(func(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") })); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

func resetCalls(ipvs *fake.IPVS, links *fake.Links) {
	ipvs.ResetCalls()
	links.ResetCalls()
}

func TestReconcilerWrites(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	a1 := plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080"))

	// Adding a Service: bind its VIP, one VS, one write per real server.
	r.SetPlan(svcA, a1)
	st := mustSync(t, r, false)
	if !st.Full {
		t.Errorf("first sync was not full")
	}
	callsDiff(t, "ipvs writes, add service", []string{
		"AddVirtualServer 10.96.0.10:80/TCP rr",
		"AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1",
		"AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1",
	}, ipvs.Writes())
	callsDiff(t, "link writes, add service", []string{"EnsureDummy ipvs-proxy0", "AddAddress ipvs-proxy0 10.96.0.10"}, links.Writes())
	if st.Writes != 4 {
		t.Errorf("stats writes = %d, want 4", st.Writes)
	}

	steps := []struct {
		name       string
		plan       *model.ServicePlan
		wantIPVS   []string
		wantLinks  []string
		wantKernel []string
	}{
		{
			name:     "add an endpoint",
			plan:     plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS: []string{"AddRealServer 10.96.0.10:80/TCP 10.0.3.2:8080 w=1"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "  -> 10.0.2.2:8080 w=1",
				"  -> 10.0.3.2:8080 w=1"},
		},
		{
			// Its pod is terminating but still serving: weight 0, so
			// established connections go on and new ones go elsewhere.
			name:     "an endpoint drains",
			plan:     plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080@0", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS: []string{"UpdateRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=0"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=0", "  -> 10.0.2.2:8080 w=1",
				"  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:       "remove an endpoint",
			plan:       plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS:   []string{"DeleteRealServer 10.96.0.10:80/TCP 10.0.1.2:8080"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:       "change the scheduler",
			plan:       plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "sh", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS:   []string{"UpdateVirtualServer 10.96.0.10:80/TCP sh"},
			wantKernel: []string{"10.96.0.10:80/TCP sh", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:       "unchanged plan",
			plan:       plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "sh", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantKernel: []string{"10.96.0.10:80/TCP sh", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:      "delete the service",
			plan:      nil,
			wantIPVS:  []string{"DeleteVirtualServer 10.96.0.10:80/TCP"},
			wantLinks: []string{"DeleteAddress ipvs-proxy0 10.96.0.10"},
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			resetCalls(ipvs, links)
			r.SetPlan(svcA, s.plan)
			st := mustSync(t, r, false)
			if st.Full {
				t.Errorf("sync was full, want partial")
			}
			callsDiff(t, "ipvs writes", s.wantIPVS, ipvs.Writes())
			callsDiff(t, "link writes", s.wantLinks, links.Writes())
			if diff := cmp.Diff(s.wantKernel, ipvs.Dump()); diff != "" {
				t.Errorf("kernel (-want +got):\n%s", diff)
			}
			if st.Writes != len(s.wantIPVS)+len(s.wantLinks) {
				t.Errorf("stats writes = %d, want %d", st.Writes, len(s.wantIPVS)+len(s.wantLinks))
			}
			for _, c := range ipvs.Reads() {
				if c == "ListVirtualServers" {
					t.Errorf("partial sync dumped every virtual server")
				}
			}
		})
	}
	if got := links.Addresses(testIface); len(got) != 0 {
		t.Errorf("addresses left on %s: %v", testIface, got)
	}
}

// twoServices programs two Services through a first reconciler.
func twoServices(t *testing.T, r *Reconciler) {
	t.Helper()
	r.SetPlan(svcA, plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080"),
		vsPlan(model.KindNodePort, "192.168.0.10:30080", "rr", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(svcB, plan(svcB, vsPlan(model.KindClusterIP, "10.96.0.11:53", "lc", "10.0.1.3:53")))
	mustSync(t, r, false)
}

func TestReconcilerResyncAndRestartMakeNoWrites(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	twoServices(t, r)
	before := ipvs.Dump()

	resetCalls(ipvs, links)
	st := mustSync(t, r, true)
	callsDiff(t, "full resync writes", nil, ipvs.Writes())
	callsDiff(t, "full resync link writes", nil, links.Writes())
	if st.Writes != 0 {
		t.Errorf("stats writes = %d", st.Writes)
	}
	// One dump of virtual servers and one of each VS's destinations.
	callsDiff(t, "full resync reads", []string{
		"ListVirtualServers",
		"ListRealServers 10.96.0.10:80/TCP",
		"ListRealServers 192.168.0.10:30080/TCP",
		"ListRealServers 10.96.0.11:53/TCP",
	}, ipvs.Reads())

	// A restart: a new reconciler on the same kernel adopts its state.
	resetCalls(ipvs, links)
	r2 := NewReconciler(ipvs, links, testOwnership(), zap.NewNop())
	twoServices(t, r2)
	callsDiff(t, "restart writes", nil, ipvs.Writes())
	callsDiff(t, "restart link writes", nil, links.Writes())
	if diff := cmp.Diff(before, ipvs.Dump()); diff != "" {
		t.Errorf("kernel changed by restart (-before +after):\n%s", diff)
	}
}

func TestReconcilerRepairsDrift(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	twoServices(t, r)
	want := ipvs.Dump()

	// Someone deletes a real server, and changes a scheduler, by hand.
	k := vsKey("10.96.0.10:80", model.TCP)
	if err := ipvs.DeleteRealServer(k, model.RSKey{Address: netip.MustParseAddr("10.0.1.2"), Port: 8080}); err != nil {
		t.Fatal(err)
	}
	if err := ipvs.UpdateVirtualServer(model.VirtualServer{VSKey: vsKey("10.96.0.11:53", model.TCP), Scheduler: "wrr"}); err != nil {
		t.Fatal(err)
	}
	resetCalls(ipvs, links)
	mustSync(t, r, true)
	callsDiff(t, "repair writes", []string{
		"AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1",
		"UpdateVirtualServer 10.96.0.11:53/TCP lc",
	}, ipvs.Writes())
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("kernel after repair (-want +got):\n%s", diff)
	}
}

func TestReconcilerOwnership(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	// Present before start: a foreign VS on an address that is not ours, a
	// foreign VS on a node address outside the node-port range, an excluded
	// VS on our interface, and a stale VS of ours on our interface.
	foreign := []model.VirtualServer{
		{VSKey: vsKey("172.16.0.1:80", model.TCP), Scheduler: "wlc"},
		{VSKey: vsKey("192.168.0.10:8443", model.TCP), Scheduler: "rr"},
		{VSKey: vsKey("10.200.0.1:80", model.TCP), Scheduler: "rr"},
	}
	for _, v := range append(foreign, model.VirtualServer{VSKey: vsKey("10.96.0.99:80", model.TCP), Scheduler: "rr"},
		model.VirtualServer{VSKey: vsKey("192.168.0.10:30999", model.TCP), Scheduler: "rr"}) {
		if err := ipvs.AddVirtualServer(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := links.EnsureDummy(testIface); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.99", "10.200.0.1", "fe80::1"} {
		if err := links.AddAddress(testIface, netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	resetCalls(ipvs, links)
	r.SetPlan(svcA, plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr")))
	mustSync(t, r, false)
	callsDiff(t, "ipvs writes", []string{
		"AddVirtualServer 10.96.0.10:80/TCP rr",
		"DeleteVirtualServer 10.96.0.99:80/TCP",
		"DeleteVirtualServer 192.168.0.10:30999/TCP",
	}, ipvs.Writes())
	callsDiff(t, "link writes", []string{"AddAddress ipvs-proxy0 10.96.0.10", "DeleteAddress ipvs-proxy0 10.96.0.99"}, links.Writes())
	dump := strings.Join(ipvs.Dump(), "\n")
	for _, v := range foreign {
		if !strings.Contains(dump, v.String()) {
			t.Errorf("foreign virtual server %s was removed; kernel:\n%s", v, dump)
		}
	}
}

func TestReconcilerRecoversFromWriteError(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	errBusy := errors.New("injected: device or resource busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.0.10:80/TCP 10.0.2.2") {
			return errBusy
		}
		return nil
	})
	r.SetPlan(svcA, plan(svcA, vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(svcB, plan(svcB, vsPlan(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080")))
	_, err := r.Sync(false)
	if !errors.Is(err, errBusy) || !strings.Contains(err.Error(), "default/a") {
		t.Fatalf("Sync error = %v, want the injected error naming default/a", err)
	}
	// The other Service is programmed regardless.
	if !strings.Contains(strings.Join(ipvs.Dump(), "\n"), "10.96.0.11:80/TCP rr\n  -> 10.0.1.3:8080 w=1") {
		t.Errorf("service b not programmed after a's failure:\n%s", strings.Join(ipvs.Dump(), "\n"))
	}
	if !r.Pending() {
		t.Errorf("no sync pending after a failure")
	}
	ipvs.InjectErrors(nil)
	resetCalls(ipvs, links)
	st := mustSync(t, r, false)
	if !st.Full {
		t.Errorf("the sync after a failure was not full")
	}
	callsDiff(t, "retry writes", []string{"AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1"}, ipvs.Writes())
	if r.Pending() {
		t.Errorf("still pending after a successful retry")
	}
}

func TestReconcilerConflict(t *testing.T) {
	r, ipvs, _ := newTestReconciler(t)
	// Two Services claim the same externalIP and port: the first one holds
	// it; the second gets it once the first lets go.
	r.SetPlan(svcA, plan(svcA, vsPlan(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.1.2:8080")))
	r.SetPlan(svcB, plan(svcB, vsPlan(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.2.2:8080")))
	mustSync(t, r, false)
	if diff := cmp.Diff([]string{"172.20.0.5:80/TCP rr", "  -> 10.0.1.2:8080 w=1"}, ipvs.Dump()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
	r.SetPlan(svcA, nil)
	mustSync(t, r, false) // releases; marks b dirty
	mustSync(t, r, false) // b claims
	if diff := cmp.Diff([]string{"172.20.0.5:80/TCP rr", "  -> 10.0.2.2:8080 w=1"}, ipvs.Dump()); diff != "" {
		t.Errorf("kernel after handover (-want +got):\n%s", diff)
	}
}

// TestReconcilerClearsUDPConntrack: removing a UDP real server clears the
// conntrack entries of flows to it; a TCP one does not need it.
func TestReconcilerClearsUDPConntrack(t *testing.T) {
	r, _, _ := newTestReconciler(t)
	ct := &fake.Conntrack{}
	r.SetConntrack(ct)
	udp := func(rss ...string) model.VSPlan {
		p := vsPlan(model.KindClusterIP, "10.96.0.10:53", "rr", rss...)
		p.Protocol = model.UDP
		return p
	}
	r.SetPlan(svcA, plan(svcA, udp("10.0.1.2:53", "10.0.2.2:53"), vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:80", "10.0.2.2:80")))
	mustSync(t, r, false)
	r.SetPlan(svcA, plan(svcA, udp("10.0.2.2:53"), vsPlan(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.2.2:80")))
	mustSync(t, r, false)
	callsDiff(t, "conntrack calls", []string{"ClearUDP 10.96.0.10:53/UDP 10.0.1.2:53"}, ct.Calls())
}
