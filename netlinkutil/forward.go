package netlinkutil

import (
	"fmt"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// IPVS's forwarding methods and tunnel types (linux/ip_vs.h): a
// destination's conn_flags & IP_VS_CONN_F_FWD_MASK, and with
// IP_VS_CONN_F_TUNNEL its tun_type.
const (
	ipvsFwdMask       = 0x7
	ipvsFwdMasq       = 0 // IP_VS_CONN_F_MASQ
	ipvsFwdTunnel     = 2 // IP_VS_CONN_F_TUNNEL
	ipvsTunTypeIPIP   = 0 // IP_VS_CONN_F_TUNNEL_TYPE_IPIP
	ipvsTunTypeGUE    = 1 // IP_VS_CONN_F_TUNNEL_TYPE_GUE
	ipvsTunFlagNoCsum = 0 // IP_VS_TUNNEL_ENCAP_FLAG_NOCSUM
)

// ForwardForeign is what a read reports for a destination whose method
// ipvs-proxy never writes (direct routing, local node, a GRE tunnel, ...):
// it differs from every plan's, so a sync sets the plan's method.
const ForwardForeign ktypes.Forward = 0xff

// kernelFwd is a real server's method as IPVS's attributes carry it.
type kernelFwd struct {
	method  uint32
	tunType uint8
	tunPort uint16
}

// kernelForward renders a real server's method for the kernel; a method
// it does not know is refused (never sent as NAT).
func kernelForward(rs ktypes.RealServer) (kernelFwd, error) {
	switch rs.Forward {
	case ktypes.ForwardNAT:
		return kernelFwd{method: ipvsFwdMasq}, nil
	case ktypes.ForwardTunnel:
		return kernelFwd{method: ipvsFwdTunnel, tunType: ipvsTunTypeIPIP}, nil
	case ktypes.ForwardGUE:
		return kernelFwd{method: ipvsFwdTunnel, tunType: ipvsTunTypeGUE, tunPort: rs.TunPort}, nil
	}
	return kernelFwd{}, fmt.Errorf("forwarding method %s is not one ipvs-proxy writes", rs.Forward)
}

// forward is what the kernel's attributes say of a destination: its
// method and, for GUE, its port (a port the kernel keeps for an IPIP
// tunnel means nothing and is dropped).
func (k kernelFwd) forward() (ktypes.Forward, uint16) {
	switch {
	case k.method&ipvsFwdMask == ipvsFwdMasq:
		return ktypes.ForwardNAT, 0
	case k.method&ipvsFwdMask != ipvsFwdTunnel:
		return ForwardForeign, 0
	case k.tunType == ipvsTunTypeIPIP:
		return ktypes.ForwardTunnel, 0
	case k.tunType == ipvsTunTypeGUE:
		return ktypes.ForwardGUE, k.tunPort
	}
	return ForwardForeign, 0
}

// procForward reads the method column of /proc/net/ip_vs (the kernel's
// ip_vs_fwd_name), which names a tunnel without its type: "Tunnel" is
// reported as ForwardTunnel, and the caller reads such a virtual server
// again by netlink for the type and port.
func procForward(name string) ktypes.Forward {
	switch name {
	case "Masq":
		return ktypes.ForwardNAT
	case "Tunnel":
		return ktypes.ForwardTunnel
	}
	return ForwardForeign
}
