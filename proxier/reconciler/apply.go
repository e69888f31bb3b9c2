package reconciler

// Applying a diff: the writes of one piece's operations, in Diff's order,
// with the view of the kernel kept current and each failure charged to the
// Service whose operation failed.

import (
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"sort"
	"syscall"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// applyRun is one call of apply: its operations, sorted into groups (as
// indexes into ops, not copies: a cold sync at 10,000 Services has 10,000s
// of ops of 240 bytes), and what failed so far.
type applyRun struct {
	r   *Reconciler
	st  *SyncStats
	ops []ktypes.Op
	// unrouted holds the routes that failed in this sync (shared by its
	// pieces); unbound the binds that failed; skip the virtual servers
	// whose add or update failed.
	unrouted map[netip.Prefix]error
	unbound  map[netip.Addr]error
	skip     map[ktypes.VSKey]bool

	vsOps, rest, unbinds, unroutes []int
	// orphan are the failures no Service answers for.
	orphan []error
	// clears are the UDP flows whose conntrack entries go once the
	// writes are done (clearUDP).
	clears []netlinkutil.UDPClear
}

// apply makes the writes of ops, keeping the view of the kernel current. A
// failed write is recorded against the op's Service in st.Failed; the
// failures of writes no Service answers for are returned. Addresses are
// bound first and unbound last, one at a time; the IPVS writes go in two
// batches (IPVS.Apply): the virtual servers added or updated, then the
// real server writes of those that succeeded and the deletes. unrouted
// holds the routes that failed in this sync: its failures are added, and
// no virtual server is added in one of them on an address not bound.
func (r *Reconciler) apply(st *SyncStats, ops []ktypes.Op, unrouted map[netip.Prefix]error) []error {
	r.resync.touched(ops)
	a := &applyRun{r: r, st: st, ops: ops, unrouted: unrouted, unbound: map[netip.Addr]error{}, skip: map[ktypes.VSKey]bool{}}
	a.sortOut()
	a.virtualServers()
	a.realServersAndDeletes()
	r.clearUDP(a.clears)
	a.unbind()
	a.unroute()
	a.bindFailures()
	return a.orphan
}

// fail charges a failed write to its Service, or, when no Service answers
// for it, to the orphans retried with their own backoff.
func (a *applyRun) fail(op ktypes.Op, err error) {
	if op.Service == (types.NamespacedName{}) {
		a.orphan = append(a.orphan, err)
		a.r.orphan.add(op)
		return
	}
	a.st.Failed[op.Service] = errors.Join(a.st.Failed[op.Service], err)
}

// sortOut writes the routes and binds at once, in order, and sorts the
// other operations into their groups. A virtual server on an address whose
// bind failed, or in a range whose route failed on an address not bound,
// is not added: a crash would leak it.
func (a *applyRun) sortOut() {
	r := a.r
	for i := range a.ops {
		op := &a.ops[i]
		switch op.Kind {
		case ktypes.OpRoute:
			a.route(op)
		case ktypes.OpUnroute:
			a.unroutes = append(a.unroutes, i)
		case ktypes.OpBind:
			a.bind(op)
		case ktypes.OpAddVirtualServer, ktypes.OpUpdateVirtualServer:
			k := op.VirtualServer.VSKey
			if berr, ok := a.unbound[k.Address]; ok {
				a.skip[k] = true
				a.fail(*op, fmt.Errorf("%s: address not bound: %w", op, berr))
				continue
			}
			if p, rerr := routeFailure(a.unrouted, k.Address); rerr != nil && !r.kernel.Bound[k.Address] {
				a.skip[k] = true
				a.fail(*op, fmt.Errorf("%s: range %s not routed: %w", op, p, rerr))
				continue
			}
			a.vsOps = append(a.vsOps, i)
		case ktypes.OpUnbind:
			a.unbinds = append(a.unbinds, i)
		default:
			a.rest = append(a.rest, i)
		}
	}
}

// route adds a Service range's local route.
func (a *applyRun) route(op *ktypes.Op) {
	r := a.r
	err := r.write(a.st, *op, func() error {
		return r.links.AddLocalRoute(r.own.Interface, netlinkutil.LocalRoute{Prefix: op.Prefix})
	})
	if err != nil {
		a.unrouted[op.Prefix] = err
		a.orphan = append(a.orphan, fmt.Errorf("%s: %w", op, err))
		r.routeFailed = true
		return
	}
	r.kernel.Routes[op.Prefix] = true
}

// bind binds an address to the interface.
func (a *applyRun) bind(op *ktypes.Op) {
	r := a.r
	bindStart := r.clock.Now()
	err := r.write(a.st, *op, func() error { return r.links.AddAddress(r.own.Interface, op.Address) })
	a.st.Bind += r.clock.Since(bindStart)
	if err != nil {
		a.unbound[op.Address] = err
		return
	}
	r.kernel.Bound[op.Address] = true
}

// virtualServers writes the virtual servers added or updated, in one batch.
func (a *applyRun) virtualServers() {
	r := a.r
	for i, err := range r.applyIPVS(a.st, a.ops, a.vsOps) {
		op := &a.ops[a.vsOps[i]]
		r.resync.wrote(*op, err)
		if err == nil {
			r.kernel.PutVirtualServer(op.VirtualServer)
			continue
		}
		if op.Kind == ktypes.OpAddVirtualServer && (errors.Is(err, netlinkutil.ErrOutcomeUnknown) || errors.Is(err, syscall.EEXIST)) {
			// It may be (EEXIST: it is) in the kernel: the view keeps
			// it, so that its address stays bound (owned) and its
			// Service's removal deletes it, until a full read settles
			// it.
			r.kernel.PutVirtualServer(op.VirtualServer)
			r.lost = true
		}
		r.noteScheduler(op.VirtualServer.Scheduler, err)
		a.skip[op.VirtualServer.VSKey] = true
		a.fail(*op, fmt.Errorf("%s: %w", op, err))
	}
}

// realServersAndDeletes writes, in one batch, the real servers of the
// virtual servers that were written and the deletes; a UDP real server or
// virtual server deleted has its conntrack entries cleared. The writes of
// the virtual servers whose real servers move (sh, dh, mh: ktypes.Op.Move)
// go in a batch of their own, the one that holds expire_nodest_conn.
func (a *applyRun) realServersAndDeletes() {
	a.rest = slices.DeleteFunc(a.rest, func(i int) bool {
		return a.ops[i].Kind != ktypes.OpDeleteVirtualServer && a.skip[a.ops[i].VirtualServer.VSKey]
	})
	var moving map[ktypes.VSKey]bool
	for _, i := range a.rest {
		if a.ops[i].Move {
			if moving == nil {
				moving = map[ktypes.VSKey]bool{}
			}
			moving[a.ops[i].VirtualServer.VSKey] = true
		}
	}
	if moving == nil {
		a.writeRest(a.rest)
		return
	}
	var plain, moves []int
	for _, i := range a.rest {
		if moving[a.ops[i].VirtualServer.VSKey] {
			moves = append(moves, i)
		} else {
			plain = append(plain, i)
		}
	}
	a.writeRest(plain)
	a.writeRest(moves)
}

// writeRest makes the writes of ops[idx...] (real servers and deletes) and
// what follows each: the view of the kernel, UDP conntrack entries.
func (a *applyRun) writeRest(idx []int) {
	r := a.r
	type moved struct {
		vs ktypes.VSKey
		rs ktypes.RSKey
	}
	movedOut := map[moved]bool{} // a move's delete done
	for i, err := range r.applyIPVS(a.st, a.ops, idx) {
		op := &a.ops[idx[i]]
		k := op.VirtualServer.VSKey
		r.resync.wrote(*op, err)
		switch {
		case err != nil:
			a.fail(*op, fmt.Errorf("%s: %w", op, err))
			if op.Move && op.Kind == ktypes.OpAddRealServer && movedOut[moved{k, op.RealServer.RSKey}] && k.Protocol == ktypes.UDP {
				a.clearUDP(k, op.RealServer.RSKey) // deleted, not added again
			}
		case op.Kind == ktypes.OpDeleteRealServer && op.Move:
			movedOut[moved{k, op.RealServer.RSKey}] = true
		case op.Kind == ktypes.OpDeleteRealServer && k.Protocol == ktypes.UDP:
			a.clearUDP(k, op.RealServer.RSKey)
		case op.Kind == ktypes.OpDeleteVirtualServer:
			r.kernel.DeleteVirtualServer(k)
			if k.Protocol == ktypes.UDP {
				a.clearUDP(k, ktypes.RSKey{}) // its real servers went with it
			}
		}
	}
}

// unbind removes the addresses no longer wanted, except one that a failed
// delete left a virtual server on: it stays bound, so that the virtual
// server stays owned.
func (a *applyRun) unbind() {
	r := a.r
	for _, i := range a.unbinds {
		op := &a.ops[i]
		if r.kernel.OnAddress(op.Address) > 0 && !r.kernel.Routed(op.Address) {
			continue
		}
		if err := r.write(a.st, *op, func() error { return r.links.DeleteAddress(r.own.Interface, op.Address) }); err != nil {
			a.fail(*op, fmt.Errorf("%s: %w", op, err))
			continue
		}
		delete(r.kernel.Bound, op.Address)
	}
}

// unroute deletes the routes no longer wanted, except one that a failed
// write left a virtual server in on no bound address: the route stays, so
// that it stays owned.
func (a *applyRun) unroute() {
	r := a.r
	for _, i := range a.unroutes {
		op := &a.ops[i]
		if r.stranded(op.Prefix) {
			continue
		}
		err := r.write(a.st, *op, func() error {
			return r.links.DeleteLocalRoute(r.own.Interface, netlinkutil.LocalRoute{Prefix: op.Prefix})
		})
		if err != nil {
			a.orphan = append(a.orphan, fmt.Errorf("%s: %w", op, err))
			r.routeFailed = true
			continue
		}
		delete(r.kernel.Routes, op.Prefix)
	}
}

// bindFailures hands a failed bind that no Service's operation answers for
// (its Services' virtual servers are all in place) to the orphans.
func (a *applyRun) bindFailures() {
	for addr, err := range a.unbound {
		if !slices.ContainsFunc(a.ops, func(op ktypes.Op) bool {
			return op.Service != (types.NamespacedName{}) && op.VirtualServer.Address == addr
		}) {
			a.fail(ktypes.Op{Kind: ktypes.OpBind, Address: addr}, fmt.Errorf("bind %s: %w", addr, err))
		}
	}
}

// routeFailure returns a range of failed routes that holds a, and its
// error (nil if none).
func routeFailure(failed map[netip.Prefix]error, a netip.Addr) (netip.Prefix, error) {
	for p, err := range failed {
		if p.Contains(a) {
			return p, err
		}
	}
	return netip.Prefix{}, nil
}

// stranded reports whether a virtual server of the view lies in p on an
// address that is not bound: without p's route nothing would own it.
func (r *Reconciler) stranded(p netip.Prefix) bool {
	for k := range r.kernel.VirtualServers {
		if p.Contains(k.Address) && !r.kernel.Bound[k.Address] {
			return true
		}
	}
	return false
}

// applyChunk is how many IPVS writes one batch makes at most. A batch's
// writes are copied and encoded at once: the cold sync's 30,000 writes at
// 10,000 Services in one batch were about 12 MB alive at the first sync's
// collections, beside the iptables glue's writes.
const applyChunk = 2048

// applyIPVS makes the IPVS writes of ops[idx...] in batches of at most
// applyChunk, in order, counting and logging them like single writes, and
// returns each one's error (in idx's order).
func (r *Reconciler) applyIPVS(st *SyncStats, ops []ktypes.Op, idx []int) []error {
	if len(idx) == 0 {
		return nil
	}
	errs := make([]error, 0, len(idx))
	for chunk := range chunks(ops, idx) {
		writes := make([]ktypes.Op, len(chunk))
		for i, j := range chunk {
			writes[i] = ops[j]
		}
		errs = append(errs, r.ipvs.Apply(writes)...)
	}
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

// chunks cuts idx into runs of about applyChunk writes, never between two
// writes of one virtual server whose real servers move: a move's delete
// and add, and an mh draining real server's add and weight, go in one
// batch (see netlinkutil.IPVS.Apply).
func chunks(ops []ktypes.Op, idx []int) iter.Seq[[]int] {
	return func(yield func([]int) bool) {
		for len(idx) > 0 {
			n := min(applyChunk, len(idx))
			for n < len(idx) && ops[idx[n-1]].VirtualServer.Ordered() &&
				ops[idx[n]].VirtualServer.VSKey == ops[idx[n-1]].VirtualServer.VSKey {
				n++
			}
			if !yield(idx[:n]) {
				return
			}
			idx = idx[n:]
		}
	}
}

// clearUDP asks for the conntrack entries of UDP flows to a real server
// just removed (to every real server when rs is zero: the virtual server
// went) to be deleted once the writes are done.
func (a *applyRun) clearUDP(vs ktypes.VSKey, rs ktypes.RSKey) {
	if a.r.conntrack != nil {
		a.clears = append(a.clears, netlinkutil.UDPClear{VS: vs, RS: rs})
	}
}

// clearUDP deletes the conntrack entries of the UDP flows that clears name,
// so that a client that keeps its source port reaches the remaining real
// servers (or the virtual server programmed again) instead of the stale
// entry. One call for all of them: the kernel's table is read whole for
// each, and a namespace's UDP Services deleted at once were one read each.
// A failure is logged, not retried: the entries time out
// (--ipvs-udp-timeout) on their own.
func (r *Reconciler) clearUDP(clears []netlinkutil.UDPClear) {
	if r.conntrack == nil || len(clears) == 0 {
		return
	}
	n, err := r.conntrack.ClearUDP(clears...)
	if err != nil {
		r.log.Warn("clear conntrack entries of removed UDP real servers", zap.Int("clears", len(clears)),
			zap.Stringer("first", clears[0]), zap.Error(err))
		return
	}
	if ce := r.log.Check(zap.DebugLevel, "cleared conntrack entries"); ce != nil {
		ce.Write(zap.Int("clears", len(clears)), zap.Uint("entries", n))
	}
}

// write makes one kernel write, counting it and logging it at debug level.
func (r *Reconciler) write(st *SyncStats, op ktypes.Op, fn func() error) error {
	st.Writes++
	err := fn()
	if ce := r.log.Check(zap.DebugLevel, "kernel write"); ce != nil {
		ce.Write(zap.Stringer("op", op), zap.String("service", op.Service.String()), zap.Error(err))
	}
	return err
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
