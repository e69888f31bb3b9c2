// Package agent is ipvs-proxy's running agent: it watches Services,
// EndpointSlices and its Node, builds each changed Service's plan
// (model.Build, a pure function), hands the plans to the IPVS reconciler
// (proxier/reconciler) and the consumers (proxier/consumer: the iptables
// glue, the health-check server), and drives them from one sync loop, with
// metrics, health and Events.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/background"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Config configures a Proxier.
type Config struct {
	NodeName  string
	Interface string
	Scheduler scheduler.Spec
	// NodePortAddresses limits node ports to addresses in these prefixes;
	// empty means every node address.
	NodePortAddresses []netip.Prefix
	NodePortRange     model.PortRange
	ExcludeCIDRs      []netip.Prefix
	IPv4, IPv6        bool
	// NodeWithoutIPv6: IPv6 was asked for but the node's kernel has none
	// (OnNodeIPv6): IPv6 is off, and each Service with IPv6 addresses is
	// told so.
	NodeWithoutIPv6 bool
	// APIServer are the apiserver's addresses (APIServerAddresses): never
	// an externalIP's or a LoadBalancer IP's virtual server.
	APIServer []netip.Addr
	// ExternalIPCIDRs, when not empty, are the only prefixes an
	// externalIP may be in (model.BuildConfig.ExternalIPCIDRs).
	ExternalIPCIDRs []netip.Prefix
	// Limits bound what one Service may ask of the node (model.Limits).
	Limits model.Limits
	// DSR is the node's direct server return (--direct-server-return).
	DSR model.DSRConfig
	// TunnelSettle is how long a virtual server newly tunnelling to a
	// real server stays NAT first, while the endpoint's node sets up the
	// tunnel's end (tunnelSettle); default DefaultTunnelSettle.
	TunnelSettle  time.Duration
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	// RetryBase is the first retry delay of a failed Service or consumer,
	// doubled per failure up to SyncPeriod; default 1s.
	RetryBase time.Duration
	// ResyncSlice is the number of virtual servers a periodic full resync
	// checks per sync (Config.ResyncSlice; default 500).
	ResyncSlice int
	// Clock defaults to the real clock (tests pass a fake one).
	Clock clock.WithTicker
	// Background starts the periodic resync's read of the kernel off the
	// sync loop (background.LowPriority in the agent); default a plain
	// goroutine.
	Background background.Start
	// AdoptInterface is kube-proxy's interface when taking a node over from
	// it (model.Ownership.Adopt); empty otherwise.
	AdoptInterface string
	// RouteServiceRanges routes the Service ranges as local through the
	// interface instead of binding one address per clusterIP (IPv4; see
	// RoutableRanges): ServiceRanges when given, else the cluster's
	// ServiceCIDR objects, watched.
	RouteServiceRanges bool
	ServiceRanges      []netip.Prefix
}

// Proxier watches Services, EndpointSlices and its Node and keeps the kernel
// in line with them. It is the assembly of four parts, each with its own
// state: the change tracker (what the informers delivered and what changed),
// the sync runner (when syncs run), the IPVS reconciler with the consumers
// (what a sync applies), and the reporter (metrics, health, Events).
type Proxier struct {
	cfg       Config
	clock     clock.WithTicker
	client    kube.Client
	links     netlinkutil.Links
	log       *zap.Logger
	tracker   *tracker
	runner    *runner
	rec       *reconciler.Reconciler
	consumers *consumerSet
	reporter  *reporter
	failures  *serviceFailures // Services failing outside the reconciler
	traffic   *trafficIndex    // nil unless EnableServiceTraffic
	settle    *tunnelSettle    // the tunnels IPVS waits to write
	batch     syncBatch        // the bound on the changes a sync takes
	// statusMu makes a sync's outcome (the reporter's health, the
	// tracker's pendingSince) one change as Status sees it.
	statusMu sync.Mutex
	// listed is closed once the initial lists of Services, slices and the
	// Node are in (Listed).
	listed chan struct{}
	// prepare runs beside the initial lists (SetPrepare).
	prepare func(context.Context) error
}

