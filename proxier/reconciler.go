package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// SyncStats describes one sync.
type SyncStats struct {
	Full     bool
	Services int // Services applied
	Writes   int // netlink writes (IPVS and addresses)
	Reads    int // netlink dumps
	Duration time.Duration
}

// Reconciler applies ServicePlans to the kernel. It keeps the desired plans,
// a view of the owned part of the kernel (read in bulk on a full sync and
// kept current by its own writes), and applies only differences. It is not
// safe for concurrent use; the proxier's sync loop owns it.
type Reconciler struct {
	ipvs      netlinkutil.IPVS
	links     netlinkutil.Links
	conntrack netlinkutil.Conntrack // optional
	own       model.Ownership
	log       *zap.Logger

	plans     map[types.NamespacedName]model.ServicePlan
	owner     map[model.VSKey]types.NamespacedName // which Service holds each VS
	held      map[types.NamespacedName]map[model.VSKey]bool
	conflicts map[model.VSKey][]types.NamespacedName
	dirty     map[types.NamespacedName]bool

	// Reference counts over all plans, kept by SetPlan, so that a partial
	// sync costs what changed, not the number of Services.
	wantVS   map[model.VSKey]int
	wantAddr map[netip.Addr]int  // addresses to bind
	touched  map[netip.Addr]bool // wantAddr changed since the last sync

	kernel           map[model.VSKey]model.VirtualServer // owned VSs in the kernel
	bound            map[netip.Addr]bool                 // addresses on the dummy
	vsCount, rsCount int                                 // over all plans

	// unavailable holds the schedulers the kernel refused (ENOENT on add
	// or update: no module ip_vs_<name>).
	unavailable map[string]bool

	// failed is set when a write failed: the next sync must be full.
	failed bool
	synced bool // a full sync has completed once
}

// NewReconciler returns a reconciler with no desired state; its first sync
// is full.
func NewReconciler(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership, log *zap.Logger) *Reconciler {
	return &Reconciler{
		ipvs: ipvs, links: links, own: own, log: log,
		plans:     map[types.NamespacedName]model.ServicePlan{},
		owner:     map[model.VSKey]types.NamespacedName{},
		held:      map[types.NamespacedName]map[model.VSKey]bool{},
		conflicts: map[model.VSKey][]types.NamespacedName{},
		wantVS:    map[model.VSKey]int{},
		wantAddr:  map[netip.Addr]int{},
		touched:   map[netip.Addr]bool{},
		dirty:     map[types.NamespacedName]bool{},
		kernel:    map[model.VSKey]model.VirtualServer{},
		bound:     map[netip.Addr]bool{},
	}
}

// SetPlan records the desired plan of a Service; nil removes the Service.
// Nothing reaches the kernel before the next Sync.
func (r *Reconciler) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	old, had := r.plans[name]
	if had {
		r.count(old, -1)
	}
	defer func() {
		if p, ok := r.plans[name]; ok {
			r.count(p, 1)
		}
	}()
	if plan == nil {
		if !had {
			return
		}
		delete(r.plans, name)
	} else {
		if had && planEqual(old, *plan) {
			return
		}
		r.plans[name] = *plan
	}
	r.dirty[name] = true
}

// count adds (sign 1) or removes (sign -1) a plan's references.
func (r *Reconciler) count(p model.ServicePlan, sign int) {
	r.vsCount += sign * len(p.VirtualServers)
	for _, v := range p.VirtualServers {
		r.rsCount += sign * len(v.RealServers)
		if r.wantVS[v.VSKey] += sign; r.wantVS[v.VSKey] <= 0 {
			delete(r.wantVS, v.VSKey)
		}
		if v.Kind.Bound() && !r.own.Excluded(v.Address) {
			if r.wantAddr[v.Address] += sign; r.wantAddr[v.Address] <= 0 {
				delete(r.wantAddr, v.Address)
			}
			r.touched[v.Address] = true
		}
	}
}

// Counts returns the numbers of virtual and real servers the plans want.
func (r *Reconciler) Counts() (virtualServers, realServers int) { return r.vsCount, r.rsCount }

// Plan returns the desired plan of a Service.
func (r *Reconciler) Plan(name types.NamespacedName) (model.ServicePlan, bool) {
	p, ok := r.plans[name]
	return p, ok
}

// Plans returns every desired plan, sorted by Service name.
func (r *Reconciler) Plans() []model.ServicePlan {
	out := make([]model.ServicePlan, 0, len(r.plans))
	for _, p := range r.plans {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Service.String() < out[j].Service.String() })
	return out
}

