package model

import (
	"net/netip"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Ownership is the rule that tells ipvs-proxy's kernel objects from anyone
// else's. ipvs-proxy owns, and so may change or delete:
//   - every address bound to its dummy interface;
//   - every virtual server whose address is bound to that interface;
//   - every virtual server on one of the node's own addresses whose port lies
//     in the node-port range;
//   - every virtual server that a Service currently asks for.
//
// Nothing inside ExcludeCIDRs is owned unless a Service asks for it: what
// no Service asks for there is never deleted nor unbound (kube-proxy's
// meaning; Desired.Excluded). Everything else in the kernel (virtual
// servers of other tools, fwmark services) is left untouched.
//
// When taking a node over from kube-proxy's IPVS mode, Adopt names its
// interface (kube-ipvs0): virtual servers on its addresses are owned as if
// they were bound to Interface, so that the ones ipvs-proxy wants are kept
// as they are (with their connections) and the others deleted.
type Ownership struct {
	Interface     string
	NodePortRange PortRange
	ExcludeCIDRs  []netip.Prefix
	Adopt         string
}

// KubeProxyInterface is the dummy interface of kube-proxy's IPVS mode: the
// one a takeover adopts, and `ipvs-proxy cleanup --kube-proxy` deletes.
const KubeProxyInterface = "kube-ipvs0"

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max uint16 }

// Contains reports whether p is in the range.
func (r PortRange) Contains(p uint16) bool { return p >= r.Min && p <= r.Max }

// Owns applies the rule to a virtual server in the kernel: bound says its
// address is on the interface, node that it is one of the node's addresses.
func (o Ownership) Owns(vs ktypes.VSKey, bound, node bool) bool {
	return !o.Excluded(vs.Address) && (bound || (node && o.NodePortRange.Contains(vs.Port)))
}

// Excluded reports whether a lies in ExcludeCIDRs: ipvs-proxy never cleans
// up virtual servers or addresses there that no Service asks for.
func (o Ownership) Excluded(a netip.Addr) bool {
	for _, p := range o.ExcludeCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