// New returns a Proxier. recorder may be nil (no Events).
func New(cfg Config, client kube.Client, ipvs netlinkutil.IPVS, links netlinkutil.Links,
	recorder record.EventRecorder, metrics *Metrics, log *zap.Logger) *Proxier {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = time.Second
	}
	retryMax := max(cfg.SyncPeriod, cfg.RetryBase)
	rcfg := reconciler.Config{Ownership: cfg.Ownership(), RetryBase: cfg.RetryBase, RetryMax: retryMax, Clock: cfg.Clock,
		ResyncSlice: cfg.ResyncSlice}
	run := newRunner(cfg.Clock, cfg.MinSyncPeriod, cfg.SyncPeriod, log)
	if cfg.Background != nil {
		run.background = cfg.Background
	}
	readAddresses := func() ([]netip.Addr, error) {
		return links.NodeAddresses(netlinkutil.ProxyInterfaces(cfg.Interface)...)
	}
	return &Proxier{
		cfg: cfg, clock: cfg.Clock, client: client, links: links, log: log,
		tracker:   newTracker(cfg, readAddresses, run.kickNews, metrics, log),
		runner:    run,
		rec:       reconciler.NewReconciler(ipvs, links, rcfg, log),
		consumers: newConsumerSet(cfg.RetryBase, retryMax, log),
		reporter:  newReporter(metrics, recorder, cfg.NodeName, cfg.Clock, log),
		failures:  newServiceFailures(),
		settle:    newTunnelSettle(cfg.TunnelSettle),
		listed:    make(chan struct{}),
	}
}

// SetResyncReader gives the periodic full resync handles of its own to
// read the kernel with, off the sync loop, so that changes are not held up
// by the read; call it before Run. They must not be the handles given to
// New. Without them the resync reads in the loop.
func (p *Proxier) SetResyncReader(ipvs netlinkutil.IPVS, links netlinkutil.Links) {
	p.rec.SetResyncReader(ipvs, links)
}

// SetConntrack makes syncs clear the conntrack entries of removed UDP real
// servers; call it before Run.
func (p *Proxier) SetConntrack(c netlinkutil.Conntrack) { p.rec.SetConntrack(c) }

// AddFinisher adds a task that runs once, right after the first sync in
// which every write, read and consumer succeeded (the node fully
// programmed); if it fails, it runs again after the next such sync. Taking
// a node over from kube-proxy removes kube-proxy's leftovers this way.
// Call it before Run.
func (p *Proxier) AddFinisher(name string, fn func(ctx context.Context) error) {
	p.consumers.finishers = append(p.consumers.finishers, finisher{name, fn})
}

// AddConsumer adds a consumer of plans; call it before Run.
func (p *Proxier) AddConsumer(c consumer.Consumer) { p.consumers.add(c, p.runner.kick) }

