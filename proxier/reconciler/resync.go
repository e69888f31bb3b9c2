package reconciler

// The periodic full resync, in slices, and its kernel read off the loop.

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// resyncState is the periodic full resync in progress: the virtual servers
// it has still to check (left), in key order, when it read the kernel, and
// the real servers its bulk read found for those not checked yet; and its
// kernel read off the loop (StartResyncRead): its own handles, the read
// (an in-loop read of the kernel drops it: it is older) and what the loop
// wrote since it started.
type resyncState struct {
	left []ktypes.VSKey
	// leftAddrs are the addresses it has still to check, in order: each
	// slice takes those up to its last virtual server's.
	leftAddrs   []netip.Addr
	start       time.Time
	realServers map[ktypes.VSKey][]ktypes.RealServer
	// yielded: the last sync took no slice, to apply changes first.
	yielded bool
	// first holds what the adoption of a read off the loop checks beside
	// the first slice: what the read's view did not list (virtual servers
	// and addresses the loop claims or wrote since).
	first scopeSet

	reader  *resyncReader
	read    *consumer.OffLoop[*KernelRead]
	offLoop *offLoopRead
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
	keys  map[ktypes.VSKey]bool
	addrs map[netip.Addr]bool
	// rss are the real servers of keys as the loop's last sync of each
	// left them (keepRealServers), which the adoption takes instead of
	// the read's: without them, each was read again alone, 544 dumps in
	// one sync of a starved node (issue 45, case 7). A key without is
	// read alone.
	rss map[ktypes.VSKey][]ktypes.RealServer
	// done are the current sync's writes that succeeded, by virtual
	// server (its add and its real servers'); failed, the virtual
	// servers with a write that failed.
	done   map[ktypes.VSKey][]ktypes.Op
	failed map[ktypes.VSKey]bool
}

func newOffLoopRead() *offLoopRead {
	return &offLoopRead{keys: map[ktypes.VSKey]bool{}, addrs: map[netip.Addr]bool{},
		rss: map[ktypes.VSKey][]ktypes.RealServer{}, done: map[ktypes.VSKey][]ktypes.Op{}, failed: map[ktypes.VSKey]bool{}}
}

// KernelRead is the result of a read of the kernel made off the sync loop
// for a periodic resync (see Reconciler.StartResyncRead).
type KernelRead struct {
	// view is the kernel under the ownership rule, with the real servers
	// of its virtual servers; others are the virtual servers the rule
	// leaves out, which the loop may still claim (Reconciler.ours).
	view   *model.Kernel
	others []ktypes.VirtualServer
	// keys and bound are the view's virtual servers and addresses, in
	// order: what the resync's slices check.
	keys  []ktypes.VSKey
	bound []netip.Addr
	// node are the node's addresses (netlinkutil.Links.NodeAddresses),
	// which the read needs and the agent takes (SyncStats.NodeAddresses).
	node  []netip.Addr
	rss   map[ktypes.VSKey][]ktypes.RealServer
	reads int
	took  time.Duration // set when it is taken
	err   error
}

// Resyncing reports whether a periodic full resync is in progress: the
// next syncs check its remaining virtual servers.
func (r *Reconciler) Resyncing() bool { return r.resync.running() }

