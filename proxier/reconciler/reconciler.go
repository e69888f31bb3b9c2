package reconciler

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
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
	// view was adopted by this sync, and NodeAddresses are the node's
	// addresses it read.
	ReadOffLoop   time.Duration
	NodeAddresses []netip.Addr
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

// Config configures a Reconciler.
type Config struct {
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
	// (ktypes.RealServer.Drain) are read again, so that each goes soon
	// after its connections end; default 2s.
	DrainCheck time.Duration
	// PieceOps is about how many operations a sync diffs and applies at
	// a time (a piece): a virtual server is never split from its real
	// servers, nor an address from its virtual servers; default 4096.
	PieceOps int
}

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
	cfg       Config
	own       model.Ownership
	clock     clock.PassiveClock
	log       *zap.Logger

	claims claimIndex // the plans, and who claims each virtual server
	kernel *model.Kernel

	// What changed since the last sync.
	dirtyKeys     map[ktypes.VSKey]bool
	dirtyAddrs    map[netip.Addr]bool
	dirtyServices map[types.NamespacedName]bool

	statuses serviceStatuses // each Service's last attempt, backoff, conflicts
	orphan   orphans         // failed writes no Service answers for
	draining drains          // virtual servers with busy real servers kept at weight 0 (model.Draining)
	resync   resyncState     // the periodic full resync, in slices, and its read off the loop

	full   Backoff // a failed kernel read: the next full sync
	lost   bool    // a write's answer was lost: the view may be wrong, read it again
	synced bool    // a full sync has completed once

	// unavailable holds the schedulers the kernel refused (ENOENT on add
	// or update: no module ip_vs_<name>).
	unavailable map[string]bool

	// routes are the Service ranges to route as local (SetRoutes);
	// routeFailed: a route write failed, a full sync (the only kind that
	// writes routes) is due again.
	routes      map[netip.Prefix]bool
	routeFailed bool
}

// NewReconciler returns a reconciler with no desired state; its first sync
// is full.
func NewReconciler(ipvs netlinkutil.IPVS, links netlinkutil.Links, cfg Config, log *zap.Logger) *Reconciler {
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
	if cfg.PieceOps <= 0 {
		cfg.PieceOps = defaultPieceOps
	}
	return &Reconciler{
		ipvs: ipvs, links: links, cfg: cfg, own: cfg.Ownership, clock: cfg.Clock, log: log,
		claims:        newClaimIndex(),
		kernel:        model.NewKernel(nil, nil),
		dirtyKeys:     map[ktypes.VSKey]bool{},
		dirtyAddrs:    map[netip.Addr]bool{},
		dirtyServices: map[types.NamespacedName]bool{},
		statuses:      newServiceStatuses(),
		routes:        map[netip.Prefix]bool{},
		orphan:        newOrphans(),
		resync:        resyncState{read: consumer.NewOffLoop[*KernelRead](cfg.Clock)},
		draining:      drains{keys: map[ktypes.VSKey]bool{}},
	}
}

// SetPlan records the desired plan of a Service; nil removes the Service.
// Nothing reaches the kernel before the next Sync.
func (r *Reconciler) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	old := r.claims.plans[name]
	if plan != nil && old != nil && planEqual(*old, *plan) {
		return
	}
	var same map[ktypes.VSKey]bool
	if old != nil {
		if plan != nil {
			same = unchangedKeys(old, plan)
		}
		r.claim(name, old, -1, same)
	}
	if plan == nil {
		if old == nil {
			return
		}
		delete(r.claims.plans, name)
		r.statuses.remove(name)
	} else {
		p := *plan
		r.claims.plans[name] = &p
		r.claim(name, &p, 1, same)
		r.statuses.add(name)
	}
	if r.synced || plan == nil { // the first full sync takes every plan: only removals wait for it
		r.dirtyServices[name] = true
	}
}

// Reserve sizes the reconciler's indexes for the n plans about to be set,
// when it holds none yet (a cold start): they are made at that size once
// instead of doubling as the plans come, every entry rehashed at each
// doubling (17 times at 100,000 Services). n counts Services; the indexes
// of virtual servers and addresses get as much, one each.
func (r *Reconciler) Reserve(n int) {
	if len(r.claims.plans) > 0 || n <= 64 {
		return
	}
	r.claims.plans = make(map[types.NamespacedName]*model.ServicePlan, n)
	r.claims.byKey = reserved(r.claims.byKey, n)
	r.claims.addrs = reserved(r.claims.addrs, n)
	r.statuses.byName = reserved(r.statuses.byName, n)
	r.statuses.conflictChanged = reserved(r.statuses.conflictChanged, n)
}

