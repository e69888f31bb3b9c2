// Package fake holds in-memory fakes of netlinkutil's kernel interfaces. They
// keep the state a kernel would, record every call, and can inject errors,
// so that tests assert the exact writes a sync makes and its recovery.
package fake

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Call is one recorded call, rendered as a short line such as
// "AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1" (a real server that
// is not NAT gets its method after the weight: "w=1 tunnel", "w=1 gue:6080").
type Call string

// ErrorFunc decides whether a call fails; it sees the rendered call.
type ErrorFunc func(call Call) error

// LatencyFunc tells how long a call takes, standing in for a slow kernel:
// it sees the call's name ("ListAllRealServers", "Apply",
// "NodeAddresses") and how many objects it read or wrote. The fake waits
// that long after the call, without holding its state: other calls go on
// meanwhile, as the kernel serves other sockets between the parts of a
// dump.
type LatencyFunc func(call string, n int) time.Duration

// latency is a fake's LatencyFunc, safe to set while calls run.
type latency struct {
	mu sync.Mutex
	fn LatencyFunc
}

func (l *latency) set(fn LatencyFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fn = fn
}

// wait sleeps for the call, when a LatencyFunc is set; n is called then.
func (l *latency) wait(call string, n func() int) {
	l.mu.Lock()
	fn := l.fn
	l.mu.Unlock()
	if fn != nil {
		time.Sleep(fn(call, n()))
	}
}

// How the writes are rendered, by the fakes and by the fault-injecting
// wrappers of the real kernel (faulty.go) alike.
const (
	callAddVS         = "AddVirtualServer %s"
	callUpdateVS      = "UpdateVirtualServer %s"
	callDeleteVS      = "DeleteVirtualServer %s"
	callAddRS         = "AddRealServer %s %s w=%d%s"
	callUpdateRS      = "UpdateRealServer %s %s w=%d%s"
	callDeleteRS      = "DeleteRealServer %s %s"
	callAddAddress    = "AddAddress %s %s"
	callDeleteAddress = "DeleteAddress %s %s"
	callAddRoute      = "AddLocalRoute %s %s"
	callDeleteRoute   = "DeleteLocalRoute %s %s"
	callEnsureDummy   = "EnsureDummy %s"
	callDeleteLink    = "DeleteLink %s"
	callSetTimeouts   = "SetTimeouts tcp=%s tcpfin=%s udp=%s"
)

// IPVS is a fake IPVS table.
type IPVS struct {
	mu sync.Mutex
	vs map[ktypes.VSKey]ktypes.VirtualServer
	rs map[ktypes.VSKey]map[ktypes.RSKey]ktypes.RealServer
	// order is each virtual server's real-server list, head first: the
	// kernel puts a new real server at the head (__ip_vs_update_dest),
	// an update leaves it in place, and a dump walks the list.
	order    map[ktypes.VSKey][]ktypes.RSKey
	timeouts netlinkutil.Timeouts
	calls    []Call
	counts   counts
	batches  []int // sizes of Apply calls
	// bulkSkips are left out of ListAllRealServers.
	bulkSkips map[ktypes.VSKey]bool
	inject    ErrorFunc
	// schedulers the fake kernel has; nil means every one.
	schedulers map[string]bool
	// stats are the virtual servers' counters (SetStats).
	stats map[ktypes.VSKey]ktypes.Stats
	slow  latency
}

// NewIPVS returns an empty fake IPVS table.
func NewIPVS() *IPVS {
	return &IPVS{
		vs:    map[ktypes.VSKey]ktypes.VirtualServer{},
		rs:    map[ktypes.VSKey]map[ktypes.RSKey]ktypes.RealServer{},
		order: map[ktypes.VSKey][]ktypes.RSKey{},
	}
}

