package cleanup

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestCleanupVirtualServers: cleanup deletes the virtual servers the
// reconciler's ownership rule gives ipvs-proxy, and no other.
func TestCleanupVirtualServers(t *testing.T) {
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(netip.MustParseAddr("10.0.2.15"))
	if err := links.EnsureDummy("ipvs-proxy0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.10", "10.96.7.7"} {
		if err := links.AddAddress("ipvs-proxy0", netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	key := func(ap string) ktypes.VSKey {
		x := netip.MustParseAddrPort(ap)
		return ktypes.VSKey{Address: x.Addr(), Protocol: ktypes.TCP, Port: x.Port()}
	}
	for _, ap := range []string{
		"10.96.0.10:80",    // on the interface: ours
		"10.96.7.7:53",     // on the interface, excluded: not ours
		"10.0.2.15:30080",  // node address, node-port range: ours
		"10.0.2.15:8080",   // node address, other port: not ours
		"192.0.2.50:30080", // nobody's address: not ours
	} {
		if err := ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: key(ap), Scheduler: "rr"}); err != nil {
			t.Fatal(err)
		}
	}
	own := model.Ownership{Interface: "ipvs-proxy0", NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.7.0/24")}}
	n, err := cleanupVirtualServers(ipvs, links, own)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2", n, err)
	}
	var left []string
	for _, l := range ipvs.Dump() {
		left = append(left, strings.Fields(l)[0])
	}
	slices.Sort(left)
	if diff := cmp.Diff([]string{"10.0.2.15:8080/TCP", "10.96.7.7:53/TCP", "192.0.2.50:30080/TCP"}, left); diff != "" {
		t.Errorf("virtual servers left (-want +got):\n%s", diff)
	}
	if n, err := cleanupVirtualServers(ipvs, links, own); err != nil || n != 0 {
		t.Errorf("second run deleted %d, %v; want 0", n, err)
	}
}
