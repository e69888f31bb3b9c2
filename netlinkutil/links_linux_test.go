package netlinkutil

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

func newLinks(t *testing.T) Links {
	t.Helper()
	l, err := NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// addVeth adds a veth pair, name and name-peer, and returns name's link.
func addVeth(t *testing.T, name string) netlink.Link {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "-peer"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return link
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// TestAddresses binds and unbinds host addresses on a link, in a fresh
// namespace on the machine's own kernel (a veth: no dummy module needed).
func TestAddresses(t *testing.T) {
	nltest.InFreshNetns(t)
	addVeth(t, "vips0")
	l := newLinks(t)
	for _, a := range addrs("10.96.0.10", "10.96.0.11", "fd00:10:96::a") {
		if err := l.AddAddress("vips0", a); err != nil {
			t.Fatal(err)
		}
	}
	// Binding twice is not an error.
	if err := l.AddAddress("vips0", netip.MustParseAddr("10.96.0.10")); err != nil {
		t.Fatalf("second bind: %v", err)
	}
	got, err := l.ListAddresses("vips0")
	if err != nil {
		t.Fatal(err)
	}
	got = slices.DeleteFunc(got, netip.Addr.IsLinkLocalUnicast)
	slices.SortFunc(got, netip.Addr.Compare)
	if diff := cmp.Diff(addrs("10.96.0.10", "10.96.0.11", "fd00:10:96::a"), got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}

	// Node addresses leave out loopback and the excluded link.
	peer, err := netlink.LinkByName("vips0-peer")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr("192.168.5.1").AsSlice())}); err != nil {
		t.Fatal(err)
	}
	lo, _ := netlink.LinkByName("lo")
	_ = netlink.LinkSetUp(lo)
	node, err := l.NodeAddresses("vips0")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(addrs("192.168.5.1"), node, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("node addresses (-want +got):\n%s", diff)
	}

	for _, a := range addrs("10.96.0.10", "fd00:10:96::a", "10.96.0.10") { // the second delete is a no-op
		if err := l.DeleteAddress("vips0", a); err != nil {
			t.Fatalf("unbind %s: %v", a, err)
		}
	}
	got, _ = l.ListAddresses("vips0")
	got = slices.DeleteFunc(got, netip.Addr.IsLinkLocalUnicast)
	if len(got) != 1 || got[0] != netip.MustParseAddr("10.96.0.11") {
		t.Errorf("after unbinding: %v, want [10.96.0.11]", got)
	}
	// A missing link has no addresses, and deleting it is fine.
	if a, err := l.ListAddresses("nosuch0"); err != nil || a != nil {
		t.Errorf("ListAddresses(nosuch0) = %v, %v", a, err)
	}
	if err := l.DeleteLink("nosuch0"); err != nil {
		t.Errorf("DeleteLink(nosuch0) = %v", err)
	}
}

// TestDummy creates the VIP interface. The machine's own kernel may lack the
// dummy module; the VM's has it.
func TestDummy(t *testing.T) {
	nltest.InFreshNetns(t)
	l := newLinks(t)
	err := l.EnsureDummy("ipvs-test0")
	if err != nil && missingFeature(err) {
		nltest.Require(t, "dummy interfaces", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Idempotent, and up.
	if err := l.EnsureDummy("ipvs-test0"); err != nil {
		t.Fatalf("second EnsureDummy: %v", err)
	}
	link, err := netlink.LinkByName("ipvs-test0")
	if err != nil {
		t.Fatal(err)
	}
	if link.Type() != "dummy" || link.Attrs().OperState == netlink.OperDown {
		t.Errorf("link type %s state %s", link.Type(), link.Attrs().OperState)
	}
	if err := l.AddAddress("ipvs-test0", netip.MustParseAddr("10.96.0.1")); err != nil {
		t.Fatal(err)
	}
	// Marked as ipvs-proxy's; a dummy made by another tool is not, until
	// EnsureDummy is told to use it.
	foreign := netlink.NewLinkAttrs()
	foreign.Name = "foreign0"
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: foreign}); err != nil {
		t.Fatal(err)
	}
	infos := func() map[string]any {
		out := map[string]any{}
		for _, name := range []string{"ipvs-test0", "foreign0", "missing0"} {
			info, ok, err := l.LinkInfo(name)
			out[name] = fmt.Sprint(info, ok, info.Owned(), err)
		}
		return out
	}
	if diff := cmp.Diff(map[string]any{"ipvs-test0": "{dummy ipvs-proxy} true true <nil>", "foreign0": "{dummy } true false <nil>",
		"missing0": "{ } false false <nil>"}, infos()); diff != "" {
		t.Errorf("LinkInfo (-want +got):\n%s", diff)
	}
	if err := l.EnsureDummy("foreign0"); err != nil {
		t.Fatal(err)
	}
	if info, _, _ := l.LinkInfo("foreign0"); !info.Owned() {
		t.Errorf("EnsureDummy on an unmarked dummy left it %+v", info)
	}
	// A link of another type under the name is refused, not taken over.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "notdummy0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "notdummy0-p"}); err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureDummy("notdummy0"); err == nil {
		t.Errorf("EnsureDummy on a veth succeeded")
	}
	if err := l.DeleteLink("ipvs-test0"); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName("ipvs-test0"); err == nil {
		t.Errorf("link still there after DeleteLink")
	}
}