// listed returns a virtual server's real servers in the kernel's list
// order (head first), as a dump reports them.
func (f *IPVS) listed(vs ktypes.VSKey) []ktypes.RealServer {
	out := make([]ktypes.RealServer, 0, len(f.order[vs]))
	for _, k := range f.order[vs] {
		out = append(out, f.rs[vs][k])
	}
	return out
}

var _ netlinkutil.IPVS = (*IPVS)(nil)

// SetSchedulers makes the fake kernel know only these schedulers: adding or
// updating a virtual server with another one fails with ENOENT, as the
// kernel does when it cannot load ip_vs_<name>. No names means all.
func (f *IPVS) SetSchedulers(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedulers = nil
	if len(names) > 0 {
		f.schedulers = map[string]bool{}
		for _, n := range names {
			f.schedulers[n] = true
		}
	}
}

// SetConns sets the connection counts that the kernel keeps for a real
// server (IPVS's ActiveConn and InActConn), as traffic would; the List
// calls report them. It fails when the real server is not in the table.
func (f *IPVS) SetConns(vs ktypes.VSKey, rs ktypes.RSKey, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.rs[vs][rs]
	if !ok {
		return fmt.Errorf("set connections of %s %s: %w", vs, rs, unix.ENOENT)
	}
	cur.ActiveConns, cur.InactiveConns = int32(active), int32(inactive)
	f.rs[vs][rs] = cur
	return nil
}

// knows reports whether the fake kernel has the scheduler. Callers hold f.mu.
func (f *IPVS) knows(sched string) bool {
	return sched != "" && (f.schedulers == nil || f.schedulers[sched])
}

// SetLatency makes the reads (ListVirtualServers, ListAllRealServers,
// ListRealServers) and Apply take the time fn tells, n being the virtual
// servers, real servers or writes; nil: no latency.
func (f *IPVS) SetLatency(fn LatencyFunc) { f.slow.set(fn) }

// InjectErrors installs f; nil removes it.
func (f *IPVS) InjectErrors(fn ErrorFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = fn
}

// Calls returns every call since the last Reset.
func (f *IPVS) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Writes returns the calls that change state (not List calls).
func (f *IPVS) Writes() []Call {
	var out []Call
	for _, c := range f.Calls() {
		if !isRead(c) {
			out = append(out, c)
		}
	}
	return out
}

// Reads returns the List calls.
func (f *IPVS) Reads() []Call {
	var out []Call
	for _, c := range f.Calls() {
		if isRead(c) {
			out = append(out, c)
		}
	}
	return out
}

func isRead(c Call) bool {
	return len(c) >= 4 && c[:4] == "List"
}

// ResetCalls forgets recorded calls and batches, keeping state.
func (f *IPVS) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls, f.batches = nil, nil
}

// record appends a call and returns the injected error for it, if any.
// Callers hold f.mu.
func (f *IPVS) record(format string, args ...any) error {
	return f.counts.record(&f.calls, f.inject, format, args...)
}

// KeepCalls with false makes the fake only count calls (Counts), not render and
// keep them, unless an injector needs to see them: for benchmarks, where
// rendering every call would cost more than the code measured.
func (f *IPVS) KeepCalls(keep bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.discard = !keep
}

// Counts returns the numbers of reads (List calls) and writes since the
// fake was made, kept or not.
func (f *IPVS) Counts() (reads, writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts.reads, f.counts.writes
}

// counts counts calls by kind; discard drops their rendering.
type counts struct {
	reads, writes int
	discard       bool
}

func (c *counts) record(calls *[]Call, inject ErrorFunc, format string, args ...any) error {
	if len(format) >= 4 && format[:4] == "List" {
		c.reads++
	} else {
		c.writes++
	}
	if c.discard && inject == nil {
		return nil
	}
	call := Call(fmt.Sprintf(format, args...))
	if !c.discard {
		*calls = append(*calls, call)
	}
	if inject != nil {
		return inject(call)
	}
	return nil
}

