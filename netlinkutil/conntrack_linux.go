package netlinkutil

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Conntrack clears connection-tracking entries of UDP flows whose real
// server is gone. IPVS with net.ipv4.vs.conntrack=1 leaves a conntrack entry
// per flow whose reply direction names the old real server; a client that
// keeps its source port (DNS resolvers, QUIC, game clients) would keep
// matching it and be black-holed after the backend moved.
type Conntrack interface {
	// ClearUDP deletes the entries of the UDP flows that any of clears
	// names, reading the table once per address family whatever their
	// number (the kernel can only be asked for all of it), and returns
	// how many it deleted.
	ClearUDP(clears ...UDPClear) (uint, error)
}

// UDPClear names the UDP flows to the virtual server VS that were sent to
// the real server RS's address (to any real server when RS is zero).
type UDPClear struct {
	VS ktypes.VSKey
	RS ktypes.RSKey
}

func (c UDPClear) String() string {
	if !c.RS.Address.IsValid() {
		return c.VS.String() + " *"
	}
	return c.VS.String() + " " + c.RS.String()
}

type kernelConntrack struct {
	h *netlink.Handle
}

// NewConntrack opens a netfilter netlink socket in the current network
// namespace (the kernel needs nf_conntrack_netlink).
func NewConntrack() (Conntrack, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	return &kernelConntrack{h: h}, nil
}

func (c *kernelConntrack) ClearUDP(clears ...UDPClear) (uint, error) {
	var total uint
	var errs []error
	for _, fam := range []struct {
		v6     bool
		family netlink.InetFamily
	}{{false, unix.AF_INET}, {true, unix.AF_INET6}} {
		m := udpFlowsOf(clears, fam.v6)
		if len(m) == 0 {
			continue
		}
		n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam.family, m)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("delete conntrack entries of %d UDP virtual servers' flows: %w", len(m), err))
		}
	}
	return total, errors.Join(errs...)
}

// udpFlows matches the UDP flows a set of UDPClear names, by the virtual
// server they were sent to and the real server that answers them: one
// map lookup per entry of the table, whatever the number of clears.
type udpFlows map[ktypes.VSKey]map[netip.Addr]bool

// udpFlowsOf gathers the clears of one family; the zero address in a
// virtual server's set stands for every real server.
func udpFlowsOf(clears []UDPClear, v6 bool) udpFlows {
	m := udpFlows{}
	for _, c := range clears {
		if c.VS.Address.Is6() != v6 {
			continue
		}
		if m[c.VS] == nil {
			m[c.VS] = map[netip.Addr]bool{}
		}
		m[c.VS][c.RS.Address] = true // the zero Addr when RS is zero
	}
	return m
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (m udpFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok := netip.AddrFromSlice(f.Forward.DstIP)
	if !ok {
		return false
	}
	rs, ok := m[ktypes.VSKey{Address: dst.Unmap(), Protocol: ktypes.UDP, Port: f.Forward.DstPort}]
	if !ok {
		return false
	}
	if rs[netip.Addr{}] {
		return true
	}
	src, ok := netip.AddrFromSlice(f.Reverse.SrcIP)
	return ok && rs[src.Unmap()]
}