// startResync lists every virtual server a sliced resync checks: those
// the plans claim and those in the kernel's view just read.
func (r *Reconciler) startResync(now time.Time) {
	keys := make([]ktypes.VSKey, 0, len(r.claims.byKey)+len(r.kernel.VirtualServers))
	for k := range r.claims.byKey {
		keys = append(keys, k)
	}
	for k := range r.kernel.VirtualServers {
		if _, ok := r.claims.byKey[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, ktypes.VSKey.Compare)
	r.resync.left, r.resync.start = keys, now
	anchors := model.Anchors(r.routes)
	addrs := make([]netip.Addr, 0, len(r.claims.addrs)+len(r.kernel.Bound))
	for a := range r.claims.addrs {
		if !anchors[a] { // the anchors go with the read's own sync, beside the routes
			addrs = append(addrs, a)
		}
	}
	for a := range r.kernel.Bound {
		if _, claimed := r.claims.addrs[a]; !claimed && !anchors[a] {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	r.resync.leftAddrs = addrs
	// The bulk read's real servers serve the slices: kept for the
	// resync's duration, each until its virtual server is in a sync's
	// scope.
	r.resync.realServers, r.kernel.RealServers = r.kernel.RealServers, map[ktypes.VSKey][]ktypes.RealServer{}
}

// takeResyncRealServers gives the sync the real servers that the running
// resync's bulk read found for the virtual servers in its scope, as if
// read now: nothing has written them since (a sync that writes one takes
// its entry first). Those the read left out are read alone, and so are
// those with a real server marked Drain: their connection counts, which
// change without writes, decide whether it stays.
func (r *Reconciler) takeResyncRealServers(keys []ktypes.VSKey, want model.Desired) {
	for _, k := range keys {
		if rss, ok := r.resync.realServers[k]; ok {
			delete(r.resync.realServers, k)
			if draining(want.VirtualServers[k]) {
				continue
			}
			r.kernel.RealServers[k] = rss
		}
	}
	if len(r.resync.left) == 0 {
		r.resync.realServers = nil
	}
}

// SetResyncReader gives the reconciler handles of its own for the periodic
// resync's kernel read, which StartResyncRead then makes off the loop.
// They must not be the loop's handles: the read runs concurrently with
// the loop's writes.
func (r *Reconciler) SetResyncReader(ipvs netlinkutil.IPVS, links netlinkutil.Links) {
	r.resync.reader = &resyncReader{ipvs: ipvs, links: links}
}

// StartResyncRead begins a periodic resync whose kernel read runs off the
// loop, so that changes keep flowing while it reads: it returns the read,
// to run on another goroutine; once it has run (ResyncReadDone), the next
// full Sync adopts its result. It returns false, and the resync reads in
// the loop as before, without a resync reader, before the first full
// sync, when a full sync is due (a failed read: the loop's next sync
// reads), while a resync or a read off the loop runs. From now until the
// Sync that adopts the read, the loop's writes are noted: their virtual
// servers and addresses keep the loop's view, not the read's older one.
func (r *Reconciler) StartResyncRead() (run func(), ok bool) {
	if r.resync.reader == nil || !r.synced || r.full.Due(r.clock.Now()) || r.resync.running() ||
		r.resync.offLoop != nil || r.resync.read.Running() {
		return nil, false
	}
	reader, own := *r.resync.reader, r.own
	run, ok = r.resync.read.Begin(func() *KernelRead { return readOffLoop(reader, own) }, nil)
	if ok {
		r.resync.offLoop = newOffLoopRead()
	}
	return run, ok
}

// readOffLoop reads the kernel for a periodic resync and makes its view
// there, off the loop: the loop only adds what the ownership rule left
// out and it still claims, and what it wrote meanwhile (takeOffered).
func readOffLoop(reader resyncReader, own model.Ownership) *KernelRead {
	kr := &KernelRead{}
	raw, reads, err := readRaw(reader.ipvs, reader.links, own)
	kr.reads = reads
	if err != nil {
		kr.err = err
		return kr
	}
	kr.reads++
	rss, err := reader.ipvs.ListAllRealServers()
	if err != nil {
		kr.err = fmt.Errorf("read IPVS real servers: %w", err)
		return kr
	}
	kr.view, kr.others = raw.ownedView(own)
	kr.node = raw.node
	kr.rss = map[ktypes.VSKey][]ktypes.RealServer{}
	for key := range kr.view.VirtualServers {
		if rs, ok := rss[key]; ok {
			kr.view.RealServers[key] = rs
		}
	}
	for _, vs := range kr.others {
		if rs, ok := rss[vs.VSKey]; ok {
			kr.rss[vs.VSKey] = rs
		}
	}
	kr.keys = slices.SortedFunc(maps.Keys(kr.view.VirtualServers), ktypes.VSKey.Compare)
	kr.bound = slices.SortedFunc(maps.Keys(kr.view.Bound), netip.Addr.Compare)
	return kr
}

// startResyncFrom starts a sliced resync from a read made off the loop:
// its slices walk the read's own lists, sorted there, and the adoption
// checks, beside the first slice, what the loop claims that the read did
// not list (and what the loop wrote since the read began: in the view,
// perhaps not in the read). The loop so passes over the claims once, and
// sorts nothing of the whole table.
func (r *Reconciler) startResyncFrom(kr *KernelRead, ol *offLoopRead, now time.Time) {
	first := scopeSet{keys: map[ktypes.VSKey]bool{}, addrs: map[netip.Addr]bool{}}
	for k := range r.claims.byKey {
		if _, read := kr.view.VirtualServers[k]; !read {
			first.keys[k] = true
		}
	}
	for a := range r.claims.addrs {
		if !kr.view.Bound[a] {
			first.addrs[a] = true
		}
	}
	for a := range model.Anchors(r.routes) {
		first.addrs[a] = true // beside the routes
	}
	for _, vs := range kr.others {
		first.keys[vs.VSKey] = true
	}
	maps.Copy(first.keys, ol.keys)
	maps.Copy(first.addrs, ol.addrs)
	r.resync.left, r.resync.leftAddrs, r.resync.first, r.resync.start = kr.keys, kr.bound, first, now
	r.resync.realServers, r.kernel.RealServers = r.kernel.RealServers, map[ktypes.VSKey][]ktypes.RealServer{}
}

// takeFirst puts what the adoption checks beside the first slice into its
// scope.
func (rs *resyncState) takeFirst(sc *scopeSet) {
	maps.Copy(sc.keys, rs.first.keys)
	maps.Copy(sc.addrs, rs.first.addrs)
	rs.first = scopeSet{}
}

// AdoptsRead reports whether Sync(full) now would adopt a read made off the
// loop (unless it turns out stale or failed): the agent then takes the
// node's addresses from it (SyncStats.NodeAddresses) instead of reading
// them in the loop.
func (r *Reconciler) AdoptsRead(full bool) bool {
	d := r.Decide(full)
	return d.Full && d.sliced && r.resync.read.Done()
}

// ResyncReadDone reports whether a read off the loop has run: the next
// full Sync takes its result (adopts it, or reads the kernel itself when
// the read failed or an in-loop read made it stale).
func (r *Reconciler) ResyncReadDone() bool { return r.resync.read.Done() }

// takeOffered adopts the read off the loop, when it is done, still the
// newest read of the kernel and succeeded, as the view of the kernel,
// with the loop's own view of what it wrote since the read began, and
// returns it; nil otherwise.
func (r *Reconciler) takeOffered() (*KernelRead, *offLoopRead) {
	ol := r.resync.offLoop
	r.resync.offLoop = nil
	kr, took, ok := r.resync.read.Take()
	if !ok || ol == nil || !r.synced || r.full.Due(r.clock.Now()) {
		return nil, nil
	}
	if kr.err != nil {
		r.log.Warn("the periodic resync's kernel read failed off the loop; reading in the loop", zap.Error(kr.err))
		return nil, nil
	}
	kr.took = took
	k := kr.view
	for _, vs := range kr.others {
		if r.ours(vs.VSKey) {
			k.PutVirtualServer(vs)
			if rss, ok := kr.rss[vs.VSKey]; ok {
				k.RealServers[vs.VSKey] = rss
			}
		}
	}
	// IPVS dumps its virtual servers by position, part after part, with
	// the table unlocked in between: a delete meanwhile (the loop's own,
	// while this read ran) shifts the rest, and the dump skips one that
	// nobody touched. A virtual server of the view that the read lacks
	// and the loop did not write may be such a skip (or one deleted
	// behind the agent's back): the loop reads the kernel itself, as no
	// write runs beside it. Adopting the read would drop it from the view,
	// and its Service's removal would then unbind its address and leave
	// it owned by nothing.
	for key := range r.kernel.VirtualServers {
		if _, ok := k.VirtualServers[key]; !ok && !ol.keys[key] {
			r.log.Info("the periodic resync's read off the loop lacks a virtual server the loop did not write; reading in the loop",
				zap.Stringer("virtualServer", key))
			return nil, nil
		}
	}
	for key := range ol.keys {
		vs, ok := r.kernel.VirtualServers[key]
		if ok {
			k.PutVirtualServer(vs)
		} else {
			k.DeleteVirtualServer(key)
		}
		if rss, kept := ol.rss[key]; ok && kept {
			k.RealServers[key] = rss
		} else {
			delete(k.RealServers, key) // read alone when its slice comes
		}
	}
	for a := range ol.addrs {
		if r.kernel.Bound[a] {
			k.Bound[a] = true
		} else {
			delete(k.Bound, a)
		}
	}
	r.kernel = k
	return kr, ol
}

// touched notes what ops write while a read off the loop runs.
func (rs *resyncState) touched(ops []ktypes.Op) {
	if rs.offLoop == nil {
		return
	}
	for _, op := range ops {
		switch op.Kind {
		case ktypes.OpBind, ktypes.OpUnbind:
			rs.offLoop.addrs[op.Address] = true
		case ktypes.OpRoute, ktypes.OpUnroute:
			// Written by full syncs only, which drop a read off the loop.
		default:
			rs.offLoop.keys[op.VirtualServer.VSKey] = true
		}
	}
}

// wrote notes a write of the current sync and its outcome while a read off
// the loop runs (keepRealServers).
func (rs *resyncState) wrote(op ktypes.Op, err error) {
	ol := rs.offLoop
	if ol == nil {
		return
	}
	k := op.VirtualServer.VSKey
	switch {
	case err != nil:
		ol.failed[k] = true
	case op.Kind == ktypes.OpAddVirtualServer || op.Kind == ktypes.OpAddRealServer ||
		op.Kind == ktypes.OpUpdateRealServer || op.Kind == ktypes.OpDeleteRealServer:
		ol.done[k] = append(ol.done[k], op)
	}
}

// keepRealServers ends a sync while a read off the loop runs: for each
// virtual server of its scope (keys) that the loop wrote since the read
// began, it keeps the real servers the sync leaves on it (those it read,
// view.RealServers, with its writes replayed), so that the read's
// adoption need not read them again. It keeps none, and the adoption
// reads the virtual server alone, where a write failed, where the order
// of the real servers is the scheduler's table (Ordered), and where a
// real server drains (its connection counts decide, as in
// takeResyncRealServers).
func (rs *resyncState) keepRealServers(keys []ktypes.VSKey, view *model.Kernel, want model.Desired) {
	ol := rs.offLoop
	if ol == nil {
		return
	}
	for _, k := range keys {
		if !ol.keys[k] {
			continue
		}
		vs, inKernel := view.VirtualServers[k]
		before, read := view.RealServers[k]
		done := ol.done[k]
		added := len(done) > 0 && done[0].Kind == ktypes.OpAddVirtualServer
		if !inKernel || (!read && !added) || ol.failed[k] || vs.Ordered() || draining(want.VirtualServers[k]) {
			delete(ol.rss, k)
			continue
		}
		ol.rss[k] = replay(before, done)
	}
	clear(ol.done)
	clear(ol.failed)
}

// draining reports whether w has a real server marked Drain.
func draining(w model.Want) bool {
	return slices.ContainsFunc(w.RealServers, func(rs ktypes.RealServer) bool { return rs.Drain })
}

// replay returns the real servers before, as read, after the writes ops
// (in their order) succeeded, in no particular order (an ordered
// scheduler's are never replayed); before is not changed. An added or
// updated real server has the kernel's fields only (no Drain); an update
// keeps the connection counts read. One pass over each, through a map: a
// Service scaled by thousands of endpoints is thousands of ops.
func replay(before []ktypes.RealServer, ops []ktypes.Op) []ktypes.RealServer {
	byKey := make(map[ktypes.RSKey]ktypes.RealServer, len(before)+len(ops))
	for _, rs := range before {
		byKey[rs.RSKey] = rs
	}
	for _, op := range ops {
		rs := op.RealServer
		switch op.Kind {
		case ktypes.OpAddVirtualServer:
			clear(byKey)
		case ktypes.OpAddRealServer:
			byKey[rs.RSKey] = ktypes.RealServer{RSKey: rs.RSKey, Weight: rs.Weight, Forward: rs.Forward, TunPort: rs.TunPort}
		case ktypes.OpUpdateRealServer:
			if have, ok := byKey[rs.RSKey]; ok {
				have.Weight, have.Forward, have.TunPort = rs.Weight, rs.Forward, rs.TunPort
				byKey[rs.RSKey] = have
			}
		case ktypes.OpDeleteRealServer:
			delete(byKey, rs.RSKey)
		}
	}
	return slices.Collect(maps.Values(byKey))
}

// nextSlice puts the next n virtual servers the running resync has still
// to check into a sync's scope, with the addresses up to the last one's
// (all that are left, with the last slice).
func (rs *resyncState) nextSlice(n int, sc *scopeSet) {
	n = min(n, len(rs.left))
	for _, k := range rs.left[:n] {
		sc.keys[k] = true
	}
	rs.left = rs.left[n:]
	end := len(rs.leftAddrs)
	if len(rs.left) > 0 {
		last := rs.left[0].Address // the next slice's first: this one's reach
		end, _ = slices.BinarySearchFunc(rs.leftAddrs, last, netip.Addr.Compare)
	}
	for _, a := range rs.leftAddrs[:end] {
		sc.addrs[a] = true
	}
	rs.leftAddrs = rs.leftAddrs[end:]
	if len(rs.left) == 0 {
		rs.left = nil
	}
	if len(rs.leftAddrs) == 0 {
		rs.leftAddrs = nil
	}
}

// stop forgets a resync in progress (a full read begins another, or none).
func (rs *resyncState) stop() {
	rs.left, rs.leftAddrs, rs.realServers, rs.first = nil, nil, nil, scopeSet{}
}

// progress reports the running resync in a sync's stats, and ends it when
// its last slice was checked.
func (rs *resyncState) progress(st *SyncStats, now time.Time) {
	if rs.start.IsZero() {
		return
	}
	st.ResyncLeft = len(rs.left)
	if !rs.running() {
		st.ResyncDone, st.ResyncTook = true, now.Sub(rs.start)
		rs.start = time.Time{}
	}
}

// running reports whether a resync has virtual servers still to check.
func (rs *resyncState) running() bool { return len(rs.left) > 0 || len(rs.leftAddrs) > 0 }

// dropRead makes a read off the loop under way stale: the loop reads the
// kernel itself.
func (rs *resyncState) dropRead() {
	rs.read.Drop()
	rs.offLoop = nil
}

// touchedAddress notes an address whose state the loop learned while a read
// off the loop runs.
func (rs *resyncState) touchedAddress(a netip.Addr) {
	if rs.offLoop != nil {
		rs.offLoop.addrs[a] = true
	}
}
