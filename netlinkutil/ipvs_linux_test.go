package netlinkutil

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

func newIPVS(t *testing.T) IPVS {
	t.Helper()
	h, err := NewIPVS()
	if err == nil {
		_, err = h.ListVirtualServers()
	}
	nltest.Require(t, "IPVS", err)
	t.Cleanup(h.Close)
	return h
}

// routeBackends routes 10.0.0.0/8, where tests' real servers are, through a
// veth: the kernel refuses (EINVAL) a NAT real server whose IPv4 address
// has no route.
func routeBackends(t *testing.T) {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "backends0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "backends0-p"}); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName("backends0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
}

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// TestIPVSTable programs virtual and real servers (IPv4 and IPv6) and reads
// them back from the kernel.
func TestIPVSTable(t *testing.T) {
	nltest.InFreshNetns(t)
	h := newIPVS(t)
	routeBackends(t)
	tcp := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ktypes.TCP, Port: 80}, Scheduler: "rr"}
	udp := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ktypes.UDP, Port: 53}, Scheduler: "sh",
		Flags: ktypes.FlagSched1 | ktypes.FlagSched2}
	sctp := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.12"), Protocol: ktypes.SCTP, Port: 3868}, Scheduler: "lc",
		Flags: ktypes.FlagPersistent, Timeout: 600}
	v6 := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("fd00:10:96::10"), Protocol: ktypes.TCP, Port: 443}, Scheduler: "mh"}
	for _, v := range []ktypes.VirtualServer{tcp, udp, sctp, v6} {
		if err := h.AddVirtualServer(v); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []ktypes.RealServer{ktypestest.RS("10.0.1.2:8080@1"), ktypestest.RS("10.0.2.2:8080@1")} {
		if err := h.AddRealServer(tcp.VSKey, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.AddRealServer(v6.VSKey, ktypestest.RS("[fd00:1::2]:8443@3")); err != nil {
		t.Fatal(err)
	}
	got, err := h.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[ktypes.VSKey]ktypes.VirtualServer{}
	for _, v := range got {
		byKey[v.VSKey] = v
	}
	if len(got) != 4 {
		t.Errorf("listed %d virtual servers, want 4: %v", len(got), got)
	}
	for _, want := range []ktypes.VirtualServer{tcp, udp, sctp, v6} {
		if g, ok := byKey[want.VSKey]; !ok || !g.Equal(want) {
			t.Errorf("kernel has %v, want %v", g, want)
		}
	}

	// Update a weight, the scheduler; delete a real server; read back.
	if err := h.UpdateRealServer(tcp.VSKey, ktypestest.RS("10.0.2.2:8080@5")); err != nil {
		t.Fatal(err)
	}
	if err := h.DeleteRealServer(tcp.VSKey, ktypestest.RS("10.0.1.2:8080@0").RSKey); err != nil {
		t.Fatal(err)
	}
	tcp.Scheduler = "wlc"
	if err := h.UpdateVirtualServer(tcp); err != nil {
		t.Fatal(err)
	}
	dests, err := h.ListRealServers(tcp.VSKey)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]ktypes.RealServer{ktypestest.RS("10.0.2.2:8080@5")}, dests, addrCmp); diff != "" {
		t.Errorf("real servers (-want +got):\n%s", diff)
	}
	dests6, err := h.ListRealServers(v6.VSKey)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]ktypes.RealServer{ktypestest.RS("[fd00:1::2]:8443@3")}, dests6, addrCmp); diff != "" {
		t.Errorf("IPv6 real servers (-want +got):\n%s", diff)
	}
	if err := h.SetTimeouts(Timeouts{TCP: 900e9, UDP: 30e9}); err != nil {
		t.Errorf("set timeouts: %v", err)
	}
	for _, v := range []ktypes.VirtualServer{tcp, udp, sctp, v6} {
		if err := h.DeleteVirtualServer(v.VSKey); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := h.ListVirtualServers(); len(got) != 0 {
		t.Errorf("left after deleting: %v", got)
	}
	err = h.AddVirtualServer(ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.13"), Protocol: ktypes.TCP, Port: 80}, Scheduler: "bogus"})
	if err == nil {
		t.Errorf("the kernel accepted an unknown scheduler")
	}
	t.Logf("unknown scheduler: %v", err)
}

// TestIPVSRealTraffic puts a virtual IP on a dummy interface in front of two
// backends in their own namespaces and connects to it, over TCP and UDP,
// from a client namespace: every backend must answer.
func TestIPVSRealTraffic(t *testing.T) {
	nltest.InFreshNetns(t)
	h := newIPVS(t)
	l := newLinks(t)
	if err := l.EnsureDummy("ipvs-test0"); err != nil {
		nltest.Require(t, "dummy interfaces", err)
	}
	vip := netip.MustParseAddr("10.96.0.10")
	if err := l.AddAddress("ipvs-test0", vip); err != nil {
		t.Fatal(err)
	}
	sys := Sysctls{Root: "/proc/sys"} // this thread's namespace
	if _, err := sys.Ensure("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	nets := []struct{ name, host, addr string }{
		{"be1", "10.0.1.1/24", "10.0.1.2/24"},
		{"be2", "10.0.2.1/24", "10.0.2.2/24"},
		{"cli", "10.0.3.1/24", "10.0.3.2/24"},
	}
	// Namespace names are global: make them unique to this test run.
	for i := range nets {
		nets[i].name = fmt.Sprintf("nl%s", nets[i].name)
		n := nets[i]
		if err := nettest.AddNetns(n.name, nettest.NetnsConfig{HostAddr: netip.MustParsePrefix(n.host), Addr: netip.MustParsePrefix(n.addr)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := nettest.DelNetns(n.name); err != nil {
				t.Errorf("delete netns: %v", err)
			}
		})
	}
	for i, n := range nets[:2] {
		srv, err := nettest.Serve(nettest.ServeConfig{Netns: n.name, Name: fmt.Sprintf("backend-%d", i+1), Port: 8080, TCP: true, UDP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
	}
	for _, proto := range []ktypes.Protocol{ktypes.TCP, ktypes.UDP} {
		vs := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: vip, Protocol: proto, Port: 80}, Scheduler: "rr"}
		if err := h.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
		for _, r := range []ktypes.RealServer{ktypestest.RS("10.0.1.2:8080@1"), ktypestest.RS("10.0.2.2:8080@1")} {
			if err := h.AddRealServer(vs.VSKey, r); err != nil {
				t.Fatal(err)
			}
		}
		res, err := nettest.Hit(context.Background(), nettest.HitConfig{Netns: nets[2].name, Proto: map[ktypes.Protocol]string{ktypes.TCP: "tcp", ktypes.UDP: "udp"}[proto], Addr: "10.96.0.10:80", N: 6})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]int{"backend-1": 3, "backend-2": 3}, res.Answers); diff != "" || len(res.Errors) > 0 {
			t.Errorf("%s answers via the VIP (-want +got):\n%s\nerrors: %v", proto, diff, res.Errors)
		}
		// The client's own address reached the backends: IPVS NAT, no masquerade.
		if res.Clients["10.0.3.2"] != 6 {
			t.Errorf("%s: backends saw clients %v, want 10.0.3.2 six times", proto, res.Clients)
		}
	}
}