// Dump renders the whole table in a stable order, one line per virtual
// server followed by its real servers, for whole-state comparisons.
func (f *IPVS) Dump() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]ktypes.VSKey, 0, len(f.vs))
	for k := range f.vs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, ktypes.VSKey.Compare)
	var out []string
	for _, k := range keys {
		out = append(out, f.vs[k].String())
		rss := make([]ktypes.RealServer, 0, len(f.rs[k]))
		for _, r := range f.rs[k] {
			rss = append(rss, r)
		}
		slices.SortFunc(rss, func(a, b ktypes.RealServer) int { return a.RSKey.Compare(b.RSKey) })
		for _, r := range rss {
			out = append(out, fmt.Sprintf("  -> %s w=%d%s", r.RSKey, r.Weight, forwardNote(r)))
		}
	}
	return out
}

// ListVirtualServers implements netlinkutil.IPVS. Like the kernel, it
// reports the hashed flag on every service.
func (f *IPVS) ListVirtualServers() (out []ktypes.VirtualServer, err error) {
	defer f.slow.wait("ListVirtualServers", func() int { return len(out) })
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ListVirtualServers"); err != nil {
		return nil, err
	}
	out = make([]ktypes.VirtualServer, 0, len(f.vs))
	for _, v := range f.vs {
		v.Flags |= ktypes.FlagHashed
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b ktypes.VirtualServer) int { return a.VSKey.Compare(b.VSKey) })
	return out, nil
}

// SetStats sets a virtual server's counters, as traffic through it would.
func (f *IPVS) SetStats(vs ktypes.VSKey, st ktypes.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stats == nil {
		f.stats = map[ktypes.VSKey]ktypes.Stats{}
	}
	f.stats[vs] = st
}

// VirtualServerStats implements netlinkutil.StatsReader: the counters of
// every virtual server present (zero unless SetStats set them).
func (f *IPVS) VirtualServerStats() (map[ktypes.VSKey]ktypes.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("VirtualServerStats"); err != nil {
		return nil, err
	}
	out := make(map[ktypes.VSKey]ktypes.Stats, len(f.vs))
	for k := range f.vs {
		out[k] = f.stats[k]
	}
	return out, nil
}

// ListRealServers implements netlinkutil.IPVS.
func (f *IPVS) ListRealServers(vs ktypes.VSKey) (out []ktypes.RealServer, err error) {
	defer f.slow.wait("ListRealServers", func() int { return len(out) })
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ListRealServers %s", vs); err != nil {
		return nil, err
	}
	if _, ok := f.vs[vs]; !ok {
		return nil, fmt.Errorf("list destinations of %s: %w", vs, unix.ESRCH)
	}
	return f.listed(vs), nil
}

// Apply implements netlinkutil.IPVS: each write in order, as the single
// calls would make it (recorded alike, with the same injected errors), and
// the batch's size in Batches.
func (f *IPVS) Apply(writes []netlinkutil.Write) []error {
	defer f.slow.wait("Apply", func() int { return len(writes) })
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, len(writes))
	errs := make([]error, len(writes))
	for i, w := range writes {
		k := w.VirtualServer.VSKey
		switch w.Kind {
		case ktypes.OpAddVirtualServer:
			errs[i] = f.addVirtualServer(w.VirtualServer)
		case ktypes.OpUpdateVirtualServer:
			errs[i] = f.updateVirtualServer(w.VirtualServer)
		case ktypes.OpDeleteVirtualServer:
			errs[i] = f.deleteVirtualServer(k)
		case ktypes.OpAddRealServer:
			errs[i] = f.addRealServer(k, w.RealServer)
		case ktypes.OpUpdateRealServer:
			errs[i] = f.updateRealServer(k, w.RealServer)
		case ktypes.OpDeleteRealServer:
			errs[i] = f.deleteRealServer(k, w.RealServer.RSKey)
		default:
			errs[i] = fmt.Errorf("%s is not an IPVS write", w.Kind)
		}
	}
	return errs
}

