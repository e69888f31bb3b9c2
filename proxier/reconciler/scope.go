package reconciler

// A sync's scope: the virtual servers, addresses and Services it looks at.

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// scopeSet is a scope being gathered.
type scopeSet struct {
	services map[types.NamespacedName]bool
	keys     map[ktypes.VSKey]bool
	addrs    map[netip.Addr]bool
}

// scope lists the virtual servers, addresses and Services a sync looks at,
// and clears what it takes of the dirty sets. full takes everything
// (scopeWhole); else what changed, the due retries and the next slice of
// a running resync (and, when adopting a resync's read, the routed
// ranges' anchors, which go beside the routes). Changes go first: a sync
// with changes in scope takes no slice, unless the sync before it took
// none either (the resync still ends under constant changes); the slice
// follows at once.
func (r *Reconciler) scope(full bool, now time.Time, adopting bool) ([]ktypes.VSKey, []netip.Addr, []types.NamespacedName) {
	if full {
		keys, addrs, services := r.scopeWhole()
		r.dirtyKeys = emptied(r.dirtyKeys)
		r.dirtyAddrs = emptied(r.dirtyAddrs)
		r.dirtyServices = emptied(r.dirtyServices)
		return keys, addrs, services
	}
	sc := &scopeSet{services: map[types.NamespacedName]bool{}, keys: map[ktypes.VSKey]bool{}, addrs: map[netip.Addr]bool{}}
	if adopting {
		for a := range model.Anchors(r.routes) {
			sc.addrs[a] = true
		}
		r.resync.takeFirst(sc)
	}
	if r.draining.due(now) {
		r.draining.takeInto(sc)
	}
	changed := len(r.dirtyServices) > 0 || len(r.dirtyKeys) > 0 || len(r.dirtyAddrs) > 0
	if changed && !adopting && !r.resync.yielded && r.resync.running() {
		r.resync.yielded = true
	} else {
		r.resync.yielded = false
		r.resync.nextSlice(r.cfg.ResyncSlice, sc)
	}
	r.scopeChanged(sc, now)
	r.dirtyKeys = emptied(r.dirtyKeys)
	r.dirtyAddrs = emptied(r.dirtyAddrs)
	r.dirtyServices = emptied(r.dirtyServices)
	r.scopeHolders(sc)
	keys, addrs := sc.sorted()
	return keys, addrs, slices.Collect(maps.Keys(sc.services))
}

// scopeWhole lists everything, each once and sorted (the Services
// unsorted): every Service (those removed too), every virtual server
// wanted, in the kernel's view or draining, and every address wanted,
// bound, a range's anchor or a virtual server's; the orphans' retries are
// in it. It sorts lists instead of gathering sets: at 100,000 Services a
// set cost a write per entry into a table larger than the CPU's caches.
func (r *Reconciler) scopeWhole() ([]ktypes.VSKey, []netip.Addr, []types.NamespacedName) {
	services := make([]types.NamespacedName, 0, len(r.claims.plans)+len(r.dirtyServices))
	for n := range r.claims.plans {
		services = append(services, n)
	}
	for n := range r.dirtyServices {
		if r.claims.plans[n] == nil { // removed
			services = append(services, n)
		}
	}
	keys := make([]ktypes.VSKey, 0, len(r.claims.byKey)+len(r.draining.keys))
	for k := range r.claims.byKey {
		keys = append(keys, k)
	}
	for k := range r.kernel.VirtualServers {
		if !r.claims.wanted(k) {
			keys = append(keys, k)
		}
	}
	keys = append(keys, r.draining.take()...)
	slices.SortFunc(keys, ktypes.VSKey.Compare)
	keys = slices.Compact(keys)
	r.orphan.clear()

	addrs := make([]netip.Addr, 0, len(r.claims.addrs)+len(r.kernel.Bound))
	for a := range r.claims.addrs {
		addrs = append(addrs, a)
	}
	for a := range r.kernel.Bound {
		if r.claims.addrs[a] == 0 {
			addrs = append(addrs, a)
		}
	}
	for a := range model.Anchors(r.routes) {
		addrs = append(addrs, a)
	}
	for i, k := range keys {
		if i == 0 || k.Address != keys[i-1].Address {
			addrs = append(addrs, k.Address)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return keys, slices.Compact(addrs), services
}

// scopeChanged takes what changed since the last sync and the retries that
// are due: failed Services (their virtual servers) and orphans. A changed
// Service that is failing comes whole (its virtual servers that did not
// change too), so that its status says all of it.
func (r *Reconciler) scopeChanged(sc *scopeSet, now time.Time) {
	whole := func(n types.NamespacedName) {
		sc.services[n] = true
		if p := r.claims.plans[n]; p != nil {
			for _, v := range p.VirtualServers {
				sc.keys[v.VSKey] = true
			}
		}
	}
	for n := range r.dirtyServices {
		if _, failing := r.statuses.retrying[n]; failing {
			whole(n)
		} else {
			sc.services[n] = true
		}
	}
	for _, n := range r.statuses.due(now) {
		whole(n)
	}
	for k := range r.dirtyKeys {
		sc.keys[k] = true
	}
	for a := range r.dirtyAddrs {
		sc.addrs[a] = true
	}
	if r.orphan.Due(now) {
		r.orphan.takeInto(sc)
	}
}

// scopeHolders adds the holder of each virtual server in a partial
// scope: it answers for what happens to its virtual servers. A failing
// one comes whole, so that its status says all of it.
func (r *Reconciler) scopeHolders(sc *scopeSet) {
	var whole []types.NamespacedName
	for k := range sc.keys {
		if cl := r.claims.byKey[k]; len(cl) > 0 && !sc.services[cl[0]] {
			sc.services[cl[0]] = true
			if _, failing := r.statuses.retrying[cl[0]]; failing {
				whole = append(whole, cl[0])
			}
		}
	}
	for _, n := range whole {
		for _, v := range r.claims.plans[n].VirtualServers {
			if !sc.keys[v.VSKey] {
				sc.keys[v.VSKey] = true
				if cl := r.claims.byKey[v.VSKey]; len(cl) > 0 {
					sc.services[cl[0]] = true
				}
			}
		}
	}
}

// sorted returns the scope's virtual servers and addresses (with the
// virtual servers' own), sorted.
func (sc *scopeSet) sorted() ([]ktypes.VSKey, []netip.Addr) {
	keys := make([]ktypes.VSKey, 0, len(sc.keys))
	for k := range sc.keys {
		keys = append(keys, k)
		sc.addrs[k.Address] = true
	}
	addrs := make([]netip.Addr, 0, len(sc.addrs))
	for a := range sc.addrs {
		addrs = append(addrs, a)
	}
	slices.SortFunc(keys, ktypes.VSKey.Compare)
	slices.SortFunc(addrs, netip.Addr.Compare)
	return keys, addrs
}
