package tunnelend

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// End is one tunnel to end on this node: packets that another node's IPVS
// tunnels to Endpoint's address for VIP:Port are decapsulated here and
// sent to Endpoint (the pod's address and targetPort).
type End struct {
	VIP      netip.Addr
	Protocol ktypes.Protocol
	Port     uint16
	Endpoint netip.AddrPort
	// Forward is ktypes.ForwardTunnel (IPIP) or ktypes.ForwardGUE, whose
	// UDP destination port GUEPort is.
	Forward ktypes.Forward
	GUEPort uint16
}

func (e End) String() string {
	s := fmt.Sprintf("%s/%s -> %s %s", netip.AddrPortFrom(e.VIP, e.Port), e.Protocol, e.Endpoint, e.Forward)
	if e.Forward == ktypes.ForwardGUE {
		s += fmt.Sprintf(":%d", e.GUEPort)
	}
	return s
}

// errIPv6 is what an IPv6 end fails with: README.md#ipv6 says what it
// would need.
var errIPv6 = errors.New("IPv6 tunnel ends are not built yet (IPv6-in-IPv6 through ip6tnl0, fou6, ip6tables and an IPv6 policy rule; proxier/tunnelend/README.md)")

// check tells why the end cannot be programmed, nil if it can.
func (e End) check() error {
	if e.VIP.Is6() || e.Endpoint.Addr().Is6() {
		return fmt.Errorf("%s: %w", e, errIPv6)
	}
	if !e.VIP.Is4() || !e.Endpoint.Addr().Is4() || e.Port == 0 || e.Endpoint.Port() == 0 {
		return fmt.Errorf("%s: want IPv4 addresses and non-zero ports", e)
	}
	switch e.Protocol {
	case ktypes.TCP, ktypes.UDP, ktypes.SCTP:
	default:
		return fmt.Errorf("%s: protocol %d is not TCP, UDP or SCTP", e, e.Protocol)
	}
	switch {
	case e.Forward == ktypes.ForwardGUE && e.GUEPort == 0:
		return fmt.Errorf("%s: GUE needs a port", e)
	case e.Forward != ktypes.ForwardTunnel && e.Forward != ktypes.ForwardGUE:
		return fmt.Errorf("%s: not a tunnel", e)
	}
	return nil
}

// overhead is the tunnel's header size: outer IPv4 20, plus UDP 8 and GUE
// 4 for GUE (DSR.md, measured on the bed).
func (e End) overhead() int {
	if e.Forward == ktypes.ForwardGUE {
		return 32
	}
	return 20
}
