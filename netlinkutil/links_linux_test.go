package netlinkutil

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

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
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "vips0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "vips0-peer"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
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