// Pending reports whether a sync has work to do.
func (r *Reconciler) Pending() bool { return len(r.dirty) > 0 || r.failed || !r.synced }

// ForceFull makes the next Sync a full one.
func (r *Reconciler) ForceFull() { r.failed = true }

// Sync applies what changed since the last sync; it reads the kernel in bulk
// and repairs everything when full is set, when a previous write failed, or
// before the first full sync. The error joins every failed write; the
// Services whose writes succeeded are programmed regardless.
func (r *Reconciler) Sync(full bool) (SyncStats, error) {
	start := time.Now()
	full = full || r.failed || !r.synced
	st := SyncStats{Full: full}
	var errs []error
	var names []types.NamespacedName
	if full {
		if err := r.readKernel(&st); err != nil {
			r.failed = true
			st.Duration = time.Since(start)
			return st, err
		}
		names = make([]types.NamespacedName, 0, len(r.plans))
		for n := range r.plans {
			names = append(names, n)
		}
	} else {
		for n := range r.dirty {
			names = append(names, n)
		}
	}
	// Applying may mark other Services dirty (a released conflict); those
	// are left for the next sync.
	clear(r.dirty)
	sort.Slice(names, func(i, j int) bool { return names[i].String() < names[j].String() })

	// Addresses first, so that every VS being added is on an owned address.
	errs = append(errs, r.bindAddresses(&st, full)...)
	for _, n := range names {
		if err := r.applyService(n, &st); err != nil {
			errs = append(errs, fmt.Errorf("service %s: %w", n, err))
		}
	}
	if full {
		errs = append(errs, r.pruneVirtualServers(&st)...)
	}
	errs = append(errs, r.unbindAddresses(&st, full)...)
	clear(r.touched)

	err := errors.Join(errs...)
	r.failed = err != nil
	if full && err == nil {
		r.synced = true
	}
	st.Services = len(names)
	st.Duration = time.Since(start)
	return st, err
}

// readKernel replaces the view of the kernel with one dump of virtual
// servers and one of the dummy's addresses.
func (r *Reconciler) readKernel(st *SyncStats) error {
	if err := r.links.EnsureDummy(r.own.Interface); err != nil {
		return fmt.Errorf("ensure interface %s: %w", r.own.Interface, err)
	}
	bound, err := r.links.ListAddresses(r.own.Interface)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", r.own.Interface, err)
	}
	nodeAddrs, err := r.links.NodeAddresses(r.own.Interface)
	if err != nil {
		return fmt.Errorf("list node addresses: %w", err)
	}
	vss, err := r.ipvs.ListVirtualServers()
	if err != nil {
		return fmt.Errorf("list IPVS services: %w", err)
	}
	st.Reads += 4
	clear(r.bound)
	for _, a := range bound {
		// The kernel's own link-local address of the interface is not ours.
		if !r.own.Excluded(a) && !a.IsLinkLocalUnicast() {
			r.bound[a] = true
		}
	}
	node := map[netip.Addr]bool{}
	for _, a := range nodeAddrs {
		node[a] = true
	}
	// Rebuild the owner index from the desired plans, so that a conflict
	// lost earlier can be won now that its holder is gone.
	clear(r.owner)
	clear(r.held)
	clear(r.conflicts)
	clear(r.kernel)
	for _, vs := range vss {
		a := vs.Address
		if r.own.Owns(vs.VSKey, r.bound[a], node[a]) || r.wantVS[vs.VSKey] > 0 {
			r.kernel[vs.VSKey] = vs
		}
	}
	return nil
}

