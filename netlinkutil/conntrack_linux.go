package netlinkutil

import (
	"fmt"
	"net"

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
	// ClearUDP deletes the entries of UDP flows to the virtual server
	// that were sent to the real server (to any real server when rs is
	// zero), and returns how many it deleted.
	ClearUDP(vs ktypes.VSKey, rs ktypes.RSKey) (uint, error)
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

func (c *kernelConntrack) ClearUDP(vs ktypes.VSKey, rs ktypes.RSKey) (uint, error) {
	f := &netlink.ConntrackFilter{}
	errs := []error{
		f.AddProtocol(unix.IPPROTO_UDP),
		f.AddIP(netlink.ConntrackOrigDstIP, net.IP(vs.Address.AsSlice())),
		f.AddPort(netlink.ConntrackOrigDstPort, vs.Port),
	}
	if rs.Address.IsValid() {
		errs = append(errs, f.AddIP(netlink.ConntrackReplySrcIP, net.IP(rs.Address.AsSlice())))
	}
	for _, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("conntrack filter for %s -> %s: %w", vs, rs, err)
		}
	}
	family := netlink.InetFamily(unix.AF_INET)
	if vs.Address.Is6() {
		family = unix.AF_INET6
	}
	n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, family, f)
	if err != nil {
		return n, fmt.Errorf("delete conntrack entries of UDP %s -> %s: %w", vs, rs, err)
	}
	return n, nil
}