// reserved is m with room for n entries: a map made at that size when m
// is empty, else m (copying it would cost what its growth saves).
func reserved[K comparable, V any](m map[K]V, n int) map[K]V {
	if len(m) > 0 {
		return m
	}
	return make(map[K]V, n)
}

// claim adds (sign 1) or removes (sign -1) a plan's claims, marking what
// it touches dirty, but the virtual servers in same and their addresses
// (unchangedKeys: a plan replaced by one that wants them alike), and the
// claimants of each virtual server it touches as having conflicts to
// check.
func (r *Reconciler) claim(name types.NamespacedName, p *model.ServicePlan, sign int, same map[ktypes.VSKey]bool) {
	// Before the first full sync, which takes every virtual server and
	// address, the dirty sets would only repeat the indexes.
	marks := r.synced
	r.claims.claim(name, p, sign, func(k ktypes.VSKey, claimants []types.NamespacedName) {
		if marks && !same[k] {
			r.dirtyKeys[k] = true
		}
		for _, n := range claimants {
			r.statuses.conflictChanged[n] = true
		}
	}, func(k ktypes.VSKey) {
		if marks && !same[k] {
			r.dirtyAddrs[k.Address] = true
		}
	})
}

// SetRoutes sets the Service ranges to route as local through the
// interface (the plans' BuildConfig.ServiceRanges); a change makes the
// next sync full, which writes the routes (a partial one does not).
func (r *Reconciler) SetRoutes(ranges []netip.Prefix) {
	routes := make(map[netip.Prefix]bool, len(ranges))
	for _, p := range ranges {
		routes[p.Masked()] = true
	}
	if maps.Equal(routes, r.routes) {
		return
	}
	r.routes = routes
	r.RequestFull()
}

// RequestFull makes the next sync full and whole (the interface was
// removed: it is created again, every address bound again).
func (r *Reconciler) RequestFull() {
	r.full.failures = max(r.full.failures, 1)
	r.full.next = r.clock.Now()
}

// AddressesRemoved takes the addresses that the kernel reports removed
// from the interface out of the view of the kernel, and returns how many
// it took: those still wanted are bound again by the next sync, a partial
// one (a full one for a range's anchor). Removals of the reconciler's own
// unbinding find the view already without them and are ignored.
func (r *Reconciler) AddressesRemoved(addrs []netip.Addr) int {
	n := 0
	for _, a := range addrs {
		if !r.kernel.Bound[a] {
			continue
		}
		delete(r.kernel.Bound, a)
		r.dirtyAddrs[a] = true
		r.resync.touchedAddress(a)
		if model.Anchors(r.routes)[a] {
			// If it was the interface's last IPv4 address, the kernel
			// took the routes through it along: a full sync reads them.
			r.RequestFull()
		}
		n++
	}
	return n
}

// FullDue reports whether the next sync must be full: no full sync has
// succeeded yet, or a failed kernel read's retry is due.
func (r *Reconciler) FullDue() bool { return !r.synced || r.full.Due(r.clock.Now()) }

// Pending reports whether a sync now has work to do.
func (r *Reconciler) Pending() bool {
	now := r.clock.Now()
	if !r.synced || r.full.Due(now) || r.orphan.Due(now) || r.resync.running() || r.draining.due(now) ||
		len(r.dirtyKeys) > 0 || len(r.dirtyAddrs) > 0 || len(r.dirtyServices) > 0 {
		return true
	}
	for _, b := range r.statuses.retrying {
		if b.Due(now) {
			return true
		}
	}
	return false
}

// NextRetry is when the earliest retry (of a failed Service, of a failed
// kernel read, of other failed writes) or the next check of the real
// servers kept while busy is due; zero when none waits.
func (r *Reconciler) NextRetry() time.Time {
	next := r.draining.next
	consider := func(b *Backoff) {
		if b.failures > 0 && (next.IsZero() || b.next.Before(next)) {
			next = b.next
		}
	}
	consider(&r.full)
	consider(&r.orphan.Backoff)
	for _, b := range r.statuses.retrying {
		consider(b)
	}
	return next
}

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
	return r.SyncAs(r.Decide(full))
}

// SyncDecision is what a sync will be, decided before it runs (Decide):
// the proxier starts its consumers' syncs, full or not alike, beside it.
type SyncDecision struct {
	// Full: the sync reads the kernel whole (or begins a sliced resync).
	Full bool
	// sliced: the full sync is a periodic resync, run in slices.
	sliced bool
	at     time.Time
}