// SkipInBulkRead makes ListAllRealServers leave these virtual servers out,
// as the kernel's bulk read may (see netlinkutil.IPVS); none: it leaves
// out nothing.
func (f *IPVS) SkipInBulkRead(keys ...ktypes.VSKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bulkSkips = map[ktypes.VSKey]bool{}
	for _, k := range keys {
		f.bulkSkips[k] = true
	}
}

// Batches returns the sizes of the Apply calls since the last ResetCalls.
func (f *IPVS) Batches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

// ListAllRealServers implements netlinkutil.IPVS.
func (f *IPVS) ListAllRealServers() (out map[ktypes.VSKey][]ktypes.RealServer, err error) {
	n := 0
	defer f.slow.wait("ListAllRealServers", func() int { return n })
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ListAllRealServers"); err != nil {
		return nil, err
	}
	out = make(map[ktypes.VSKey][]ktypes.RealServer, len(f.vs))
	for k := range f.vs {
		if f.bulkSkips[k] {
			continue
		}
		out[k] = f.listed(k)
		n += len(out[k])
	}
	return out, nil
}

// AddVirtualServer implements netlinkutil.IPVS.
func (f *IPVS) AddVirtualServer(vs ktypes.VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addVirtualServer(vs)
}

// The writes; callers hold f.mu.

func (f *IPVS) addVirtualServer(vs ktypes.VirtualServer) error {
	if err := f.record(callAddVS, vs); err != nil {
		return err
	}
	if _, ok := f.vs[vs.VSKey]; ok {
		return fmt.Errorf("add %s: %w", vs.VSKey, unix.EEXIST)
	}
	if !f.knows(vs.Scheduler) {
		return fmt.Errorf("add %s: scheduler %q: %w", vs.VSKey, vs.Scheduler, unix.ENOENT)
	}
	vs.Flags &= ktypes.FlagsCompared
	f.vs[vs.VSKey] = vs
	f.rs[vs.VSKey] = map[ktypes.RSKey]ktypes.RealServer{}
	return nil
}

// UpdateVirtualServer implements netlinkutil.IPVS.
func (f *IPVS) UpdateVirtualServer(vs ktypes.VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.updateVirtualServer(vs)
}

func (f *IPVS) updateVirtualServer(vs ktypes.VirtualServer) error {
	if err := f.record(callUpdateVS, vs); err != nil {
		return err
	}
	if _, ok := f.vs[vs.VSKey]; !ok {
		return fmt.Errorf("update %s: %w", vs.VSKey, unix.ESRCH)
	}
	if !f.knows(vs.Scheduler) {
		return fmt.Errorf("update %s: scheduler %q: %w", vs.VSKey, vs.Scheduler, unix.ENOENT)
	}
	vs.Flags &= ktypes.FlagsCompared
	f.vs[vs.VSKey] = vs
	return nil
}

// DeleteVirtualServer implements netlinkutil.IPVS.
func (f *IPVS) DeleteVirtualServer(vs ktypes.VSKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deleteVirtualServer(vs)
}

func (f *IPVS) deleteVirtualServer(vs ktypes.VSKey) error {
	if err := f.record(callDeleteVS, vs); err != nil {
		return err
	}
	if _, ok := f.vs[vs]; !ok {
		return fmt.Errorf("delete %s: %w", vs, unix.ESRCH)
	}
	delete(f.vs, vs)
	delete(f.stats, vs) // a new virtual server counts from 0
	delete(f.rs, vs)
	delete(f.order, vs)
	return nil
}

// AddRealServer implements netlinkutil.IPVS.
func (f *IPVS) AddRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addRealServer(vs, rs)
}