// TestLocalRoutes routes Service ranges as local through a link: every
// address in them is the node's own (a host socket on the wildcard
// address answers a connection to one), none is bound, the node's own
// connections come from the route's source (without one, IPv4 uses the
// destination itself), and only the routes ipvs-proxy added are listed
// (not the kernel's own for a bound address).
func TestLocalRoutes(t *testing.T) {
	nltest.InFreshNetns(t)
	addVeth(t, "vips0")
	for _, name := range []string{"vips0", "lo"} {
		link, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	// The node's addresses, on the other link.
	peer, err := netlink.LinkByName("vips0-peer")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.168.5.1", "fd00:1::1"} {
		if err := netlink.AddrAdd(peer, &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr(a).AsSlice()), Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
	}
	l := newLinks(t)
	if err := l.AddAddress("vips0", netip.MustParseAddr("10.97.0.1")); err != nil {
		t.Fatal(err)
	}
	want := []LocalRoute{
		{Prefix: netip.MustParsePrefix("10.96.0.0/16")},
		{Prefix: netip.MustParsePrefix("10.98.0.0/16"), Src: netip.MustParseAddr("192.168.5.1")},
		{Prefix: netip.MustParsePrefix("fd00:10:96::/112"), Src: netip.MustParseAddr("fd00:1::1")},
	}
	for _, r := range append(want, want[0]) { // the second add is a no-op
		if err := l.AddLocalRoute("vips0", r); err != nil {
			t.Fatalf("add %s: %v", r, err)
		}
	}
	got, err := l.ListLocalRoutes("vips0")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b LocalRoute) bool { return a == b })); diff != "" {
		t.Errorf("local routes (-want +got):\n%s", diff)
	}
	bound, _ := l.ListAddresses("vips0")
	bound = slices.DeleteFunc(bound, netip.Addr.IsLinkLocalUnicast)
	if len(bound) != 1 {
		t.Errorf("addresses on vips0: %v, want only 10.97.0.1", bound)
	}

	// An address of a range is local: a listener on the wildcard address
	// answers it.
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for dst, src := range map[string]string{"10.96.5.5": "10.96.5.5", "10.98.5.5": "192.168.5.1", "fd00:10:96::55": "fd00:1::1"} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(dst, port), 2*time.Second)
		if err != nil {
			t.Errorf("connect to %s in a routed range: %v", dst, err)
			continue
		}
		if local := c.LocalAddr().(*net.TCPAddr).IP.String(); local != src {
			t.Errorf("connection to %s comes from %s, want %s", dst, local, src)
		}
		c.Close()
	}

	// A changed source replaces the route.
	moved := LocalRoute{Prefix: want[0].Prefix, Src: netip.MustParseAddr("192.168.5.1")}
	if err := l.AddLocalRoute("vips0", moved); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.ListLocalRoutes("vips0"); len(got) != 3 || got[0] != moved {
		t.Errorf("after replacing: %v, want %v first of 3", got, moved)
	}
	for _, r := range append(want, want[0]) { // the second delete is a no-op
		if err := l.DeleteLocalRoute("vips0", r); err != nil {
			t.Fatalf("delete %s: %v", r, err)
		}
	}
	if got, err := l.ListLocalRoutes("vips0"); err != nil || len(got) != 0 {
		t.Errorf("after deleting: %v, %v; want none", got, err)
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("10.96.5.5", port), time.Second); err == nil {
		c.Close()
		t.Errorf("10.96.5.5 still answered after its range's route was deleted")
	}
	// A missing link has no routes, and deleting from it is fine.
	if got, err := l.ListLocalRoutes("nosuch0"); err != nil || got != nil {
		t.Errorf("ListLocalRoutes(nosuch0) = %v, %v", got, err)
	}
	if err := l.DeleteLocalRoute("nosuch0", want[0]); err != nil {
		t.Errorf("DeleteLocalRoute(nosuch0) = %v", err)
	}
}

// TestLocalRouteGoesWithTheLastIPv4Address: the kernel fact behind
// model.RangeAnchor (and the fake's model of it). Removing a link's last
// IPv4 address removes every IPv4 route through the link, a Service
// range's local route too; while another IPv4 address stays on the link
// (the range's anchor), removing one leaves the route.
func TestLocalRouteGoesWithTheLastIPv4Address(t *testing.T) {
	nltest.InFreshNetns(t)
	if err := netlink.LinkSetUp(addVeth(t, "vips0")); err != nil {
		t.Fatal(err)
	}
	l := newLinks(t)
	rng := LocalRoute{Prefix: netip.MustParsePrefix("10.96.0.0/16")}
	external, anchor := netip.MustParseAddr("10.251.0.10"), netip.MustParseAddr("10.96.0.0")
	routed := func() bool {
		t.Helper()
		got, err := l.ListLocalRoutes("vips0")
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(got, func(r LocalRoute) bool { return r.Prefix == rng.Prefix })
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	must(l.AddAddress("vips0", external))
	must(l.AddLocalRoute("vips0", rng))
	must(l.DeleteAddress("vips0", external))
	if routed() {
		t.Errorf("%s still routed through vips0 after its last IPv4 address went: the kernel kept it (the anchor would not be needed)", rng.Prefix)
	}

	must(l.AddAddress("vips0", anchor))
	must(l.AddAddress("vips0", external))
	must(l.AddLocalRoute("vips0", rng))
	must(l.DeleteAddress("vips0", external))
	if !routed() {
		t.Errorf("%s gone with %s while the anchor %s stayed bound", rng.Prefix, external, anchor)
	}
}