// Status is the proxier's health as seen by /healthz.
type Status struct {
	LastSuccessfulSync time.Time
	LastError          error
	Pending            int
	// PendingSince is when the oldest change not yet applied to the
	// kernel was received, or when syncs began to fail (kube-proxy's
	// "oldest pending queued"); zero when everything received is applied.
	PendingSince time.Time
	// NodeEligible: this node's Node object exists, is not being deleted
	// and has no ToBeDeletedByClusterAutoscaler taint (kube-proxy's
	// /healthz rule, so that load balancers drain a node going away).
	NodeEligible bool
	// Failing names the node-wide parts whose last sync failed ("kernel
	// read", "node addresses", a consumer's or a finisher's name): generic
	// names, which tell no Service, address or URL; LastError has the
	// details. Nil when the last sync succeeded.
	Failing []string
	// LoopHeartbeat is when the sync loop last started or finished a
	// sync; zero until it begins (the initial lists and preparation).
	LoopHeartbeat time.Time
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to delete.
const ToBeDeletedTaint = model.ToBeDeletedTaint

// Status returns the sync status.
func (p *Proxier) Status() Status {
	p.statusMu.Lock()
	defer p.statusMu.Unlock()
	h := p.reporter.health()
	pending, since, eligible := p.tracker.status()
	return Status{LastSuccessfulSync: h.lastOK, LastError: h.lastErr, Failing: h.failing, Pending: pending, PendingSince: since,
		NodeEligible: eligible, LoopHeartbeat: p.runner.heartbeat()}
}

// ServiceProblems returns, as of the last sync, the status of every
// Service whose writes are failing or that lost a conflict, sorted by name.
func (p *Proxier) ServiceProblems() []reconciler.ServiceStatus { return p.reporter.serviceProblems() }

// SetPrepare has Run call prepare beside the initial lists, once the
// informers have started: the agent prepares the kernel then (sysctls, the
// interface, the iptables glue), which the lists do not need, and adds its
// consumers. The first sync waits for it; its error ends Run. Call it
// before Run.
func (p *Proxier) SetPrepare(prepare func(context.Context) error) { p.prepare = prepare }

// Listed is closed once Run has the initial lists of Services,
// EndpointSlices and the Node, just before its first sync.
func (p *Proxier) Listed() <-chan struct{} { return p.listed }

// Run watches the API and syncs until ctx ends.
func (p *Proxier) Run(ctx context.Context) error {
	var infs informerSet
	defer infs.wait()
	ctx, stop := context.WithCancel(ctx) // stops the informers when Run ends early
	defer stop()
	synced, err := p.tracker.watch(ctx, p.client, &infs, p.cfg.RouteServiceRanges && len(p.cfg.ServiceRanges) == 0)
	if err != nil {
		return err
	}
	infs.start(ctx)
	if err := p.waitListedAndPrepared(ctx, synced); err != nil {
		return err
	}
	p.log.Info("initial list received", zap.Int("services", p.tracker.count()))
	select {
	case <-p.listed: // a second Run
	default:
		close(p.listed)
	}
	p.watchRemovals(ctx)
	p.watchNodeAddresses(ctx)
	p.runner.run(ctx, p, p.rec)
	return nil
}

// waitListedAndPrepared waits for the initial lists while the kernel is
// prepared beside them (SetPrepare); a failed preparation stops the wait.
// It waits until the handlers, not only the caches, have seen every
// existing object: a first full sync on part of the Services would delete
// the others' virtual servers and cut their connections.
func (p *Proxier) waitListedAndPrepared(ctx context.Context, synced []cache.InformerSynced) error {
	listing, listFailed := context.WithCancel(ctx)
	defer listFailed()
	prepared := make(chan error, 1)
	if p.prepare == nil {
		prepared <- nil
	} else {
		go func() {
			err := p.prepare(ctx)
			if err != nil {
				listFailed()
			}
			prepared <- err
		}()
	}
	p.log.Info("waiting for the initial list of Services, EndpointSlices and the Node")
	listed := cache.WaitForCacheSync(listing.Done(), synced...)
	if err := <-prepared; err != nil { // always waited for: it may hold the kernel's handles
		return err
	}
	if !listed {
		return fmt.Errorf("initial list of Services, EndpointSlices and the Node: %w", ctx.Err())
	}
	return nil
}

// watchRemovals has the kernel tell the loop when an address is removed
// from the interface or the interface itself is removed (someone's `ip
// addr del`, `ip link del`), so that the next sync repairs it at once
// instead of the periodic resync. Without notifications (links that send
// none, a subscription refused) the resync still repairs it.
func (p *Proxier) watchRemovals(ctx context.Context) {
	w, ok := p.links.(netlinkutil.RemovalWatcher)
	if !ok {
		return
	}
	err := w.WatchRemovals(ctx, p.cfg.Interface, p.tracker.kernelRemoved, func(err error) {
		p.log.Warn("kernel notifications of removed addresses lost; the periodic resync repairs what they miss", zap.Error(err))
	})
	if err != nil {
		p.log.Warn("no kernel notifications of removed addresses; the periodic resync repairs them", zap.Error(err))
	}
}

// watchNodeAddresses has the kernel tell the loop when the node's own
// addresses change (a DHCP renewal, an address added by hand), so that
// node ports and the node addresses the plans use follow at the next sync
// instead of the periodic full one.
func (p *Proxier) watchNodeAddresses(ctx context.Context) {
	w, ok := p.links.(netlinkutil.NodeAddressWatcher)
	if !ok {
		return
	}
	err := w.WatchNodeAddresses(ctx, p.tracker.nodeAddressesChanged, func(err error) {
		p.log.Warn("kernel notifications of node address changes lost; the periodic resync reads them", zap.Error(err))
	}, netlinkutil.ProxyInterfaces(p.cfg.Interface)...)
	if err != nil {
		p.log.Warn("no kernel notifications of node address changes; the periodic resync reads them", zap.Error(err))
	}
}

// takeRemovals hands the reported removals to the reconciler: a removed
// interface makes this sync full, removed addresses still wanted are bound
// again by it. It reports whether the sync must be full.
func (p *Proxier) takeRemovals() bool {
	addrs, link := p.tracker.takeRemovals()
	if link {
		p.log.Info("the kernel reports the interface removed: creating it again", zap.String("interface", p.cfg.Interface))
		p.rec.RequestFull()
		return true
	}
	if n := p.rec.AddressesRemoved(addrs); n > 0 {
		p.log.Info("the kernel reports bound addresses removed: binding them again", zap.String("interface", p.cfg.Interface),
			zap.Int("addresses", n))
	}
	return false
}

// changesWaiting reports whether Service changes wait for a sync.
func (p *Proxier) changesWaiting() bool {
	pending, _, _ := p.tracker.status()
	return pending > 0
}

// backlogged reports whether the last sync left changes for the next
// (syncBatch's bound).
func (p *Proxier) backlogged() bool { return p.tracker.backlogged() }

// nextRetry is when the earliest retry, or tunnel settling, is due (zero:
// none waits).
func (p *Proxier) nextRetry() time.Time {
	t := p.consumers.nextRetry(p.rec.NextRetry())
	if s := p.settle.next(); !s.IsZero() && (t.IsZero() || s.Before(t)) {
		t = s
	}
	return t
}

// SyncOnce is one sync, in steps: snapshot the inputs, build the plans of
// the changed Services, apply them to the kernel, sync the consumers,
// record the outcome. full rebuilds every plan and re-reads the kernel.
func (p *Proxier) SyncOnce(full bool) error {
	start := p.clock.Now()
	for _, n := range p.settle.settled(start) {
		p.tracker.markDirty(n, start) // its tunnels are written now
	}
	full = p.takeRemovals() || full || p.rec.FullDue()
	// A full sync reads the node's addresses again, unless it adopts a
	// resync's read off the loop, which has them (tracker.offLoopAddresses:
	// read again in the loop if they differ, as the read may be older).
	in, nodeErr := p.tracker.snapshot(full && !p.rec.AdoptsRead(full), p.batch.limit())
	p.build(in)
	built := p.clock.Since(start)
	if !full && !p.rec.Pending() && len(in.services) == 0 && !p.consumers.due(p.clock.Now()) {
		// Nothing to do now; but a node-wide part that still fails (the
		// glue between its retries) keeps its changes waiting, and
		// /healthz's clock running.
		if len(p.reporter.health().failing) == 0 {
			p.tracker.settleIfIdle()
		}
		return nodeErr
	}
	if len(in.services) > 0 {
		p.consumers.yield() // changes first; the next sync, at once, repairs
	}
	a := p.apply(full)
	a.build, a.backlog = built, in.backlog
	if a.stats.NodeAddresses != nil && p.tracker.offLoopAddresses(a.stats.NodeAddresses) {
		p.runner.kick() // the rebuild or the read again they ask for
	}
	recErr := a.recErr
	nodeErr = errors.Join(nodeErr, a.consumerErr)
	if recErr == nil && nodeErr == nil && len(p.consumers.finishers) > 0 {
		nodeErr = p.consumers.runFinishers()
	}
	if !full && !in.rebuilt {
		// The build and the IPVS writes grow with the Services; the
		// consumers' time, beside them, holds the glue's periodic check.
		p.batch.observe(built+a.stats.Duration, len(in.services))
	}
	healthy := p.recordOutcome(start, a, recErr, nodeErr)
	if p.tracker.backlogged() || (healthy && (p.rec.Pending() || p.consumers.due(p.clock.Now()))) {
		p.runner.kick()
	}
	return errors.Join(recErr, nodeErr)
}

// recordOutcome has the reporter record a sync and the tracker settle what
// it applied (or keep it pending), as one change for Status; it reports
// whether the node is healthy.
func (p *Proxier) recordOutcome(start time.Time, a applied, recErr, nodeErr error) bool {
	p.statusMu.Lock()
	defer p.statusMu.Unlock()
	p.reportFailures()
	if healthErr := p.reporter.record(start, a.stats, syncTimes{build: a.build, consumers: a.consumers, backlog: a.backlog}, failingOutcome{p.rec, p.failures}, recErr, nodeErr); healthErr != nil {
		p.tracker.queued()
		return false
	}
	p.tracker.settle(start, p.rec.FullDue() || p.consumers.retrying())
	return true
}

// apply runs the reconciler's sync and the consumers'. The consumers (the
// iptables glue above all: ipset and iptables children) sync beside the
// reconciler's netlink writes, not after them: they are driven by the
// same plans and none reads what the other writes. At 10,000 Services
// cold, the two parts took 3.1 and 2.3 s one after the other. Those that
// must follow IPVS (AfterReconciler) sync once both are done.
func (p *Proxier) apply(full bool) applied {
	known := len(p.rec.UnavailableSchedulers())
	d := p.rec.Decide(full)
	var consumerErr error
	var consumers time.Duration
	consumersDone := make(chan struct{})
	go func() {
		defer close(consumersDone)
		consumersStart := p.clock.Now()
		consumerErr = p.consumers.sync(consumersStart, d.Full, false)
		consumers = p.clock.Since(consumersStart)
	}()
	st, err := p.rec.SyncAs(d)
	<-consumersDone
	if len(p.rec.UnavailableSchedulers()) > known {
		p.tracker.rebuildAll()
	}
	afterStart := p.clock.Now()
	consumerErr = errors.Join(consumerErr, p.consumers.sync(afterStart, d.Full, true))
	consumers += p.clock.Since(afterStart)
	p.failures.fromConsumers(p.consumers.list)
	return applied{stats: st, recErr: err, consumerErr: consumerErr, consumers: consumers}
}

// applied is what one sync's writes did: the reconciler's outcome and
// error, the consumers' error and the time the consumers took (and the
// time of the sync's snapshot and build before them).
type applied struct {
	stats               reconciler.SyncStats
	recErr, consumerErr error
	consumers, build    time.Duration
	backlog             int // changed Services left for the next sync
}

// unavailable is the set of schedulers the kernel refused.
func (p *Proxier) unavailable() map[string]bool {
	out := map[string]bool{}
	for _, n := range p.rec.UnavailableSchedulers() {
		out[n] = true
	}
	return out
}

// build makes the plans of the snapshot's Services and hands them to the
// reconciler and the consumers; it raises Events for warnings and for
// conflicts that changed.
func (p *Proxier) build(in syncInputs) {
	// Schedulers the kernel refused: the next sync rebuilds every Service,
	// with the default in their place.
	planner := p.cfg.Planner(p.unavailable()).WithRanges(in.ranges).WithOtherNodes(in.otherNodes)
	p.reporter.refusedRanges(p.cfg.NodeName, in.refusedRanges)
	if in.rangesChanged {
		// Before the plans built with them.
		p.rec.SetRoutes(in.ranges)
		p.consumers.setRanges(in.ranges)
	}
	now := p.clock.Now()
	defer p.settle.start()
	p.rec.Reserve(len(in.services))
	for _, si := range in.services {
		n := si.name
		plan := planner.Plan(si.svc, si.slices, in.node)
		if plan != nil {
			p.reporter.warn(n, si.svc, plan.Warnings)
		} else {
			p.reporter.warn(n, nil, nil)
		}
		settled := p.settle.apply(n, plan, now)
		p.rec.SetPlan(n, settled)
		p.consumers.setPlan(n, settled, plan)
		p.failures.setPlan(n, plan)
		if p.traffic != nil {
			p.traffic.setPlan(n, plan)
		}
	}
	p.reporter.changed(in.changed)
	for _, n := range p.rec.ConflictChanges() {
		if st, ok := p.rec.Status(n); ok {
			p.reporter.conflicts(n, st, p.tracker.service(n))
		}
	}
}