func (f *IPVS) addRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	if err := f.record(callAddRS, vs, rs.RSKey, rs.Weight, forwardNote(rs)); err != nil {
		return err
	}
	m, ok := f.rs[vs]
	if !ok {
		return fmt.Errorf("add destination to %s: %w", vs, unix.ESRCH)
	}
	if _, ok := m[rs.RSKey]; ok {
		return fmt.Errorf("add destination %s: %w", rs.RSKey, unix.EEXIST)
	}
	if err := checkForward(rs); err != nil {
		return err
	}
	m[rs.RSKey] = ktypes.RealServer{RSKey: rs.RSKey, Weight: rs.Weight, Forward: rs.Forward, TunPort: rs.TunPort}
	f.order[vs] = slices.Insert(f.order[vs], 0, rs.RSKey)
	return nil
}

// UpdateRealServer implements netlinkutil.IPVS.
func (f *IPVS) UpdateRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.updateRealServer(vs, rs)
}

func (f *IPVS) updateRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	if err := f.record(callUpdateRS, vs, rs.RSKey, rs.Weight, forwardNote(rs)); err != nil {
		return err
	}
	m, ok := f.rs[vs]
	if !ok {
		return fmt.Errorf("update destination of %s: %w", vs, unix.ESRCH)
	}
	if _, ok := m[rs.RSKey]; !ok {
		return fmt.Errorf("update destination %s: %w", rs.RSKey, unix.ENOENT)
	}
	if err := checkForward(rs); err != nil {
		return err
	}
	cur := m[rs.RSKey] // the kernel keeps a destination's connections
	cur.Weight, cur.Forward, cur.TunPort = rs.Weight, rs.Forward, rs.TunPort
	m[rs.RSKey] = cur
	return nil
}

// forwardNote renders a real server's method after its weight as the
// calls and Dump show it: nothing for NAT, " tunnel", " gue:PORT".
func forwardNote(rs ktypes.RealServer) string {
	if rs.Forward == ktypes.ForwardNAT {
		return ""
	}
	return " " + rs.ForwardString()
}

// checkForward refuses what the kernel refuses: GUE without a port (the
// kernel's ip_vs_add_dest and ip_vs_edit_dest answer EINVAL), and what the
// real adapter refuses to encode (a method it does not know).
func checkForward(rs ktypes.RealServer) error {
	switch {
	case rs.Forward == ktypes.ForwardGUE && rs.TunPort == 0:
		return fmt.Errorf("destination %s: GUE without a port: %w", rs.RSKey, unix.EINVAL)
	case rs.Forward > ktypes.ForwardGUE:
		return fmt.Errorf("destination %s: forwarding method %s is not one ipvs-proxy writes", rs.RSKey, rs.Forward)
	}
	return nil
}

// DeleteRealServer implements netlinkutil.IPVS.
func (f *IPVS) DeleteRealServer(vs ktypes.VSKey, rs ktypes.RSKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deleteRealServer(vs, rs)
}

func (f *IPVS) deleteRealServer(vs ktypes.VSKey, rs ktypes.RSKey) error {
	if err := f.record(callDeleteRS, vs, rs); err != nil {
		return err
	}
	m, ok := f.rs[vs]
	if !ok {
		return fmt.Errorf("delete destination of %s: %w", vs, unix.ESRCH)
	}
	if _, ok := m[rs]; !ok {
		return fmt.Errorf("delete destination %s: %w", rs, unix.ENOENT)
	}
	delete(m, rs)
	f.order[vs] = slices.DeleteFunc(f.order[vs], func(k ktypes.RSKey) bool { return k == rs })
	return nil
}

// SetTimeouts implements netlinkutil.IPVS.
func (f *IPVS) SetTimeouts(t netlinkutil.Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(callSetTimeouts, t.TCP, t.TCPFin, t.UDP); err != nil {
		return err
	}
	f.timeouts = t
	return nil
}

// Close implements netlinkutil.IPVS.
func (f *IPVS) Close() {}

