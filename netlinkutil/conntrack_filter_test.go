package netlinkutil

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// TestUDPFlowsMatch: the filter of one ClearUDP call matches the UDP flows
// its clears name, by virtual server and answering real server's address
// (any for a whole virtual server), and nothing else: not TCP, not another
// port, not another real server, not the other family's clears.
func TestUDPFlowsMatch(t *testing.T) {
	vs := func(s string) ktypes.VSKey {
		ap := netip.MustParseAddrPort(s)
		return ktypes.VSKey{Address: ap.Addr(), Protocol: ktypes.UDP, Port: ap.Port()}
	}
	rs := func(s string) ktypes.RSKey {
		ap := netip.MustParseAddrPort(s)
		return ktypes.RSKey{Address: ap.Addr(), Port: ap.Port()}
	}
	clears := []UDPClear{
		{VS: vs("10.96.0.10:53"), RS: rs("10.0.1.2:53")},
		{VS: vs("10.96.0.11:53")}, // every real server
		{VS: vs("[fd00::10]:53"), RS: rs("[fd00:1::2]:53")},
	}
	flow := func(proto uint8, dst string, dport uint16, replyFrom string) *netlink.ConntrackFlow {
		f := &netlink.ConntrackFlow{}
		f.Forward = netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP("10.0.5.5"), DstIP: net.ParseIP(dst), DstPort: dport}
		f.Reverse = netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replyFrom)}
		return f
	}
	for _, tc := range []struct {
		name string
		flow *netlink.ConntrackFlow
		v6   bool
		want bool
	}{
		{"named real server", flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.0.1.2"), false, true},
		{"other real server", flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.0.2.2"), false, false},
		{"whole virtual server", flow(unix.IPPROTO_UDP, "10.96.0.11", 53, "10.0.9.9"), false, true},
		{"TCP", flow(unix.IPPROTO_TCP, "10.96.0.11", 53, "10.0.9.9"), false, false},
		{"other port", flow(unix.IPPROTO_UDP, "10.96.0.11", 54, "10.0.9.9"), false, false},
		{"IPv6", flow(unix.IPPROTO_UDP, "fd00::10", 53, "fd00:1::2"), true, true},
		{"IPv6 clear, IPv4 read", flow(unix.IPPROTO_UDP, "fd00::10", 53, "fd00:1::2"), false, false},
	} {
		if got := udpFlowsOf(clears, tc.v6).MatchConntrackFlow(tc.flow); got != tc.want {
			t.Errorf("%s: match %v, want %v", tc.name, got, tc.want)
		}
	}
}
