package proxier

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// SyncStats describes one sync.
type SyncStats struct {
	Full     bool
	Services int // Services in the sync's scope
	Writes   int // netlink writes (IPVS and addresses)
	Reads    int // netlink dumps
	Duration time.Duration
	// Read is the part of Duration spent in a full sync's kernel read
	// (virtual servers, all real servers, addresses).
	Read time.Duration
	// Bind is the part of Duration spent binding addresses to the
	// interface (one netlink write each; the kernel's cost grows with the
	// addresses already there).
	Bind time.Duration
	// ReadOffLoop is the time a periodic resync's kernel read took off
	// the loop (Reconciler.StartResyncRead), not part of Duration; its
	// view was adopted by this sync.
	ReadOffLoop time.Duration
	// Applied lists the Services in scope whose every write succeeded;
	// Failed, those with a failed write or read, with the error.
	Applied []types.NamespacedName
	Failed  map[types.NamespacedName]error
	// ReadFailed: the full sync's kernel read failed, nothing was applied.
	ReadFailed bool
	// A periodic full resync runs in slices (see Reconciler.Sync):
	// ResyncLeft is the number of virtual servers it has still to check;
	// ResyncDone is set by the sync that checked the last ones, with
	// ResyncTook, the time from its kernel read to then.
	ResyncLeft int
	ResyncDone bool
	ResyncTook time.Duration
}

// ServiceStatus is what the reconciler knows of one Service.
type ServiceStatus struct {
	Service types.NamespacedName
	// Applied: the last attempt wrote everything the Service holds.
	Applied bool
	// Failures counts the attempts that failed in a row; the Service is
	// retried alone at NextRetry (an exponential backoff).
	Failures  int
	LastError string
	NextRetry time.Time
	// Conflicts are the virtual servers it wants and an older Service
	// holds.
	Conflicts []model.Conflict
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	Ownership model.Ownership
	// RetryBase is the first retry delay of a failed Service (then doubled
	// per failure up to RetryMax); defaults 1s and 1m.
	RetryBase, RetryMax time.Duration
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// ResyncSlice is the number of virtual servers a periodic full resync
	// checks per sync (their real servers read, compared and repaired);
	// default 500.
	ResyncSlice int
	// DrainCheck is how often the real servers kept only while busy
	// (model.RealServer.Drain) are read again, so that each goes soon
	// after its connections end; default 2s.
	DrainCheck time.Duration
}

// defaultDrainCheck is ReconcilerConfig.DrainCheck's default.
const defaultDrainCheck = 2 * time.Second

// backoff is one retry schedule: failures in a row and the next attempt.
type backoff struct {
	failures int
	next     time.Time
}

func (b *backoff) fail(now time.Time, base, max time.Duration) {
	b.failures++
	d := base
	for i := 1; i < b.failures && d < max; i++ {
		d *= 2
	}
	b.next = now.Add(min(d, max))
}

func (b *backoff) due(now time.Time) bool { return b.failures > 0 && !now.Before(b.next) }

// Reconciler applies ServicePlans to the kernel. It keeps the desired
// plans, an index of which Services claim each virtual server (the oldest
// holds it: model.Precedes), a view of the owned part of the kernel (read
// whole on a full sync, kept current by its own writes) and a status per
// Service. A sync diffs, with model.Diff, the virtual servers and addresses
// that changed (partial) or all of them (full), and applies the operations.
// A Service whose writes fail is retried alone with its own backoff; only a
// failed kernel read makes the next sync full. It is not safe for
// concurrent use; the proxier's sync loop owns it.
type Reconciler struct {
	ipvs      netlinkutil.IPVS
	links     netlinkutil.Links
	conntrack netlinkutil.Conntrack // optional
	cfg       ReconcilerConfig
	own       model.Ownership
	clock     clock.PassiveClock
	log       *zap.Logger

	plans    map[types.NamespacedName]*model.ServicePlan
	claims   map[model.VSKey][]types.NamespacedName // by precedence: [0] holds
	wantAddr map[netip.Addr]int                     // addresses to bind, by reference count
	kernel   *model.Kernel

	// What changed since the last sync.
	dirtyKeys     map[model.VSKey]bool
	dirtyAddrs    map[netip.Addr]bool
	dirtyServices map[types.NamespacedName]bool

	status          map[types.NamespacedName]*ServiceStatus
	retrying        map[types.NamespacedName]*backoff
	conflictChanged map[types.NamespacedName]bool
	conflicted      map[types.NamespacedName]bool // Services that lost a conflict

	// Writes no Service is answerable for (a virtual server no Service
	// wants, an address to unbind) that failed: retried with one backoff.
	orphan      backoff
	orphanKeys  map[model.VSKey]bool
	orphanAddrs map[netip.Addr]bool

	full   backoff // a failed kernel read: the next full sync
	lost   bool    // a write's answer was lost: the view may be wrong, read it again
	synced bool    // a full sync has completed once
	// The periodic full resync in progress: the virtual servers it has
	// still to check, in key order, when it read the kernel, and the real
	// servers its bulk read found for those not checked yet.
	resync      []model.VSKey
	resyncStart time.Time
	resyncRS    map[model.VSKey][]model.RealServer
	vsCount     int
	rsCount     int

	// The virtual servers that keep a busy real server marked Drain, and
	// when they are read again (zero: no check is scheduled).
	draining  map[model.VSKey]bool
	drainNext time.Time

	// unavailable holds the schedulers the kernel refused (ENOENT on add
	// or update: no module ip_vs_<name>).
	unavailable map[string]bool

	// The periodic resync's kernel read off the loop (StartResyncRead):
	// its own handles, whether one runs, the in-loop reads made before
	// it (readEpoch counts them: a read that started earlier than one is
	// stale), what the loop wrote since it started, and its result once
	// offered.
	reader    *resyncReader
	readEpoch uint64
	offLoop   *offLoopRead
	offered   *KernelRead
}