// Links is a fake of netlinkutil.Links.
type Links struct {
	mu     sync.Mutex
	links  map[string]map[netip.Addr]bool                     // dummy links and their addresses
	infos  map[string]netlinkutil.LinkInfo                    // what each link is (EnsureDummy's: marked dummies)
	routes map[string]map[netip.Prefix]netlinkutil.LocalRoute // local routes through each link
	node   []netip.Addr                                       // addresses of the node's other links
	calls  []Call
	counts counts
	inject ErrorFunc
	// Removals announced, like the kernel's, for every removal (the
	// watcher's own included), held until Deliver.
	watchers []linkWatcher
	pending  []netlinkutil.Removal
	// nodeWatchers are told of SetNodeAddresses at once.
	nodeWatchers []func()
	slow         latency
}

type linkWatcher struct {
	ctx  context.Context
	link string
	fn   func(netlinkutil.Removal)
}

var (
	_ netlinkutil.Links              = (*Links)(nil)
	_ netlinkutil.RemovalWatcher     = (*Links)(nil)
	_ netlinkutil.NodeAddressWatcher = (*Links)(nil)
)

// WatchNodeAddresses implements netlinkutil.NodeAddressWatcher: changed
// is called by SetNodeAddresses.
func (l *Links) WatchNodeAddresses(_ context.Context, changed func(), _ func(error), _ ...string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodeWatchers = append(l.nodeWatchers, changed)
	return nil
}

// SetNodeAddresses replaces the node's addresses (other than the dummy
// links') and tells the watchers, as the kernel announces a change.
func (l *Links) SetNodeAddresses(addrs ...netip.Addr) {
	l.mu.Lock()
	l.node = slices.Clone(addrs)
	watchers := slices.Clone(l.nodeWatchers)
	l.mu.Unlock()
	for _, w := range watchers {
		w()
	}
}

// WatchRemovals implements netlinkutil.RemovalWatcher: the removals of
// link are queued as they happen and handed to fn by Deliver.
func (l *Links) WatchRemovals(ctx context.Context, link string, fn func(netlinkutil.Removal), _ func(error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchers = append(l.watchers, linkWatcher{ctx: ctx, link: link, fn: fn})
	return nil
}

// announceLocked queues a removal for the watchers; l.mu is held.
func (l *Links) announceLocked(r netlinkutil.Removal) {
	if len(l.watchers) > 0 {
		l.pending = append(l.pending, r)
	}
}

// Deliver hands the queued removals to the watchers of their links (whose
// context has not ended), in order, and returns how many it delivered.
func (l *Links) Deliver() int {
	l.mu.Lock()
	pending, watchers := l.pending, slices.Clone(l.watchers)
	l.pending = nil
	l.mu.Unlock()
	n := 0
	for _, r := range pending {
		for _, w := range watchers {
			if w.link == r.Link && w.ctx.Err() == nil {
				w.fn(r)
				n++
			}
		}
	}
	return n
}

// NewLinks returns a fake whose node has the given addresses.
func NewLinks(nodeAddrs ...netip.Addr) *Links {
	return &Links{links: map[string]map[netip.Addr]bool{}, infos: map[string]netlinkutil.LinkInfo{}, routes: map[string]map[netip.Prefix]netlinkutil.LocalRoute{}, node: nodeAddrs}
}

// SetLatency makes NodeAddresses and ListAddresses take the time fn
// tells, n being the addresses the kernel's dump holds (the node's and
// every link's: a dump is not filtered by the kernel), and each address
// write (AddAddress, DeleteAddress) the time fn tells for n=1; nil: no
// latency.
func (l *Links) SetLatency(fn LatencyFunc) { l.slow.set(fn) }

// dumped is the number of addresses a dump of every address holds.
// Callers hold l.mu.
func (l *Links) dumped() int {
	n := len(l.node)
	for _, addrs := range l.links {
		n += len(addrs)
	}
	return n
}

// InjectErrors installs f; nil removes it.
func (l *Links) InjectErrors(fn ErrorFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inject = fn
}

// Writes returns the state-changing calls since the last ResetCalls.
func (l *Links) Writes() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Call
	for _, c := range l.calls {
		if !isRead(c) {
			out = append(out, c)
		}
	}
	return out
}

