package ktypes

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Protocol is an IP protocol number as IPVS knows it.
type Protocol uint16

// Protocols that IPVS balances.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", uint16(p))
}

// ParseProtocol maps "TCP", "udp", "SCTP" to a Protocol.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q", s)
}

// Scheduler flags of IPVS (IP_VS_SVC_F_SCHED1..3) and persistence. The
// meaning of the scheduler flags depends on the scheduler: for sh, flag 1 is
// sh-fallback and flag 2 is sh-port; for mh likewise mh-fallback, mh-port.
const (
	FlagPersistent uint32 = 0x0001
	FlagHashed     uint32 = 0x0002 // set by the kernel; never compared
	FlagOnePacket  uint32 = 0x0004
	FlagSched1            = scheduler.FlagSched1
	FlagSched2            = scheduler.FlagSched2
	FlagSched3            = scheduler.FlagSched3

	// FlagsCompared is the part of a virtual server's flags that ipvs-proxy
	// sets and therefore compares with the kernel's.
	FlagsCompared = FlagPersistent | FlagOnePacket | FlagSched1 | FlagSched2 | FlagSched3
)

// VSKey identifies a virtual server: the kernel looks services up by
// (address, protocol, port).
type VSKey struct {
	Address  netip.Addr
	Protocol Protocol
	Port     uint16
}

func (k VSKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Address, k.Port), k.Protocol)
}

// VirtualServer is one IPVS service.
type VirtualServer struct {
	VSKey
	Scheduler string
	// Flags holds FlagPersistent and the scheduler flags; other bits are
	// ignored when comparing.
	Flags uint32
	// Timeout is the persistence timeout in seconds (with FlagPersistent).
	Timeout uint32
}

// Equal reports whether two virtual servers have the same settings as far as
// ipvs-proxy programs them.
func (v VirtualServer) Equal(o VirtualServer) bool {
	return v.VSKey == o.VSKey && v.Scheduler == o.Scheduler &&
		v.Flags&FlagsCompared == o.Flags&FlagsCompared &&
		(v.Flags&FlagPersistent == 0 || v.Timeout == o.Timeout)
}

// Ordered reports whether the virtual server's scheduler builds its table
// by walking the real-server list in the kernel's list order (sh, dh and
// mh: ip_vs_sh_reassign, ip_vs_dh_reassign, ip_vs_mh_populate). For these
// the list's order is part of the wanted state: nodes whose lists hold
// the same real servers in another order map the same client to other
// endpoints.
func (v VirtualServer) Ordered() bool {
	switch v.Scheduler {
	case "sh", "dh", "mh":
		return true
	}
	return false
}

func (v VirtualServer) String() string {
	s := fmt.Sprintf("%s %s", v.VSKey, v.Scheduler)
	if v.Flags&FlagsCompared != 0 {
		s += fmt.Sprintf(" flags=%#x", v.Flags&FlagsCompared)
	}
	if v.Flags&FlagPersistent != 0 {
		s += fmt.Sprintf(" persistent=%ds", v.Timeout)
	}
	return s
}

// RSKey identifies a real server within a virtual server.
type RSKey struct {
	Address netip.Addr
	Port    uint16
}

func (k RSKey) String() string { return netip.AddrPortFrom(k.Address, k.Port).String() }

// Forward is how IPVS sends a real server its packets.
type Forward uint8

// Forwarding methods. NAT (masquerading) is the default and what every
// clusterIP and node port uses; the tunnels carry a Service's external
// traffic straight to the endpoint, whose node answers the client directly
// (direct server return, proxier/DSR.md).
const (
	// ForwardNAT rewrites the destination to the real server (IPVS's MASQ).
	ForwardNAT Forward = iota
	// ForwardTunnel encapsulates the packet in IPIP to the real server's
	// address (IPVS's TUNNEL with tunnel type IPIP).
	ForwardTunnel
	// ForwardGUE encapsulates it in IPIP inside UDP (Generic UDP
	// Encapsulation) to RealServer.TunPort (IPVS's TUNNEL with type GUE).
	ForwardGUE
)

func (f Forward) String() string {
	switch f {
	case ForwardNAT:
		return "nat"
	case ForwardTunnel:
		return "tunnel"
	case ForwardGUE:
		return "gue"
	}
	return fmt.Sprintf("forward-%d", uint8(f))
}

