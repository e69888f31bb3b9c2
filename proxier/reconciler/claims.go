package reconciler

// The claims index: which Services want each virtual server and address
// (the oldest holds a virtual server: model.Precedes), kept current as
// plans change.

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// claimIndex is the desired state, indexed for partial syncs: the plans,
// the Services that claim each virtual server (by precedence: [0] holds
// it, model.Precedes), the addresses to bind (by reference count) and the
// numbers of virtual and real servers the plans want (those on excluded
// addresses too: they are wanted as any other).
type claimIndex struct {
	plans            map[types.NamespacedName]*model.ServicePlan
	byKey            map[ktypes.VSKey][]types.NamespacedName
	addrs            map[netip.Addr]int
	vsCount, rsCount int
}

func newClaimIndex() claimIndex {
	return claimIndex{plans: map[types.NamespacedName]*model.ServicePlan{},
		byKey: map[ktypes.VSKey][]types.NamespacedName{}, addrs: map[netip.Addr]int{}}
}

// claim adds (sign 1) or removes (sign -1) the claims of a Service's plan
// (recorded in plans before it adds them) on virtual servers and
// addresses; key is told of each virtual server it touches, with its
// claimants now, and bound of each one whose address it binds.
func (c *claimIndex) claim(name types.NamespacedName, p *model.ServicePlan, sign int,
	key func(ktypes.VSKey, []types.NamespacedName), bound func(ktypes.VSKey)) {
	c.vsCount += sign * len(p.VirtualServers)
	for _, v := range p.VirtualServers {
		for _, rs := range v.RealServers {
			if !rs.Drain { // not programmed unless busy
				c.rsCount += sign
			}
		}
		k := v.VSKey
		cl := slices.DeleteFunc(c.byKey[k], func(n types.NamespacedName) bool { return n == name })
		if sign > 0 {
			i, _ := slices.BinarySearchFunc(cl, p, func(n types.NamespacedName, p *model.ServicePlan) int {
				if model.Precedes(c.plans[n], p) {
					return -1
				}
				return 1
			})
			cl = slices.Insert(cl, i, name)
		}
		if len(cl) == 0 {
			delete(c.byKey, k)
		} else {
			c.byKey[k] = cl
		}
		key(k, cl)
		if v.Bound() {
			if c.addrs[v.Address] += sign; c.addrs[v.Address] <= 0 {
				delete(c.addrs, v.Address)
			}
			bound(k)
		}
	}
}

// wanted reports whether a Service claims a virtual server.
func (c *claimIndex) wanted(k ktypes.VSKey) bool { return len(c.byKey[k]) > 0 }

// holder returns the Service that holds a virtual server and its plan of
// it.
func (c *claimIndex) holder(k ktypes.VSKey) (model.Want, bool) {
	cl := c.byKey[k]
	if len(cl) == 0 {
		return model.Want{}, false
	}
	p := c.plans[cl[0]]
	i, found := slices.BinarySearchFunc(p.VirtualServers, k, func(v model.VSPlan, k ktypes.VSKey) int { return v.VSKey.Compare(k) })
	if !found { // plans are sorted by Build; a hand-made one may not be
		i = slices.IndexFunc(p.VirtualServers, func(v model.VSPlan) bool { return v.VSKey == k })
	}
	return model.Want{Service: cl[0], VSPlan: p.VirtualServers[i]}, true
}

// conflicts lists the virtual servers a Service (n, with its plan p)
// wants and another holds.
func (c *claimIndex) conflicts(n types.NamespacedName, p *model.ServicePlan) []model.Conflict {
	var cs []model.Conflict
	for _, v := range p.VirtualServers {
		if cl := c.byKey[v.VSKey]; len(cl) > 0 && cl[0] != n {
			cs = append(cs, model.Conflict{VirtualServer: v.VSKey, Holder: cl[0], Loser: n})
		}
	}
	return cs
}

// desired is the part of the desired state that the scope looks at.
func (r *Reconciler) desired(keys []ktypes.VSKey, addrs []netip.Addr) model.Desired {
	d := model.Desired{VirtualServers: make(map[ktypes.VSKey]model.Want, len(keys)), Addresses: make(map[netip.Addr]bool, len(addrs)),
		Routes: make(map[netip.Prefix]bool, len(r.routes)), Excluded: r.own.ExcludeCIDRs}
	for p := range r.routes {
		d.Route(p) // and its anchor bound
	}
	for _, k := range keys {
		if w, ok := r.claims.holder(k); ok {
			d.VirtualServers[k] = w
		}
	}
	for _, a := range addrs {
		if r.claims.addrs[a] > 0 {
			d.Addresses[a] = true
		}
	}
	return d
}

func planEqual(a, b model.ServicePlan) bool {
	if a.Service != b.Service || !a.Created.Equal(b.Created) || len(a.VirtualServers) != len(b.VirtualServers) ||
		!slices.Equal(a.Warnings, b.Warnings) || a.HealthCheckNodePort != b.HealthCheckNodePort || a.LocalEndpoints != b.LocalEndpoints {
		return false
	}
	for i := range a.VirtualServers {
		if !vsPlanEqual(a.VirtualServers[i], b.VirtualServers[i]) {
			return false
		}
	}
	return true
}

// vsPlanEqual reports whether two plans of a virtual server want the same
// of the kernel.
func vsPlanEqual(x, y model.VSPlan) bool {
	return x.VirtualServer.Equal(y.VirtualServer) && x.Kind == y.Kind && x.PortName == y.PortName &&
		x.Local == y.Local && x.NodeAddress == y.NodeAddress && x.Routed == y.Routed && x.InClusterOnly == y.InClusterOnly &&
		x.Forward == y.Forward && x.TunPort == y.TunPort && x.InClusterTo == y.InClusterTo &&
		slices.Equal(x.SourceRanges, y.SourceRanges) &&
		slices.EqualFunc(x.RealServers, y.RealServers, func(p, q ktypes.RealServer) bool {
			return p.RSKey == q.RSKey && p.Weight == q.Weight && p.Drain == q.Drain && p.SameForward(q)
		})
}

// unchangedKeys lists the virtual servers that a Service's new plan wants
// as its old one did: a sync need not look at them again (the kernel has
// them as the last sync left them; a failed write is retried by the
// Service's backoff, drift repaired by the resync). None when the Service
// was made again (model.Precedes orders claimants by Created), which may
// change who holds any of them.
func unchangedKeys(old, plan *model.ServicePlan) map[ktypes.VSKey]bool {
	if !old.Created.Equal(plan.Created) {
		return nil
	}
	before := make(map[ktypes.VSKey]int, len(old.VirtualServers))
	for i, v := range old.VirtualServers {
		before[v.VSKey] = i
	}
	same := make(map[ktypes.VSKey]bool, len(plan.VirtualServers))
	for _, v := range plan.VirtualServers {
		if i, ok := before[v.VSKey]; ok && vsPlanEqual(old.VirtualServers[i], v) {
			same[v.VSKey] = true
		}
	}
	return same
}

// Counts returns the numbers of virtual and real servers the plans want.
func (r *Reconciler) Counts() (virtualServers, realServers int) {
	return r.claims.vsCount, r.claims.rsCount
}