// Reads returns the List calls since the last ResetCalls.
func (l *Links) Reads() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Call
	for _, c := range l.calls {
		if isRead(c) {
			out = append(out, c)
		}
	}
	return out
}

// ResetCalls forgets recorded calls.
func (l *Links) ResetCalls() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = nil
}

// Routes returns the local routes through a link, sorted by prefix.
func (l *Links) Routes(name string) []netlinkutil.LocalRoute {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sortedRoutes(name)
}

func (l *Links) sortedRoutes(name string) []netlinkutil.LocalRoute {
	var out []netlinkutil.LocalRoute
	for _, r := range l.routes[name] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b netlinkutil.LocalRoute) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	return out
}

// ListLocalRoutes implements netlinkutil.Links.
func (l *Links) ListLocalRoutes(name string) ([]netlinkutil.LocalRoute, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record("ListLocalRoutes %s", name); err != nil {
		return nil, err
	}
	return l.sortedRoutes(name), nil
}

// AddLocalRoute implements netlinkutil.Links: it adds or replaces the
// route of r's prefix.
func (l *Links) AddLocalRoute(name string, r netlinkutil.LocalRoute) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record(callAddRoute, name, r); err != nil {
		return err
	}
	if _, ok := l.links[name]; !ok {
		return fmt.Errorf("link %s not found", name)
	}
	if l.routes[name] == nil {
		l.routes[name] = map[netip.Prefix]netlinkutil.LocalRoute{}
	}
	r.Prefix = r.Prefix.Masked()
	l.routes[name][r.Prefix] = r
	return nil
}

// DeleteLocalRoute implements netlinkutil.Links.
func (l *Links) DeleteLocalRoute(name string, r netlinkutil.LocalRoute) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record(callDeleteRoute, name, r.Prefix); err != nil {
		return err
	}
	delete(l.routes[name], r.Prefix.Masked())
	return nil
}

// Addresses returns the addresses of a link, sorted.
func (l *Links) Addresses(name string) []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sorted(name)
}