// resyncReader holds the handles a read off the loop uses, apart from the
// loop's own.
type resyncReader struct {
	ipvs  netlinkutil.IPVS
	links netlinkutil.Links
}

// offLoopRead is a read off the loop in progress: the virtual servers and
// addresses the loop wrote since it began, whose state in its result may
// be older than the loop's view.
type offLoopRead struct {
	epoch uint64
	keys  map[model.VSKey]bool
	addrs map[netip.Addr]bool
}

// KernelRead is the result of a read of the kernel made off the sync loop
// for a periodic resync (see Reconciler.StartResyncRead).
type KernelRead struct {
	raw   rawKernel
	rss   map[model.VSKey][]model.RealServer
	reads int
	took  time.Duration
	err   error
	epoch uint64
}

// NewReconciler returns a reconciler with no desired state; its first sync
// is full.
func NewReconciler(ipvs netlinkutil.IPVS, links netlinkutil.Links, cfg ReconcilerConfig, log *zap.Logger) *Reconciler {
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = time.Second
	}
	if cfg.RetryMax < cfg.RetryBase {
		cfg.RetryMax = max(time.Minute, cfg.RetryBase)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ResyncSlice <= 0 {
		cfg.ResyncSlice = 500
	}
	if cfg.DrainCheck <= 0 {
		cfg.DrainCheck = defaultDrainCheck
	}
	return &Reconciler{
		ipvs: ipvs, links: links, cfg: cfg, own: cfg.Ownership, clock: cfg.Clock, log: log,
		plans:           map[types.NamespacedName]*model.ServicePlan{},
		claims:          map[model.VSKey][]types.NamespacedName{},
		wantAddr:        map[netip.Addr]int{},
		kernel:          model.NewKernel(nil, nil),
		dirtyKeys:       map[model.VSKey]bool{},
		dirtyAddrs:      map[netip.Addr]bool{},
		dirtyServices:   map[types.NamespacedName]bool{},
		status:          map[types.NamespacedName]*ServiceStatus{},
		retrying:        map[types.NamespacedName]*backoff{},
		conflictChanged: map[types.NamespacedName]bool{},
		conflicted:      map[types.NamespacedName]bool{},
		orphanKeys:      map[model.VSKey]bool{},
		orphanAddrs:     map[netip.Addr]bool{},
		draining:        map[model.VSKey]bool{},
	}
}

// SetPlan records the desired plan of a Service; nil removes the Service.
// Nothing reaches the kernel before the next Sync.
func (r *Reconciler) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	old := r.plans[name]
	if plan != nil && old != nil && planEqual(*old, *plan) {
		return
	}
	if old != nil {
		r.claim(name, old, -1)
	}
	if plan == nil {
		if old == nil {
			return
		}
		delete(r.plans, name)
		delete(r.status, name)
		delete(r.retrying, name)
		delete(r.conflictChanged, name)
		delete(r.conflicted, name)
	} else {
		p := *plan
		r.plans[name] = &p
		r.claim(name, &p, 1)
		if r.status[name] == nil {
			r.status[name] = &ServiceStatus{Service: name}
		}
		r.conflictChanged[name] = true
	}
	r.dirtyServices[name] = true
}

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

// ConflictChanges returns, sorted, the Services whose conflicts changed
// since the last call; their Status holds the new ones.
func (r *Reconciler) ConflictChanges() []types.NamespacedName {
	var out []types.NamespacedName
	for n := range r.conflictChanged {
		st, p := r.status[n], r.plans[n]
		if st == nil || p == nil {
			continue
		}
		var cs []model.Conflict
		for _, v := range p.VirtualServers {
			if cl := r.claims[v.VSKey]; len(cl) > 0 && cl[0] != n {
				cs = append(cs, model.Conflict{VirtualServer: v.VSKey, Holder: cl[0], Loser: n})
			}
		}
		if !slices.Equal(cs, st.Conflicts) {
			st.Conflicts = cs
			out = append(out, n)
		}
		if len(cs) > 0 {
			r.conflicted[n] = true
		} else {
			delete(r.conflicted, n)
		}
	}
	r.conflictChanged = emptied(r.conflictChanged)
	slices.SortFunc(out, compareNames)
	return out
}