// Decide tells what Sync(full) would be now; SyncAs runs it.
func (r *Reconciler) Decide(full bool) SyncDecision {
	now := r.clock.Now()
	sliced := full && r.synced && !r.full.Due(now)
	full = full || !r.synced || r.full.Due(now)
	if sliced && r.resync.running() {
		full, sliced = false, false // one resync at a time: continue it
	}
	return SyncDecision{Full: full, sliced: sliced, at: now}
}

// SyncAs runs the sync that Decide decided, with nothing else done to the
// reconciler in between.
func (r *Reconciler) SyncAs(d SyncDecision) (SyncStats, error) {
	start := d.at
	now := start
	full, sliced := d.Full, d.sliced
	st := SyncStats{Full: full, Failed: map[types.NamespacedName]error{}}
	var offered *KernelRead
	var wrote *offLoopRead
	switch {
	case full && sliced:
		offered, wrote = r.takeOffered()
	case full:
		// This sync reads the kernel itself: a read off the loop that
		// began before is older.
		r.resync.dropRead()
	}
	switch {
	case full && sliced && offered != nil:
		// The periodic resync's read, made off the loop: adopt it.
		st.Reads += offered.reads
		st.ReadOffLoop, st.NodeAddresses = offered.took, offered.node
		r.resync.stop()
		r.startResyncFrom(offered, wrote, now)
	case full:
		err := r.readKernel(&st)
		st.Read = r.clock.Since(start)
		if err != nil {
			st.ReadFailed = true
			r.full.Fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
			st.Duration = r.clock.Since(start)
			return st, err
		}
		r.resync.stop()
		if sliced {
			r.startResync(now)
		}
	}
	keys, addrs, services := r.scope(full && !sliced, now, sliced)
	want := r.desired(keys, addrs)
	r.takeResyncRealServers(keys, want)
	readFailed := r.readRealServers(&st, keys, want)
	keys = slices.DeleteFunc(keys, func(k ktypes.VSKey) bool { return readFailed[k] != nil })
	for k, err := range readFailed {
		w := want.VirtualServers[k]
		st.Failed[w.Service] = errors.Join(st.Failed[w.Service], err)
	}

	r.draining.note(keys, want, r.kernel.RealServers, now, r.cfg.DrainCheck)
	orphanErrs := r.applyPieces(&st, want, keys, addrs, full)
	r.resync.keepRealServers(keys, r.kernel, want)
	r.kernel.RealServers = map[ktypes.VSKey][]ktypes.RealServer{} // no copy of the dump outlives the sync

	r.orphan.settle(len(orphanErrs) > 0, now, r.cfg.RetryBase, r.cfg.RetryMax)
	if len(readFailed) > 0 || r.lost || r.routeFailed {
		r.full.Fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
		r.lost, r.routeFailed = false, false
	} else if full {
		r.full = Backoff{}
		r.synced = true
	}
	errs := r.record(&st, services, now)
	st.Services = len(services)
	st.Duration = r.clock.Since(start)
	r.resync.progress(&st, r.clock.Now())
	return st, errors.Join(append(errs, orphanErrs...)...)
}

// defaultPieceOps: a cold sync at 2,000 Services × 50 endpoints writes
// 102,000 operations of 280 bytes; diffed whole, their list was the
// largest thing alive in the first sync (27 MB).
const defaultPieceOps = 4096

// applyPieces diffs the scope (keys and addrs, sorted; the routes when
// routes) and applies it a piece at a time, in key order, so that only one
// piece's operations are alive at once. The order stays Diff's: the
// routes come with the first piece, each address with the piece of its
// virtual servers (bound before they are added, unbound after they are
// deleted), and the unwanted routes last, once every delete is done. The
// failures of writes no Service answers for are returned. Before all of
// them go the UDP virtual servers that lose a real server (udpLosses).
func (r *Reconciler) applyPieces(st *SyncStats, want model.Desired, keys []ktypes.VSKey, addrs []netip.Addr, routes bool) []error {
	unrouted := map[netip.Prefix]error{} // routes that failed, for every piece after
	var orphan []error
	if first, rest := r.udpLosses(want, keys); len(first) > 0 {
		orphan = r.apply(st, model.Diff(want, r.kernel, model.Scope{Keys: first}), unrouted)
		keys = rest
	}
	pieces := r.pieces(want, keys, addrs)
	// Into an empty kernel every operation counted is written: Diff need
	// not count them again. Elsewhere most are not (a resync's none).
	cold := len(r.kernel.VirtualServers) == 0
	for i, p := range pieces {
		sc := model.Scope{Keys: p.keys, Addresses: p.addrs, Routes: routes && i == 0}
		if cold {
			sc.Room = p.ops + len(p.addrs)
		}
		ops := model.Diff(want, r.kernel, sc)
		if len(pieces) > 1 {
			ops = slices.DeleteFunc(ops, func(op ktypes.Op) bool { return op.Kind == ktypes.OpUnroute })
		}
		orphan = append(orphan, r.apply(st, ops, unrouted)...)
	}
	if routes && len(pieces) > 1 {
		ops := model.Diff(want, r.kernel, model.Scope{Routes: true})
		ops = slices.DeleteFunc(ops, func(op ktypes.Op) bool { return op.Kind != ktypes.OpUnroute })
		orphan = append(orphan, r.apply(st, ops, unrouted)...)
	}
	return orphan
}