// bindAddresses binds the wanted addresses that are not bound: all of them
// on a full sync, those whose plans changed on a partial one.
func (r *Reconciler) bindAddresses(st *SyncStats, full bool) []error {
	var errs []error
	var addrs []netip.Addr
	if full {
		for a := range r.wantAddr {
			if !r.bound[a] {
				addrs = append(addrs, a)
			}
		}
	} else {
		for a := range r.touched {
			if r.wantAddr[a] > 0 && !r.bound[a] {
				addrs = append(addrs, a)
			}
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		if err := r.write(st, "bind", a, func() error { return r.links.AddAddress(r.own.Interface, a) }); err != nil {
			errs = append(errs, err)
			continue
		}
		r.bound[a] = true
	}
	return errs
}

// unbindAddresses unbinds the bound addresses no plan wants: all of them on
// a full sync, those whose plans changed on a partial one. An address that
// still carries a virtual server (a failed delete) stays bound, so that the
// virtual server stays owned and the next full sync deletes it.
func (r *Reconciler) unbindAddresses(st *SyncStats, full bool) []error {
	var errs []error
	var addrs []netip.Addr
	candidates := r.touched
	if full {
		candidates = r.bound
	}
	for a := range candidates {
		if r.bound[a] && r.wantAddr[a] == 0 {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	inUse := map[netip.Addr]bool{}
	for k := range r.kernel {
		inUse[k.Address] = true
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		if inUse[a] {
			continue
		}
		if err := r.write(st, "unbind", a, func() error { return r.links.DeleteAddress(r.own.Interface, a) }); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.bound, a)
	}
	return errs
}

// applyService makes the kernel hold exactly the Service's plan: it claims,
// adds or updates its virtual servers, diffs their real servers against a
// fresh read of the kernel, and deletes the virtual servers it no longer
// wants.
func (r *Reconciler) applyService(name types.NamespacedName, st *SyncStats) error {
	plan, exists := r.plans[name]
	var errs []error
	want := map[model.VSKey]bool{}
	if exists {
		for _, vs := range plan.VirtualServers {
			if r.own.Excluded(vs.Address) {
				continue
			}
			if holder, ok := r.owner[vs.VSKey]; ok && holder != name {
				if !slices.Contains(r.conflicts[vs.VSKey], name) {
					r.conflicts[vs.VSKey] = append(r.conflicts[vs.VSKey], name)
					r.log.Warn("virtual server already belongs to another Service",
						zap.String("service", name.String()), zap.Stringer("virtualServer", vs.VSKey),
						zap.String("holder", holder.String()))
				}
				continue
			}
			r.owner[vs.VSKey] = name
			if r.held[name] == nil {
				r.held[name] = map[model.VSKey]bool{}
			}
			r.held[name][vs.VSKey] = true
			want[vs.VSKey] = true
			if err := r.applyVirtualServer(vs, st); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Release what the Service held and no longer wants.
	for k := range r.held[name] {
		if want[k] {
			continue
		}
		delete(r.held[name], k)
		delete(r.owner, k)
		if _, ok := r.kernel[k]; ok {
			if err := r.write(st, "delete virtual server", k, func() error { return r.ipvs.DeleteVirtualServer(k) }); err != nil {
				errs = append(errs, err)
			} else {
				delete(r.kernel, k)
			}
		}
		// A Service that lost this VS in a conflict may have it now.
		for _, other := range r.conflicts[k] {
			r.dirty[other] = true
		}
		delete(r.conflicts, k)
	}
	if len(r.held[name]) == 0 {
		delete(r.held, name)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) applyVirtualServer(vs model.VSPlan, st *SyncStats) error {
	cur, inKernel := r.kernel[vs.VSKey]
	var have []model.RealServer
	switch {
	case !inKernel:
		if err := r.write(st, "add virtual server", vs.VirtualServer, func() error { return r.ipvs.AddVirtualServer(vs.VirtualServer) }); err != nil {
			r.noteScheduler(vs.Scheduler, err)
			return err
		}
		r.kernel[vs.VSKey] = vs.VirtualServer
	default:
		if !cur.Equal(vs.VirtualServer) {
			if err := r.write(st, "update virtual server", vs.VirtualServer, func() error { return r.ipvs.UpdateVirtualServer(vs.VirtualServer) }); err != nil {
				r.noteScheduler(vs.Scheduler, err)
				return err
			}
			r.kernel[vs.VSKey] = vs.VirtualServer
		}
		st.Reads++
		var err error
		if have, err = r.ipvs.ListRealServers(vs.VSKey); err != nil {
			return err
		}
	}
	return r.applyRealServers(vs, have, st)
}

func (r *Reconciler) applyRealServers(vs model.VSPlan, have []model.RealServer, st *SyncStats) error {
	var errs []error
	cur := make(map[model.RSKey]model.RealServer, len(have))
	for _, rs := range have {
		cur[rs.RSKey] = rs
	}
	for _, rs := range vs.RealServers {
		old, ok := cur[rs.RSKey]
		delete(cur, rs.RSKey)
		switch {
		case !ok:
			if err := r.write(st, "add real server to "+vs.VSKey.String(), rs.RSKey, func() error { return r.ipvs.AddRealServer(vs.VSKey, rs) }); err != nil {
				errs = append(errs, err)
			}
		case old.Weight != rs.Weight:
			if err := r.write(st, "update real server of "+vs.VSKey.String(), rs.RSKey, func() error { return r.ipvs.UpdateRealServer(vs.VSKey, rs) }); err != nil {
				errs = append(errs, err)
			}
		}
	}
	gone := make([]model.RSKey, 0, len(cur))
	for k := range cur {
		gone = append(gone, k)
	}
	slices.SortFunc(gone, model.RSKey.Compare)
	for _, k := range gone {
		if err := r.write(st, "delete real server of "+vs.VSKey.String(), k, func() error { return r.ipvs.DeleteRealServer(vs.VSKey, k) }); err != nil {
			errs = append(errs, err)
			continue
		}
		if vs.Protocol == model.UDP {
			r.clearUDP(vs.VSKey, k)
		}
	}
	return errors.Join(errs...)
}

// clearUDP deletes the conntrack entries of UDP flows to a real server just
// removed, so that a client that keeps its source port reaches the
// remaining ones instead of the old one's stale entry. A failure is logged,
// not retried: the entries time out (--ipvs-udp-timeout) on their own.
func (r *Reconciler) clearUDP(vs model.VSKey, rs model.RSKey) {
	if r.conntrack == nil {
		return
	}
	n, err := r.conntrack.ClearUDP(vs, rs)
	if err != nil {
		r.log.Warn("clear conntrack entries of a removed UDP real server", zap.Stringer("virtualServer", vs),
			zap.Stringer("realServer", rs), zap.Error(err))
		return
	}
	if ce := r.log.Check(zap.DebugLevel, "cleared conntrack entries"); ce != nil {
		ce.Write(zap.Stringer("virtualServer", vs), zap.Stringer("realServer", rs), zap.Uint("entries", n))
	}
}

// SetConntrack makes the reconciler clear the conntrack entries of removed
// UDP real servers (nil: it does not).
func (r *Reconciler) SetConntrack(c netlinkutil.Conntrack) { r.conntrack = c }

// pruneVirtualServers deletes owned virtual servers that no Service holds.
func (r *Reconciler) pruneVirtualServers(st *SyncStats) []error {
	var errs []error
	keys := make([]model.VSKey, 0)
	for k := range r.kernel {
		if _, held := r.owner[k]; !held {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, model.VSKey.Compare)
	for _, k := range keys {
		if err := r.write(st, "delete virtual server", k, func() error { return r.ipvs.DeleteVirtualServer(k) }); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.kernel, k)
	}
	return errs
}

func planEqual(a, b model.ServicePlan) bool {
	if a.Service != b.Service || len(a.VirtualServers) != len(b.VirtualServers) || !slices.Equal(a.Warnings, b.Warnings) ||
		a.HealthCheckNodePort != b.HealthCheckNodePort || a.LocalEndpoints != b.LocalEndpoints {
		return false
	}
	for i := range a.VirtualServers {
		x, y := a.VirtualServers[i], b.VirtualServers[i]
		if !x.VirtualServer.Equal(y.VirtualServer) || x.Kind != y.Kind || x.PortName != y.PortName ||
			x.Local != y.Local || !slices.Equal(x.SourceRanges, y.SourceRanges) ||
			!slices.EqualFunc(x.RealServers, y.RealServers, func(p, q model.RealServer) bool {
				return p.RSKey == q.RSKey && p.Weight == q.Weight
			}) {
			return false
		}
	}
	return true
}

// noteScheduler remembers a scheduler that the kernel refused.
func (r *Reconciler) noteScheduler(name string, err error) {
	if !netlinkutil.SchedulerUnavailable(err) || r.unavailable[name] {
		return
	}
	if r.unavailable == nil {
		r.unavailable = map[string]bool{}
	}
	r.unavailable[name] = true
	r.log.Warn("the kernel has no such IPVS scheduler", zap.String("scheduler", name), zap.Error(err))
}

// UnavailableSchedulers lists, sorted, the schedulers that the kernel
// refused since the reconciler started.
func (r *Reconciler) UnavailableSchedulers() []string {
	out := make([]string, 0, len(r.unavailable))
	for n := range r.unavailable {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// write makes one kernel write, counting it and logging it at debug level.
func (r *Reconciler) write(st *SyncStats, op string, obj fmt.Stringer, fn func() error) error {
	st.Writes++
	err := fn()
	if ce := r.log.Check(zap.DebugLevel, "kernel write"); ce != nil {
		ce.Write(zap.String("op", op), zap.Stringer("object", obj), zap.Error(err))
	}
	return err
}