// emptied returns m empty: cleared in place when it is small, a new map
// when it held many entries. Go's maps never shrink, and clearing or
// iterating one costs its size at its largest: a set that held every
// Service once (a full sync) would make every later partial sync cost
// that much.
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > 64 {
		return make(map[K]V)
	}
	clear(m)
	return m
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// Status returns a Service's status.
func (r *Reconciler) Status(name types.NamespacedName) (ServiceStatus, bool) {
	st, ok := r.status[name]
	if !ok {
		return ServiceStatus{}, false
	}
	out := *st
	out.Conflicts = slices.Clone(st.Conflicts)
	return out, true
}

// Failing reports whether a Service's last attempt failed (it waits for a
// retry).
func (r *Reconciler) Failing(name types.NamespacedName) bool {
	_, ok := r.retrying[name]
	return ok
}

// Problems returns the status of every Service that is failing or lost a
// conflict, sorted by name; its cost is the number of such Services.
func (r *Reconciler) Problems() []ServiceStatus {
	names := map[types.NamespacedName]bool{}
	for n := range r.retrying {
		names[n] = true
	}
	for n := range r.conflicted {
		names[n] = true
	}
	out := make([]ServiceStatus, 0, len(names))
	for n := range names {
		if st, ok := r.Status(n); ok {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b ServiceStatus) int { return compareNames(a.Service, b.Service) })
	return out
}

// Counts returns the numbers of virtual and real servers the plans want.
func (r *Reconciler) Counts() (virtualServers, realServers int) { return r.vsCount, r.rsCount }

// FullDue reports whether the next sync must be full: no full sync has
// succeeded yet, or a failed kernel read's retry is due.
// AddressesRemoved takes the addresses that the kernel reports removed
// from the interface out of the view of the kernel, and returns how many
// it took: those still wanted are bound again by the next sync, a partial
// one. Removals of the reconciler's own unbinding find the view already
// without them and are ignored.
func (r *Reconciler) AddressesRemoved(addrs []netip.Addr) int {
	n := 0
	for _, a := range addrs {
		if !r.kernel.Bound[a] {
			continue
		}
		delete(r.kernel.Bound, a)
		r.dirtyAddrs[a] = true
		if r.offLoop != nil {
			r.offLoop.addrs[a] = true
		}
		n++
	}
	return n
}

// RequestFull makes the next sync full and whole (the interface was
// removed: it is created again, every address bound again).
func (r *Reconciler) RequestFull() {
	r.full.failures = max(r.full.failures, 1)
	r.full.next = r.clock.Now()
}

func (r *Reconciler) FullDue() bool { return !r.synced || r.full.due(r.clock.Now()) }

// Pending reports whether a sync now has work to do.
func (r *Reconciler) Pending() bool {
	now := r.clock.Now()
	if !r.synced || r.full.due(now) || r.orphan.due(now) || len(r.resync) > 0 || r.drainDue(now) ||
		len(r.dirtyKeys) > 0 || len(r.dirtyAddrs) > 0 || len(r.dirtyServices) > 0 {
		return true
	}
	for _, b := range r.retrying {
		if b.due(now) {
			return true
		}
	}
	return false
}

// drainDue reports whether the check of the draining real servers is due.
func (r *Reconciler) drainDue(now time.Time) bool {
	return !r.drainNext.IsZero() && !now.Before(r.drainNext)
}

// NextRetry is when the earliest retry (of a failed Service, of a failed
// kernel read, of other failed writes) or the next check of the real
// servers kept while busy is due; zero when none waits.
func (r *Reconciler) NextRetry() time.Time {
	next := r.drainNext
	consider := func(b *backoff) {
		if b.failures > 0 && (next.IsZero() || b.next.Before(next)) {
			next = b.next
		}
	}
	consider(&r.full)
	consider(&r.orphan)
	for _, b := range r.retrying {
		consider(b)
	}
	return next
}

// Resyncing reports whether a periodic full resync is in progress: the
// next syncs check its remaining virtual servers.
func (r *Reconciler) Resyncing() bool { return len(r.resync) > 0 }

