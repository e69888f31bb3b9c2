package proxier

// The claims index: which Services want each virtual server and address
// (the oldest holds a virtual server: model.Precedes), kept current as
// plans change.

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// claim adds (sign 1) or removes (sign -1) a plan's claims on virtual
// servers and addresses, marking what it touches dirty.
func (r *Reconciler) claim(name types.NamespacedName, p *model.ServicePlan, sign int) {
	r.vsCount += sign * len(p.VirtualServers)
	for _, v := range p.VirtualServers {
		for _, rs := range v.RealServers {
			if !rs.Drain { // not programmed unless busy
				r.rsCount += sign
			}
		}
		if r.own.Excluded(v.Address) {
			continue
		}
		k := v.VSKey
		r.dirtyKeys[k] = true
		cl := slices.DeleteFunc(r.claims[k], func(n types.NamespacedName) bool { return n == name })
		if sign > 0 {
			i, _ := slices.BinarySearchFunc(cl, p, func(n types.NamespacedName, p *model.ServicePlan) int {
				if model.Precedes(r.plans[n], p) {
					return -1
				}
				return 1
			})
			cl = slices.Insert(cl, i, name)
		}
		if len(cl) == 0 {
			delete(r.claims, k)
		} else {
			r.claims[k] = cl
		}
		for _, n := range cl {
			r.conflictChanged[n] = true
		}
		if v.Kind.Bound() {
			if r.wantAddr[v.Address] += sign; r.wantAddr[v.Address] <= 0 {
				delete(r.wantAddr, v.Address)
			}
			r.dirtyAddrs[v.Address] = true
		}
	}
}

// holder returns the Service that holds a virtual server and its plan of
// it.
func (r *Reconciler) holder(k model.VSKey) (model.Want, bool) {
	cl := r.claims[k]
	if len(cl) == 0 {
		return model.Want{}, false
	}
	p := r.plans[cl[0]]
	i, found := slices.BinarySearchFunc(p.VirtualServers, k, func(v model.VSPlan, k model.VSKey) int { return v.VSKey.Compare(k) })
	if !found { // plans are sorted by Build; a hand-made one may not be
		i = slices.IndexFunc(p.VirtualServers, func(v model.VSPlan) bool { return v.VSKey == k })
	}
	return model.Want{Service: cl[0], VSPlan: p.VirtualServers[i]}, true
}

// desired is the part of the desired state that the scope looks at.
func (r *Reconciler) desired(keys []model.VSKey, addrs []netip.Addr) model.Desired {
	d := model.Desired{VirtualServers: make(map[model.VSKey]model.Want, len(keys)), Addresses: map[netip.Addr]bool{}}
	for _, k := range keys {
		if w, ok := r.holder(k); ok {
			d.VirtualServers[k] = w
		}
	}
	for _, a := range addrs {
		if r.wantAddr[a] > 0 {
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
		x, y := a.VirtualServers[i], b.VirtualServers[i]
		if !x.VirtualServer.Equal(y.VirtualServer) || x.Kind != y.Kind || x.PortName != y.PortName ||
			x.Local != y.Local || !slices.Equal(x.SourceRanges, y.SourceRanges) ||
			!slices.EqualFunc(x.RealServers, y.RealServers, func(p, q model.RealServer) bool {
				return p.RSKey == q.RSKey && p.Weight == q.Weight && p.Drain == q.Drain
			}) {
			return false
		}
	}
	return true
}

// Counts returns the numbers of virtual and real servers the plans want.
func (r *Reconciler) Counts() (virtualServers, realServers int) { return r.vsCount, r.rsCount }