// TestIPVSMissingScheduler: the kernel answers a scheduler it cannot load
// with an error that SchedulerUnavailable recognises, on add and on update,
// and leaves the table as it was.
func TestIPVSMissingScheduler(t *testing.T) {
	nltest.InFreshNetns(t)
	h := newIPVS(t)
	vs := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.12"), Protocol: ktypes.TCP, Port: 80}, Scheduler: "nosuch"}
	err := h.AddVirtualServer(vs)
	if err == nil || !SchedulerUnavailable(err) {
		t.Fatalf("add with scheduler %q: %v, want ENOENT", vs.Scheduler, err)
	}
	vs.Scheduler = "rr"
	if err := h.AddVirtualServer(vs); err != nil {
		t.Fatal(err)
	}
	vs.Scheduler = "nosuch"
	if err := h.UpdateVirtualServer(vs); err == nil || !SchedulerUnavailable(err) {
		t.Fatalf("update to scheduler %q: %v, want ENOENT", vs.Scheduler, err)
	}
	got, err := h.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Scheduler != "rr" {
		t.Errorf("table after the refusals: %v, want the rr virtual server only", got)
	}
	// Other errors are not mistaken for a missing scheduler.
	vs.Scheduler = "rr"
	if err := h.AddVirtualServer(vs); err == nil || SchedulerUnavailable(err) {
		t.Errorf("adding an existing virtual server: %v, want an error that is not ENOENT", err)
	}
}