// Sync applies what changed since the last sync, and the retries that are
// due. It is full (reads the kernel whole and repairs everything) when
// full is set, before the first full sync has succeeded, and when a kernel
// read failed and its retry is due. The error joins every failure; the
// Services whose writes succeeded are programmed regardless.
//
// A full sync asked for once the kernel has been programmed (the periodic
// resync) runs in slices, so that it never holds a change up for long: it
// reads the virtual servers and addresses whole and repairs the addresses,
// then it and each following sync check ResyncSlice virtual servers (read
// their real servers, repair them) besides what changed, until all are
// checked. Asking for a full sync while one runs continues it.
func (r *Reconciler) Sync(full bool) (SyncStats, error) {
	start := r.clock.Now()
	now := start
	sliced := full && r.synced && !r.full.due(now)
	full = full || !r.synced || r.full.due(now)
	if sliced && len(r.resync) > 0 {
		full, sliced = false, false // one resync at a time: continue it
	}
	st := SyncStats{Full: full, Failed: map[types.NamespacedName]error{}}
	var offered *KernelRead
	switch {
	case full && sliced:
		offered = r.takeOffered()
	case full:
		r.offered, r.offLoop = nil, nil // this sync reads the kernel itself
	}
	switch {
	case full && sliced && offered != nil:
		// The periodic resync's read, made off the loop: adopt it.
		st.Reads += offered.reads
		st.ReadOffLoop = offered.took
		r.resync, r.resyncRS = nil, nil
		r.startResync(now)
	case full:
		err := r.readKernel(&st)
		st.Read = r.clock.Since(start)
		if err != nil {
			st.ReadFailed = true
			r.full.fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
			st.Duration = r.clock.Since(start)
			return st, err
		}
		r.resync, r.resyncRS = nil, nil
		if sliced {
			r.startResync(now)
		}
	}
	keys, addrs, services := r.scope(full && !sliced, now, sliced)
	want := r.desired(keys, addrs)
	r.takeResyncRealServers(keys, want)
	readFailed := r.readRealServers(&st, keys, want)
	keys = slices.DeleteFunc(keys, func(k model.VSKey) bool { return readFailed[k] != nil })
	for k, err := range readFailed {
		w := want.VirtualServers[k]
		st.Failed[w.Service] = errors.Join(st.Failed[w.Service], err)
	}

	ops := model.Diff(want, r.kernel, model.Scope{Keys: keys, Addresses: addrs})
	r.noteDraining(keys, want, now)
	orphanErrs := r.apply(&st, ops)
	r.kernel.RealServers = map[model.VSKey][]model.RealServer{} // no copy of the dump outlives the sync

	switch {
	case len(orphanErrs) > 0:
		r.orphan.fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
	case len(r.orphanKeys) == 0 && len(r.orphanAddrs) == 0:
		r.orphan = backoff{} // nothing left to retry
	}
	if len(readFailed) > 0 || r.lost {
		r.full.fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
		r.lost = false
	} else if full {
		r.full = backoff{}
		r.synced = true
	}
	errs := r.record(&st, services, now)
	st.Services = len(services)
	st.Duration = r.clock.Since(start)
	if !r.resyncStart.IsZero() {
		st.ResyncLeft = len(r.resync)
		if len(r.resync) == 0 {
			st.ResyncDone, st.ResyncTook = true, r.clock.Since(r.resyncStart)
			r.resyncStart = time.Time{}
		}
	}
	return st, errors.Join(append(errs, orphanErrs...)...)
}