// RealServer is one IPVS destination, masqueraded (NAT) unless Forward
// says otherwise.
type RealServer struct {
	RSKey
	// Weight, like the counters below, is 32 bits as the kernel's are:
	// with Drain and the forwarding fields (in this order) they fill the
	// 16 bytes after the key, and a real server takes 48 bytes, not 64,
	// in every plan and view of the kernel (TestRealServerSize).
	Weight int32
	// Drain marks a real server of a plan whose endpoint is in a slice but
	// no longer serves (terminating with serving false, or failing
	// readiness). Its weight is 0, and the kernel keeps it only while it
	// is busy: Diff never adds it, keeps it (at weight 0) while the kernel
	// counts connections on it, and deletes it once they reach 0, so that
	// established connections end on their own terms (expire_nodest_conn
	// would cut them at their next packet).
	Drain bool
	// Forward is the forwarding method; TunPort is GUE's UDP destination
	// port (0 for the other methods). Both are compared by Diff: a change
	// is an in-place update, which the kernel applies to new connections
	// only (a connection keeps the method it was made with).
	Forward Forward
	TunPort uint16
	// Read-only counters filled by List calls: IPVS's ActiveConn and
	// InActConn (UDP flows and closing TCP connections count as inactive).
	ActiveConns   int32
	InactiveConns int32
}

// Busy reports whether the kernel counts connections on the real server.
func (r RealServer) Busy() bool { return r.ActiveConns+r.InactiveConns > 0 }

// String shows the destination and its weight (a weight of 0 means
// draining: no new connections), and the Drain marking.
func (r RealServer) String() string {
	s := fmt.Sprintf("%s w=%d", r.RSKey, r.Weight)
	if r.Forward != ForwardNAT {
		s += " " + r.ForwardString()
	}
	if r.Drain {
		s += " drain"
	}
	return s
}

// ForwardString shows the forwarding method with GUE's port: "nat",
// "tunnel", "gue:6080".
func (r RealServer) ForwardString() string {
	if r.Forward == ForwardGUE {
		return fmt.Sprintf("gue:%d", r.TunPort)
	}
	return r.Forward.String()
}

// SameForward reports whether two real servers are forwarded alike: the
// same method and, for GUE, the same port (a port beside another method
// means nothing to the kernel).
func (r RealServer) SameForward(o RealServer) bool {
	return r.Forward == o.Forward && (r.Forward != ForwardGUE || r.TunPort == o.TunPort)
}

// Compare orders virtual servers by address, protocol, port.
func (k VSKey) Compare(o VSKey) int {
	if c := k.Address.Compare(o.Address); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Protocol, o.Protocol); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

// Compare orders real servers by address, port.
func (k RSKey) Compare(o RSKey) int {
	if c := k.Address.Compare(o.Address); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

// Stats are a virtual server's traffic counters as the kernel keeps them
// since the virtual server was created: connections scheduled, packets and
// bytes in (client to real server) and out. The kernel's connection and
// packet counters in the attributes read here are 32 bits wide and wrap.
type Stats struct {
	Connections, PacketsIn, PacketsOut uint64
	BytesIn, BytesOut                  uint64
}

// Add returns the sum of s and o.
func (s Stats) Add(o Stats) Stats {
	return Stats{Connections: s.Connections + o.Connections, PacketsIn: s.PacketsIn + o.PacketsIn,
		PacketsOut: s.PacketsOut + o.PacketsOut, BytesIn: s.BytesIn + o.BytesIn, BytesOut: s.BytesOut + o.BytesOut}
}

// Since is what the counters grew by from earlier ones of the same
// virtual server: each counter's difference, or the counter itself where
// it is below the earlier one (the virtual server was re-created, or a 32-
// bit counter wrapped: counted from 0 again).
func (s Stats) Since(earlier Stats) Stats {
	d := func(now, then uint64) uint64 {
		if now < then {
			return now
		}
		return now - then
	}
	return Stats{Connections: d(s.Connections, earlier.Connections), PacketsIn: d(s.PacketsIn, earlier.PacketsIn),
		PacketsOut: d(s.PacketsOut, earlier.PacketsOut), BytesIn: d(s.BytesIn, earlier.BytesIn), BytesOut: d(s.BytesOut, earlier.BytesOut)}
}