// udpLosses splits keys (sorted) into the UDP virtual servers of the
// kernel that lose a real server (deleted, or taken to weight 0 to drain)
// or go altogether, and the rest; both stay sorted. applyPieces writes the
// first before anything else, and clears their flows' conntrack entries
// at once: a UDP client keeps its flow on a backend that is gone until
// both are done (it sees no reset to make it pick again), and a sync that
// also writes hundreds of other Services' changes kept them waiting
// behind those writes: 38 s on a node whose CPU went to other load
// (issue 45, case 7). The first need no address bound nor route: they are
// in the kernel already.
func (r *Reconciler) udpLosses(want model.Desired, keys []ktypes.VSKey) (first, rest []ktypes.VSKey) {
	loses := func(k ktypes.VSKey) bool {
		if k.Protocol != ktypes.UDP {
			return false
		}
		if _, held := r.kernel.VirtualServers[k]; !held {
			return false
		}
		w, wanted := want.VirtualServers[k]
		return !wanted || losesRealServer(r.kernel.RealServers[k], w.RealServers)
	}
	i := slices.IndexFunc(keys, loses)
	if i < 0 {
		return nil, keys
	}
	rest = slices.Clone(keys[:i])
	for _, k := range keys[i:] {
		if loses(k) {
			first = append(first, k)
		} else {
			rest = append(rest, k)
		}
	}
	return first, rest
}

// losesRealServer reports whether a real server of have (the kernel's)
// is not in want, or is wanted at weight 0 while it has a weight.
func losesRealServer(have, want []ktypes.RealServer) bool {
	weights := make(map[ktypes.RSKey]int32, len(want))
	for _, rs := range want {
		weights[rs.RSKey] = rs.Weight
	}
	for _, rs := range have {
		w, ok := weights[rs.RSKey]
		if !ok || (w == 0 && rs.Weight > 0) {
			return true
		}
	}
	return false
}

// piece is a part of a sync's scope (applyPieces), with about as many
// operations as its virtual servers may need (ops).
type piece struct {
	keys  []ktypes.VSKey
	addrs []netip.Addr
	ops   int
}

// pieces cuts keys (sorted) into runs of about r.cfg.PieceOps operations,
// counting a virtual server as one plus its real servers wanted or held,
// and cutting only between addresses; each address of addrs (sorted) goes
// with the piece whose keys reach it, the rest with the last. The anchors
// of the wanted ranges go with the first piece, beside their routes: an
// earlier piece that unbinds the interface's last other IPv4 address
// would otherwise take a range's route along (model.RangeAnchor).
func (r *Reconciler) pieces(want model.Desired, keys []ktypes.VSKey, addrs []netip.Addr) []piece {
	var out []piece
	start, n := 0, 0
	for i, k := range keys {
		if n >= r.cfg.PieceOps && k.Address != keys[i-1].Address {
			out = append(out, piece{keys: keys[start:i], ops: n})
			start, n = i, 0
		}
		n += 1 + max(len(want.VirtualServers[k].RealServers), len(r.kernel.RealServers[k]))
	}
	out = append(out, piece{keys: keys[start:], ops: n})
	if len(out) == 1 {
		out[0].addrs = addrs
		return out
	}
	anchors := model.Anchors(want.Routes)
	var first, rest []netip.Addr // the anchors in the scope; the other addresses
	for _, a := range addrs {
		if anchors[a] {
			first = append(first, a)
		} else {
			rest = append(rest, a)
		}
	}
	j := 0
	for i := range out[:len(out)-1] {
		last := out[i].keys[len(out[i].keys)-1].Address
		end := j
		for end < len(rest) && rest[end].Compare(last) <= 0 {
			end++
		}
		out[i].addrs, j = rest[j:end], end
	}
	out[len(out)-1].addrs = rest[j:]
	out[0].addrs = append(first, out[0].addrs...)
	return out
}

// SetConntrack makes the reconciler clear the conntrack entries of removed
// UDP real servers (nil: it does not).
func (r *Reconciler) SetConntrack(c netlinkutil.Conntrack) { r.conntrack = c }