// startResync lists every virtual server a sliced resync checks: those
// the plans claim and those in the kernel's view just read.
func (r *Reconciler) startResync(now time.Time) {
	keys := make([]model.VSKey, 0, len(r.claims)+len(r.kernel.VirtualServers))
	for k := range r.claims {
		keys = append(keys, k)
	}
	for k := range r.kernel.VirtualServers {
		if _, ok := r.claims[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, model.VSKey.Compare)
	r.resync, r.resyncStart = keys, now
	// The bulk read's real servers serve the slices: kept for the
	// resync's duration, each until its virtual server is in a sync's
	// scope.
	r.resyncRS, r.kernel.RealServers = r.kernel.RealServers, map[model.VSKey][]model.RealServer{}
}

// takeResyncRealServers gives the sync the real servers that the running
// resync's bulk read found for the virtual servers in its scope, as if
// read now: nothing has written them since (a sync that writes one takes
// its entry first). Those the read left out are read alone, and so are
// those with a real server marked Drain: their connection counts, which
// change without writes, decide whether it stays.
func (r *Reconciler) takeResyncRealServers(keys []model.VSKey, want model.Desired) {
	for _, k := range keys {
		if rss, ok := r.resyncRS[k]; ok {
			delete(r.resyncRS, k)
			if w, wanted := want.VirtualServers[k]; wanted && slices.ContainsFunc(w.RealServers, func(rs model.RealServer) bool { return rs.Drain }) {
				continue
			}
			r.kernel.RealServers[k] = rss
		}
	}
	if len(r.resync) == 0 {
		r.resyncRS = nil
	}
}

// noteDraining records which virtual servers in a sync's scope keep a busy
// real server marked Drain (by the kernel's real servers just read), and
// schedules their next check: the sync at DrainCheck from now reads them
// again, and the diff deletes each real server whose connections ended.
func (r *Reconciler) noteDraining(keys []model.VSKey, want model.Desired, now time.Time) {
	for _, k := range keys {
		if w, ok := want.VirtualServers[k]; ok && model.Draining(w.VSPlan, r.kernel.RealServers[k]) {
			r.draining[k] = true
		} else {
			delete(r.draining, k)
		}
	}
	switch {
	case len(r.draining) == 0:
		r.draining = emptied(r.draining)
		r.drainNext = time.Time{}
	case r.drainNext.IsZero():
		r.drainNext = now.Add(r.cfg.DrainCheck)
	}
}

// scope lists the virtual servers, addresses and Services a sync looks at,
// and clears what it takes of the dirty sets. full takes everything; else
// what changed, the due retries and the next slice of a running resync
// (and, when allAddrs, every address).
func (r *Reconciler) scope(full bool, now time.Time, allAddrs bool) ([]model.VSKey, []netip.Addr, map[types.NamespacedName]bool) {
	services := map[types.NamespacedName]bool{}
	keySet := map[model.VSKey]bool{}
	addrSet := map[netip.Addr]bool{}
	if full || allAddrs {
		for a := range r.wantAddr {
			addrSet[a] = true
		}
		for a := range r.kernel.Bound {
			addrSet[a] = true
		}
	}
	if r.drainDue(now) || full {
		// This sync looks at every draining virtual server; the next
		// check is scheduled after it (noteDraining).
		for k := range r.draining {
			keySet[k] = true
		}
		r.drainNext = time.Time{}
	}
	if n := min(r.cfg.ResyncSlice, len(r.resync)); n > 0 && !full {
		for _, k := range r.resync[:n] {
			keySet[k] = true
		}
		r.resync = r.resync[n:]
		if len(r.resync) == 0 {
			r.resync = nil
		}
	}
	if full {
		for n := range r.plans {
			services[n] = true
		}
		for n := range r.dirtyServices { // removed ones
			services[n] = true
		}
		for k := range r.claims {
			keySet[k] = true
		}
		for k := range r.kernel.VirtualServers {
			keySet[k] = true
		}
		r.orphanKeys = emptied(r.orphanKeys)
		r.orphanAddrs = emptied(r.orphanAddrs)
	} else {
		for n := range r.dirtyServices {
			services[n] = true
		}
		for n, b := range r.retrying {
			if b.due(now) {
				services[n] = true
				for _, v := range r.plans[n].VirtualServers {
					if !r.own.Excluded(v.Address) {
						keySet[v.VSKey] = true
					}
				}
			}
		}
		for k := range r.dirtyKeys {
			keySet[k] = true
		}
		for a := range r.dirtyAddrs {
			addrSet[a] = true
		}
		if r.orphan.due(now) {
			for k := range r.orphanKeys {
				keySet[k] = true
			}
			for a := range r.orphanAddrs {
				addrSet[a] = true
			}
			r.orphanKeys = emptied(r.orphanKeys)
			r.orphanAddrs = emptied(r.orphanAddrs)
		}
	}
	r.dirtyKeys = emptied(r.dirtyKeys)
	r.dirtyAddrs = emptied(r.dirtyAddrs)
	r.dirtyServices = emptied(r.dirtyServices)
	// The holder answers for what happens to its virtual servers; a
	// failing one comes whole, so that its status says all of it.
	var whole []types.NamespacedName
	for k := range keySet {
		if cl := r.claims[k]; len(cl) > 0 && !services[cl[0]] {
			services[cl[0]] = true
			if _, failing := r.retrying[cl[0]]; failing && !full {
				whole = append(whole, cl[0])
			}
		}
	}
	for _, n := range whole {
		for _, v := range r.plans[n].VirtualServers {
			if !r.own.Excluded(v.Address) && !keySet[v.VSKey] {
				keySet[v.VSKey] = true
				if cl := r.claims[v.VSKey]; len(cl) > 0 {
					services[cl[0]] = true
				}
			}
		}
	}
	keys := make([]model.VSKey, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
		addrSet[k.Address] = true
	}
	addrs := make([]netip.Addr, 0, len(addrSet))
	for a := range addrSet {
		addrs = append(addrs, a)
	}
	slices.SortFunc(keys, model.VSKey.Compare)
	slices.SortFunc(addrs, netip.Addr.Compare)
	return keys, addrs, services
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

// readRealServers reads the destinations of the virtual servers in scope
// that are wanted and in the kernel. It returns the reads that failed.
func (r *Reconciler) readRealServers(st *SyncStats, keys []model.VSKey, want model.Desired) map[model.VSKey]error {
	failed := map[model.VSKey]error{}
	for _, k := range keys {
		if _, wanted := want.VirtualServers[k]; !wanted {
			continue
		}
		if _, ok := r.kernel.VirtualServers[k]; !ok {
			continue
		}
		if _, read := r.kernel.RealServers[k]; read { // by a full sync's bulk read
			continue
		}
		st.Reads++
		rss, err := r.ipvs.ListRealServers(k)
		if err != nil {
			failed[k] = fmt.Errorf("read real servers of %s: %w", k, err)
			continue
		}
		r.kernel.RealServers[k] = rss
	}
	return failed
}

// readKernel replaces the view of the kernel with one dump of virtual
// servers and one of the interface's addresses.
func (r *Reconciler) readKernel(st *SyncStats) error {
	r.readEpoch++ // a read off the loop that began before this one is stale
	if err := r.links.EnsureDummy(r.own.Interface); err != nil {
		return fmt.Errorf("ensure interface %s: %w", r.own.Interface, err)
	}
	k, _, reads, err := ReadKernel(r.ipvs, r.links, r.own, func(key model.VSKey) bool { return len(r.claims[key]) > 0 })
	st.Reads += reads
	if err != nil {
		return err
	}
	// The real servers of every virtual server in one read; one that
	// appeared since the dump is read alone by readRealServers.
	st.Reads++
	all, err := r.ipvs.ListAllRealServers()
	if err != nil {
		return fmt.Errorf("read IPVS real servers: %w", err)
	}
	for key := range k.VirtualServers {
		if rss, ok := all[key]; ok {
			k.RealServers[key] = rss
		}
	}
	r.kernel = k
	return nil
}

// ReadKernel reads the part of the kernel that the ownership rule gives
// ipvs-proxy, by one dump of the virtual servers and of the addresses of
// its interface (and of the one it adopts): the owned virtual servers and
// the addresses bound to its interface. wanted tells the virtual servers
// that a Service wants, which are owned wherever they are. It returns the
// view, the number of virtual servers left to others and the reads made.
// Real servers are not read. The reconciler and `ipvs-proxy status` read
// the kernel through it, so they own the same things.
func ReadKernel(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership, wanted func(model.VSKey) bool) (*model.Kernel, int, int, error) {
	raw, reads, err := readRaw(ipvs, links, own)
	if err != nil {
		return nil, 0, reads, err
	}
	k, foreign := raw.view(own, wanted)
	return k, foreign, reads, nil
}

// rawKernel is what ReadKernel reads, before the ownership rule picks
// from it.
type rawKernel struct {
	vss                  []model.VirtualServer
	bound, adopted, node []netip.Addr
}

// readRaw makes ReadKernel's reads. It uses no state of a Reconciler, so
// that a periodic resync can make them off the loop.
func readRaw(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership) (rawKernel, int, error) {
	var raw rawKernel
	reads := 0
	addresses := func(link string) ([]netip.Addr, error) {
		reads++
		all, err := links.ListAddresses(link)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", link, err)
		}
		// The kernel's own link-local address of the interface is not ours.
		return slices.DeleteFunc(all, func(a netip.Addr) bool { return own.Excluded(a) || a.IsLinkLocalUnicast() }), nil
	}
	var err error
	if raw.bound, err = addresses(own.Interface); err != nil {
		return raw, reads, err
	}
	if own.Adopt != "" {
		if raw.adopted, err = addresses(own.Adopt); err != nil {
			return raw, reads, err
		}
	}
	reads++
	if raw.node, err = links.NodeAddresses(own.Interface); err != nil {
		return raw, reads, fmt.Errorf("list node addresses: %w", err)
	}
	reads++
	if raw.vss, err = ipvs.ListVirtualServers(); err != nil {
		return raw, reads, fmt.Errorf("list IPVS services: %w", err)
	}
	return raw, reads, nil
}

// view applies the ownership rule to what readRaw read: the owned virtual
// servers (and those wanted) and the addresses bound to the interface, and
// the number of virtual servers left to others.
func (raw rawKernel) view(own model.Ownership, wanted func(model.VSKey) bool) (*model.Kernel, int) {
	owned := map[netip.Addr]bool{}
	for _, a := range raw.bound {
		owned[a] = true
	}
	for _, a := range raw.adopted {
		owned[a] = true // owned, though not (yet) on our interface
	}
	node := map[netip.Addr]bool{}
	for _, a := range raw.node {
		node[a] = true
	}
	mine := make([]model.VirtualServer, 0, len(raw.vss))
	for _, vs := range raw.vss {
		if own.Owns(vs.VSKey, owned[vs.Address], node[vs.Address]) || wanted(vs.VSKey) {
			mine = append(mine, vs)
		}
	}
	return model.NewKernel(mine, raw.bound), len(raw.vss) - len(mine)
}

// SetResyncReader gives the reconciler handles of its own for the periodic
// resync's kernel read, which StartResyncRead then makes off the loop.
// They must not be the loop's handles: the read runs concurrently with
// the loop's writes.
func (r *Reconciler) SetResyncReader(ipvs netlinkutil.IPVS, links netlinkutil.Links) {
	r.reader = &resyncReader{ipvs: ipvs, links: links}
}

// StartResyncRead begins a periodic resync whose kernel read runs off the
// loop, so that changes keep flowing while it reads: it returns the read,
// to run on another goroutine, whose result goes to OfferRead and then a
// full Sync. It returns false, and the resync reads in the loop as before,
// without a resync reader, before the first full sync, when a full sync
// is due (a failed read: the loop's next sync reads), while a resync or a
// read off the loop runs. From now until the Sync that adopts the read,
// the loop's writes are noted: their virtual servers and addresses keep
// the loop's view, not the read's older one.
func (r *Reconciler) StartResyncRead() (func() *KernelRead, bool) {
	if r.reader == nil || !r.synced || r.full.due(r.clock.Now()) || len(r.resync) > 0 || r.offLoop != nil || r.offered != nil {
		return nil, false
	}
	epoch := r.readEpoch
	r.offLoop = &offLoopRead{epoch: epoch, keys: map[model.VSKey]bool{}, addrs: map[netip.Addr]bool{}}
	reader, own, clk := *r.reader, r.own, r.clock
	return func() *KernelRead {
		start := clk.Now()
		kr := &KernelRead{epoch: epoch}
		kr.raw, kr.reads, kr.err = readRaw(reader.ipvs, reader.links, own)
		if kr.err == nil {
			kr.reads++
			var err error
			if kr.rss, err = reader.ipvs.ListAllRealServers(); err != nil {
				kr.err = fmt.Errorf("read IPVS real servers: %w", err)
			}
		}
		kr.took = clk.Since(start)
		return kr
	}, true
}

// OfferRead hands the loop the result of a read off the loop. The next
// full Sync adopts it when it is still the newest read of the kernel and
// succeeded; otherwise that sync reads the kernel itself.
func (r *Reconciler) OfferRead(kr *KernelRead) {
	if kr.err != nil {
		r.log.Warn("the periodic resync's kernel read failed off the loop; reading in the loop", zap.Error(kr.err))
		kr = nil
	} else if kr.epoch != r.readEpoch {
		kr = nil // the loop read the kernel since it began
	}
	r.offered = kr
	if kr == nil {
		r.offLoop = nil
	}
}

// takeOffered adopts an offered read as the view of the kernel, with the
// loop's own view of what it wrote since the read began, and returns it;
// nil when none is offered.
func (r *Reconciler) takeOffered() *KernelRead {
	kr, ol := r.offered, r.offLoop
	r.offered, r.offLoop = nil, nil
	if kr == nil || ol == nil || kr.epoch != r.readEpoch || !r.synced || r.full.due(r.clock.Now()) {
		return nil
	}
	k, _ := kr.raw.view(r.own, func(key model.VSKey) bool { return len(r.claims[key]) > 0 })
	for key := range k.VirtualServers {
		if rss, ok := kr.rss[key]; ok {
			k.RealServers[key] = rss
		}
	}
	for key := range ol.keys {
		if vs, ok := r.kernel.VirtualServers[key]; ok {
			k.PutVirtualServer(vs)
		} else {
			k.DeleteVirtualServer(key)
		}
		delete(k.RealServers, key) // read alone when its slice comes
	}
	for a := range ol.addrs {
		if r.kernel.Bound[a] {
			k.Bound[a] = true
		} else {
			delete(k.Bound, a)
		}
	}
	r.kernel = k
	return kr
}

// touched notes what ops write while a read off the loop runs.
func (r *Reconciler) touched(ops []model.Op) {
	if r.offLoop == nil {
		return
	}
	for _, op := range ops {
		if op.Kind == model.OpBind || op.Kind == model.OpUnbind {
			r.offLoop.addrs[op.Address] = true
		} else {
			r.offLoop.keys[op.VirtualServer.VSKey] = true
		}
	}
}

// apply makes the writes of ops, keeping the view of the kernel current. A
// failed write is recorded against the op's Service in st.Failed; the
// failures of writes no Service answers for are returned. Addresses are
// bound first and unbound last, one at a time; the IPVS writes go in two
// batches (IPVS.Apply): the virtual servers added or updated, then the
// real server writes of those that succeeded and the deletes.
func (r *Reconciler) apply(st *SyncStats, ops []model.Op) []error {
	r.touched(ops)
	var orphan []error
	unbound := map[netip.Addr]error{} // binds that failed
	skip := map[model.VSKey]bool{}    // virtual servers whose add or update failed
	fail := func(op model.Op, err error) {
		if op.Service == (types.NamespacedName{}) {
			orphan = append(orphan, err)
			if op.Kind == model.OpUnbind || op.Kind == model.OpBind {
				r.orphanAddrs[op.Address] = true
			} else {
				r.orphanKeys[op.VirtualServer.VSKey] = true
			}
			return
		}
		st.Failed[op.Service] = errors.Join(st.Failed[op.Service], err)
	}
	// The three groups are indexes into ops, not copies: a cold sync at
	// 10,000 Services has 10,000s of ops of 240 bytes.
	var vsOps, rest, unbinds []int
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case model.OpBind:
			bindStart := r.clock.Now()
			err := r.write(st, *op, func() error { return r.links.AddAddress(r.own.Interface, op.Address) })
			st.Bind += r.clock.Since(bindStart)
			if err != nil {
				unbound[op.Address] = err
				continue
			}
			r.kernel.Bound[op.Address] = true
		case model.OpAddVirtualServer, model.OpUpdateVirtualServer:
			k := op.VirtualServer.VSKey
			if berr, ok := unbound[k.Address]; ok {
				// Not on an owned address: a crash would leak it.
				skip[k] = true
				fail(*op, fmt.Errorf("%s: address not bound: %w", op, berr))
				continue
			}
			vsOps = append(vsOps, i)
		case model.OpUnbind:
			unbinds = append(unbinds, i)
		default:
			rest = append(rest, i)
		}
	}
	for i, err := range r.applyIPVS(st, ops, vsOps) {
		op := &ops[vsOps[i]]
		if err != nil {
			r.noteScheduler(op.VirtualServer.Scheduler, err)
			skip[op.VirtualServer.VSKey] = true
			fail(*op, fmt.Errorf("%s: %w", op, err))
			continue
		}
		r.kernel.PutVirtualServer(op.VirtualServer)
	}
	rest = slices.DeleteFunc(rest, func(i int) bool {
		return ops[i].Kind != model.OpDeleteVirtualServer && skip[ops[i].VirtualServer.VSKey]
	})
	for i, err := range r.applyIPVS(st, ops, rest) {
		op := &ops[rest[i]]
		k := op.VirtualServer.VSKey
		switch {
		case err != nil:
			fail(*op, fmt.Errorf("%s: %w", op, err))
		case op.Kind == model.OpDeleteRealServer && k.Protocol == model.UDP:
			r.clearUDP(k, op.RealServer.RSKey)
		case op.Kind == model.OpDeleteVirtualServer:
			r.kernel.DeleteVirtualServer(k)
		}
	}
	for _, i := range unbinds {
		op := &ops[i]
		if r.kernel.OnAddress(op.Address) > 0 {
			// A failed delete left a virtual server on it: it stays
			// bound, so that the virtual server stays owned.
			continue
		}
		if err := r.write(st, *op, func() error { return r.links.DeleteAddress(r.own.Interface, op.Address) }); err != nil {
			fail(*op, fmt.Errorf("%s: %w", op, err))
			continue
		}
		delete(r.kernel.Bound, op.Address)
	}
	for a, err := range unbound {
		if !slices.ContainsFunc(ops, func(op model.Op) bool {
			return op.Service != (types.NamespacedName{}) && op.VirtualServer.Address == a
		}) {
			fail(model.Op{Kind: model.OpBind, Address: a}, fmt.Errorf("bind %s: %w", a, err))
		}
	}
	return orphan
}