// sorted returns a link's addresses in order. Callers hold l.mu.
func (l *Links) sorted(name string) []netip.Addr {
	var out []netip.Addr
	for a := range l.links[name] {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// KeepCalls with false makes the fake only count calls (see IPVS.KeepCalls).
func (l *Links) KeepCalls(keep bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts.discard = !keep
}

// HasLink reports whether a link exists.
func (l *Links) HasLink(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.links[name]
	return ok
}

func (l *Links) record(format string, args ...any) error {
	return l.counts.record(&l.calls, l.inject, format, args...)
}

// EnsureDummy implements netlinkutil.Links. An existing link is not a
// write, so it records "ListLink" then.
func (l *Links) EnsureDummy(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.links[name]; ok {
		if info := l.infos[name]; info.Type == "dummy" {
			info.Alias = netlinkutil.OwnerAlias // as the kernel's marks it
			l.infos[name] = info
		}
		return l.record("ListLink %s", name)
	}
	if err := l.record(callEnsureDummy, name); err != nil {
		return err
	}
	l.links[name] = map[netip.Addr]bool{}
	l.infos[name] = netlinkutil.LinkInfo{Type: "dummy", Alias: netlinkutil.OwnerAlias}
	return nil
}

// AddLink makes a link as another tool would (no write recorded):
// info.Type "dummy" without netlinkutil.OwnerAlias is a dummy that
// ipvs-proxy did not make.
func (l *Links) AddLink(name string, info netlinkutil.LinkInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.links[name] = map[netip.Addr]bool{}
	l.infos[name] = info
}

// LinkInfo implements netlinkutil.Links.
func (l *Links) LinkInfo(name string) (netlinkutil.LinkInfo, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record("ListLinkInfo %s", name); err != nil {
		return netlinkutil.LinkInfo{}, false, err
	}
	info, ok := l.infos[name]
	return info, ok, nil
}

// DeleteLink implements netlinkutil.Links.
func (l *Links) DeleteLink(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record(callDeleteLink, name); err != nil {
		return err
	}
	if addrs, ok := l.links[name]; ok {
		for _, a := range l.sorted(name) {
			if addrs[a] {
				l.announceLocked(netlinkutil.Removal{Link: name, Addr: a})
			}
		}
		l.announceLocked(netlinkutil.Removal{Link: name})
	}
	delete(l.links, name)
	delete(l.infos, name)
	delete(l.routes, name) // the kernel drops a link's routes with it
	return nil
}

// ListAddresses implements netlinkutil.Links.
func (l *Links) ListAddresses(name string) ([]netip.Addr, error) {
	n := 0
	defer l.slow.wait("ListAddresses", func() int { return n })
	l.mu.Lock()
	defer l.mu.Unlock()
	n = l.dumped()
	if err := l.record("ListAddresses %s", name); err != nil {
		return nil, err
	}
	return l.sorted(name), nil
}

// AddAddress implements netlinkutil.Links.
func (l *Links) AddAddress(name string, a netip.Addr) error {
	defer l.slow.wait("AddAddress", func() int { return 1 })
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record(callAddAddress, name, a); err != nil {
		return err
	}
	addrs, ok := l.links[name]
	if !ok {
		return fmt.Errorf("link %s not found", name)
	}
	addrs[a] = true
	return nil
}

// DeleteAddress implements netlinkutil.Links.
func (l *Links) DeleteAddress(name string, a netip.Addr) error {
	defer l.slow.wait("DeleteAddress", func() int { return 1 })
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.record(callDeleteAddress, name, a); err != nil {
		return err
	}
	if l.links[name][a] {
		l.announceLocked(netlinkutil.Removal{Link: name, Addr: a})
	}
	delete(l.links[name], a)
	if a.Is4() {
		for left := range l.links[name] {
			if left.Is4() {
				return nil
			}
		}
		// Like the kernel (fib_disable_ip): the link's last IPv4
		// address takes the IPv4 routes through the link along.
		for p := range l.routes[name] {
			if p.Addr().Is4() {
				delete(l.routes[name], p)
			}
		}
	}
	return nil
}

// NodeAddresses implements netlinkutil.Links: the node's addresses and,
// like the kernel's, those of every dummy link not named in exclude (in
// link name order).
func (l *Links) NodeAddresses(exclude ...string) ([]netip.Addr, error) {
	n := 0
	defer l.slow.wait("NodeAddresses", func() int { return n })
	l.mu.Lock()
	defer l.mu.Unlock()
	n = l.dumped()
	if err := l.record("ListNodeAddresses"); err != nil {
		return nil, err
	}
	out := slices.Clone(l.node)
	names := make([]string, 0, len(l.links))
	for name := range l.links {
		if !slices.Contains(exclude, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		out = append(out, l.sorted(name)...)
	}
	return out, nil
}

// Conntrack is a fake of netlinkutil.Conntrack that records its calls (one
// per ClearUDP, naming its clears in order) and fails them with Err.
type Conntrack struct {
	mu    sync.Mutex
	calls []Call
	// Err, when set, is returned by every ClearUDP (after recording it).
	Err error
}

var _ netlinkutil.Conntrack = (*Conntrack)(nil)

// ClearUDP implements netlinkutil.Conntrack.
func (c *Conntrack) ClearUDP(clears ...netlinkutil.UDPClear) (uint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, len(clears))
	for i, cl := range clears {
		names[i] = cl.String()
	}
	c.calls = append(c.calls, Call("ClearUDP "+strings.Join(names, ", ")))
	return 0, c.Err
}

// Calls returns the recorded calls.
func (c *Conntrack) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}