// applyIPVS makes the IPVS writes of ops[idx...] in one batch, counting
// and logging them like single writes, and returns each one's error (in
// idx's order).
func (r *Reconciler) applyIPVS(st *SyncStats, ops []model.Op, idx []int) []error {
	if len(idx) == 0 {
		return nil
	}
	writes := make([]model.Op, len(idx))
	for i, j := range idx {
		writes[i] = ops[j]
	}
	errs := r.ipvs.Apply(writes)
	st.Writes += len(idx)
	for _, err := range errs {
		if errors.Is(err, netlinkutil.ErrOutcomeUnknown) {
			r.lost = true // like a failed read: the next sync is full
		}
	}
	if r.log.Core().Enabled(zap.DebugLevel) {
		for i, j := range idx {
			op := ops[j]
			r.log.Debug("kernel write", zap.Stringer("op", op), zap.String("service", op.Service.String()), zap.Error(errs[i]))
		}
	}
	return errs
}

// record updates the status of the Services in scope after a sync: those
// with failures are scheduled for a retry, the others are applied. It
// returns their errors, naming each Service.
func (r *Reconciler) record(st *SyncStats, services map[types.NamespacedName]bool, now time.Time) []error {
	var errs []error
	names := make([]types.NamespacedName, 0, len(services))
	for n := range services {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	for _, n := range names {
		s := r.status[n]
		err := st.Failed[n]
		if err == nil {
			delete(st.Failed, n)
			if s != nil {
				s.Applied, s.Failures, s.LastError, s.NextRetry = true, 0, "", time.Time{}
				delete(r.retrying, n)
			}
			st.Applied = append(st.Applied, n)
			continue
		}
		errs = append(errs, fmt.Errorf("service %s: %w", n, err))
		if s == nil { // removed: its leftovers are the orphan retry's
			continue
		}
		b := r.retrying[n]
		if b == nil {
			b = &backoff{}
			r.retrying[n] = b
		}
		b.fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
		s.Applied, s.Failures, s.LastError, s.NextRetry = false, b.failures, err.Error(), b.next
		r.log.Warn("service not fully programmed; retrying it alone", zap.String("service", n.String()),
			zap.Int("failures", b.failures), zap.Time("nextRetry", b.next), zap.Error(err))
	}
	return errs
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
func (r *Reconciler) write(st *SyncStats, op model.Op, fn func() error) error {
	st.Writes++
	err := fn()
	if ce := r.log.Check(zap.DebugLevel, "kernel write"); ce != nil {
		ce.Write(zap.Stringer("op", op), zap.String("service", op.Service.String()), zap.Error(err))
	}
	return err
}
