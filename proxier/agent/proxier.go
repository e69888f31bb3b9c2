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
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
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
	MinSyncPeriod     time.Duration
	SyncPeriod        time.Duration
	// RetryBase is the first retry delay of a failed Service or consumer,
	// doubled per failure up to SyncPeriod; default 1s.
	RetryBase time.Duration
	// ResyncSlice is the number of virtual servers a periodic full resync
	// checks per sync (ReconcilerConfig.ResyncSlice; default 500).
	ResyncSlice int
	// Clock defaults to the real clock (tests pass a fake one).
	Clock clock.WithTicker
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
// in line with them.
type Proxier struct {
	cfg       Config
	clock     clock.WithTicker
	client    kubernetes.Interface
	links     netlinkutil.Links
	rec       *reconciler.Reconciler
	log       *zap.Logger
	recorder  record.EventRecorder
	metrics   *Metrics
	consumers []consumer.Consumer
	// consumerRetry holds the backoff of each consumer whose last Sync
	// failed (by index in consumers). Only the sync loop touches it.
	consumerRetry map[int]*reconciler.Backoff
	// finishers run once each, after a sync in which everything succeeded
	// (see AddFinisher). Only the sync loop touches them.
	finishers []finisher
	// changes holds, per Service, when its oldest change not yet in the
	// kernel was made (for the programming latency). Only the sync loop
	// touches it.
	changes map[types.NamespacedName]time.Time

	trigger chan struct{}
	// listed is closed once the initial lists of Services, slices and the
	// Node are in (Listed).
	listed chan struct{}
	// prepare runs beside the initial lists (SetPrepare).
	prepare func(context.Context) error

	mu        sync.Mutex // guards the fields below
	services  map[types.NamespacedName]*model.Service
	slices    map[types.NamespacedName][]*model.EndpointSlice
	zone      string
	nodeAddrs []netip.Addr                       // node-port addresses
	nodeAll   []netip.Addr                       // every node address (model.NodeInfo.Addresses)
	dirty     map[types.NamespacedName]time.Time // first unsynced change
	rebuild   bool                               // every Service must be rebuilt
	// ranges are the Service ranges routed as local (setRanges);
	// rangesKnown once they are, rangesChanged until a sync applies them.
	ranges                     []netip.Prefix
	rangesKnown, rangesChanged bool
	warnings                   map[types.NamespacedName]string
	lastOK                     time.Time
	lastErr                    error
	// pendingSince is when the oldest change not yet synced was received,
	// or when node-wide failures (a kernel read, a consumer) began; zero
	// when all is applied. A Service whose own writes fail does not count
	// here: it is retried alone and reported in its status.
	pendingSince time.Time
	nodeEligible bool
	// problems are the statuses of the Services failing or in conflict,
	// as of the last sync.
	problems []reconciler.ServiceStatus
	// What the kernel reported removed from the interface since the last
	// sync (see watchRemovals).
	removedAddrs []netip.Addr
	linkRemoved  bool
	// addrsChanged: the kernel reported a change of the node's addresses
	// since they were last read.
	addrsChanged bool
}

// New returns a Proxier. recorder may be nil (no Events).
func New(cfg Config, client kubernetes.Interface, ipvs netlinkutil.IPVS, links netlinkutil.Links,
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
	rcfg := reconciler.ReconcilerConfig{Ownership: cfg.Ownership(), RetryBase: cfg.RetryBase, RetryMax: max(cfg.SyncPeriod, cfg.RetryBase), Clock: cfg.Clock,
		ResyncSlice: cfg.ResyncSlice}
	p := &Proxier{
		cfg: cfg, clock: cfg.Clock, client: client, links: links, log: log, recorder: recorder, metrics: metrics,
		rec:           reconciler.NewReconciler(ipvs, links, rcfg, log),
		consumerRetry: map[int]*reconciler.Backoff{},
		changes:       map[types.NamespacedName]time.Time{},
		trigger:       make(chan struct{}, 1),
		listed:        make(chan struct{}),
		services:      map[types.NamespacedName]*model.Service{},
		slices:        map[types.NamespacedName][]*model.EndpointSlice{},
		dirty:         map[types.NamespacedName]time.Time{},
		warnings:      map[types.NamespacedName]string{},
		rebuild:       true,
	}
	if cfg.RouteServiceRanges && len(cfg.ServiceRanges) > 0 {
		p.ranges, p.rangesKnown, p.rangesChanged = RoutableRanges(cfg.ServiceRanges), true, true
	}
	return p
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

// finisher is a task to run once the node is fully programmed.
type finisher struct {
	name string
	fn   func(ctx context.Context) error
}

// AddFinisher adds a task that runs once, right after the first sync in
// which every write, read and consumer succeeded (the node fully
// programmed); if it fails, it runs again after the next such sync. Taking
// a node over from kube-proxy removes kube-proxy's leftovers this way.
// Call it before Run.
func (p *Proxier) AddFinisher(name string, fn func(ctx context.Context) error) {
	p.finishers = append(p.finishers, finisher{name, fn})
}

// runFinishers runs the pending finishers; those that succeed are done.
func (p *Proxier) runFinishers() error {
	var errs []error
	left := p.finishers[:0]
	for _, f := range p.finishers {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := f.fn(ctx)
		cancel()
		if err != nil {
			p.log.Warn("finisher failed; it runs again after the next successful sync", zap.String("finisher", f.name), zap.Error(err))
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
			left = append(left, f)
			continue
		}
		p.log.Info("finisher done", zap.String("finisher", f.name))
	}
	p.finishers = left
	return errors.Join(errs...)
}

// AddConsumer adds a consumer of plans; call it before Run.
func (p *Proxier) AddConsumer(c consumer.Consumer) {
	if bc, ok := c.(consumer.BackgroundConsumer); ok {
		bc.SetWake(p.kick)
	}
	p.consumers = append(p.consumers, c)
}

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
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to delete.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Status returns the sync status.
func (p *Proxier) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{LastSuccessfulSync: p.lastOK, LastError: p.lastErr, Pending: len(p.dirty),
		PendingSince: p.pendingSince, NodeEligible: p.nodeEligible}
}

// ServiceProblems returns, as of the last sync, the status of every
// Service whose writes are failing or that lost a conflict, sorted by name.
func (p *Proxier) ServiceProblems() []reconciler.ServiceStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.problems)
}

// queuedLocked records that a change waits to be applied; p.mu is held.
func (p *Proxier) queuedLocked() {
	if p.pendingSince.IsZero() {
		p.pendingSince = p.clock.Now()
	}
}

func (p *Proxier) kick() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// markDirty records a change to a Service; at is when the change was made
// (for the programming latency metric).
func (p *Proxier) markDirty(name types.NamespacedName, at time.Time) {
	p.mu.Lock()
	if _, ok := p.dirty[name]; !ok {
		p.dirty[name] = at
	}
	p.queuedLocked()
	p.mu.Unlock()
	p.kick()
}

// changeTime is when an EndpointSlice change was triggered, from the
// annotation the EndpointSlice controller sets, else now.
func changeTime(s *model.EndpointSlice, now time.Time) time.Time {
	if !s.Triggered.IsZero() {
		return s.Triggered
	}
	return now
}

// serviceName is the Service an informer delivered (model.Compact made
// it, or makes it here; a tombstone holds the last one the cache had, or
// only its key).
func serviceName(obj any) (*model.Service, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if d.Obj == nil {
			ns, name, err := cache.SplitMetaNamespaceKey(d.Key)
			return &model.Service{Namespace: ns, Name: name}, err == nil && name != ""
		}
		obj = d.Obj
	}
	obj, _ = model.Compact(obj)
	s, ok := obj.(*model.Service)
	return s, ok && s != nil
}

func sliceOf(obj any) (*model.EndpointSlice, types.NamespacedName, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	obj, _ = model.Compact(obj)
	s, ok := obj.(*model.EndpointSlice)
	if !ok || s == nil || s.Service == "" {
		return nil, types.NamespacedName{}, false
	}
	return s, types.NamespacedName{Namespace: s.Namespace, Name: s.Service}, true
}

func (p *Proxier) onService(obj any, deleted bool) {
	s, ok := serviceName(obj)
	if !ok {
		return
	}
	name := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	p.mu.Lock()
	if deleted {
		delete(p.services, name)
	} else {
		p.services[name] = s
	}
	p.mu.Unlock()
	p.markDirty(name, p.clock.Now())
}

func (p *Proxier) onSlice(obj any, deleted bool) {
	s, name, ok := sliceOf(obj)
	if d, tomb := obj.(cache.DeletedFinalStateUnknown); tomb && d.Obj == nil {
		s, name, ok = p.sliceByKey(d.Key)
	}
	if !ok {
		return
	}
	p.mu.Lock()
	// A Service's slices, most often one: a list, not a map each.
	have := slices.DeleteFunc(p.slices[name], func(o *model.EndpointSlice) bool { return o.Name == s.Name })
	if !deleted {
		have = append(have, s)
	}
	if len(have) == 0 {
		delete(p.slices, name)
	} else {
		p.slices[name] = have
	}
	p.mu.Unlock()
	p.markDirty(name, changeTime(s, p.clock.Now()))
}

// sliceByKey finds a slice the agent holds by its informer key
// (namespace/name): a tombstone may carry only that.
func (p *Proxier) sliceByKey(key string) (*model.EndpointSlice, types.NamespacedName, bool) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, types.NamespacedName{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for svc, have := range p.slices {
		if svc.Namespace != ns {
			continue
		}
		for _, s := range have {
			if s.Name == name {
				return s, svc, true
			}
		}
	}
	return nil, types.NamespacedName{}, false
}

// sliceHandler is handler(p.onSlice), except that a slice whose
// kubernetes.io/service-name label changed (or went) leaves the Service it
// named before: it is listed by that label.
func (p *Proxier) sliceHandler() cache.ResourceEventHandlerFuncs {
	h := handler(p.onSlice)
	h.UpdateFunc = func(old, o any) {
		if _, before, ok := sliceOf(old); ok {
			if _, after, ok := sliceOf(o); !ok || after != before {
				p.onSlice(old, true)
			}
		}
		p.onSlice(o, false)
	}
	return h
}

func (p *Proxier) onNode(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok || n.Name != p.cfg.NodeName {
		return
	}
	zone := n.Labels[corev1.LabelTopologyZone]
	eligible := !deleted && n.DeletionTimestamp == nil &&
		!slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ToBeDeletedTaint })
	p.mu.Lock()
	p.nodeEligible = eligible
	changed := zone != p.zone
	p.zone = zone
	if changed {
		p.rebuild = true
		p.queuedLocked()
	}
	p.mu.Unlock()
	if changed {
		p.kick()
	}
}

// informerSet runs informers until the context ends, and waits for them.
type informerSet struct {
	infs []cache.SharedIndexInformer
	wg   sync.WaitGroup
}

// add sets the informer's transform (model.Compact) and handler.
func (s *informerSet) add(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	if err := inf.SetTransform(model.Compact); err != nil {
		return nil, err
	}
	s.infs = append(s.infs, inf)
	return inf.AddEventHandler(h)
}

func (s *informerSet) start(ctx context.Context) {
	for _, inf := range s.infs {
		s.wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

// wait waits until every started informer has stopped.
func (s *informerSet) wait() { s.wg.Wait() }

func handler(add func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { add(o, false) },
		UpdateFunc: func(_, o any) { add(o, false) },
		DeleteFunc: func(o any) { add(o, true) },
	}
}

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
	// The informers keep no index (the factory's would index every object
	// by namespace, which the agent never asks), and model.Compact keeps
	// in their caches only what the agent reads, in the agent's own types.
	// Services and slices of other proxies (service-proxy-name) and
	// headless ones are not ours (ServiceSelector); both are listed in
	// pages (pagedListWatch).
	var infs informerSet
	defer infs.wait()
	ctx, stop := context.WithCancel(ctx) // stops the informers when Run ends early
	defer stop()
	svcReg, err := infs.add(serviceInformer(p.client), handler(p.onService))
	if err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	sliceReg, err := infs.add(sliceInformer(p.client), p.sliceHandler())
	if err != nil {
		return fmt.Errorf("watch endpointslices: %w", err)
	}
	nodeReg, err := infs.add(corev1informers.NewFilteredNodeInformer(p.client, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.NodeName).String()
	}), handler(p.onNode))
	if err != nil {
		return fmt.Errorf("watch node: %w", err)
	}
	synced := []cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced, nodeReg.HasSynced}
	if p.cfg.RouteServiceRanges && len(p.cfg.ServiceRanges) == 0 {
		if has, err := p.watchServiceCIDRs(ctx); err != nil {
			p.log.Warn("cannot read the cluster's ServiceCIDRs (networking.k8s.io/v1, Kubernetes 1.33 and later; the ClusterRole must allow list and watch): binding one address per clusterIP; --service-cidrs names the ranges instead",
				zap.Error(err))
		} else {
			synced = append(synced, has)
		}
	}
	infs.start(ctx)
	// The kernel is prepared beside the lists; a failure stops the wait.
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
	// Wait until the handlers, not only the caches, have seen every
	// existing object: a first full sync on part of the Services would
	// delete the others' virtual servers and cut their connections.
	p.log.Info("waiting for the initial list of Services, EndpointSlices and the Node")
	listed := cache.WaitForCacheSync(listing.Done(), synced...)
	if err := <-prepared; err != nil { // always waited for: it may hold the kernel's handles
		return err
	}
	if !listed {
		return fmt.Errorf("initial list of Services, EndpointSlices and the Node: %w", ctx.Err())
	}
	p.mu.Lock()
	n := len(p.services)
	p.mu.Unlock()
	p.log.Info("initial list received", zap.Int("services", n))
	select {
	case <-p.listed: // a second Run
	default:
		close(p.listed)
	}
	p.watchRemovals(ctx)
	p.watchNodeAddresses(ctx)
	p.loop(ctx)
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
	err := w.WatchRemovals(ctx, p.cfg.Interface, p.kernelRemoved, func(err error) {
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
	err := w.WatchNodeAddresses(ctx, p.nodeAddressesChanged, func(err error) {
		p.log.Warn("kernel notifications of node address changes lost; the periodic resync reads them", zap.Error(err))
	}, netlinkutil.ProxyInterfaces(p.cfg.Interface)...)
	if err != nil {
		p.log.Warn("no kernel notifications of node address changes; the periodic resync reads them", zap.Error(err))
	}
}

// nodeAddressesChanged makes the next sync re-read the node's addresses.
func (p *Proxier) nodeAddressesChanged() {
	p.mu.Lock()
	p.addrsChanged = true
	p.mu.Unlock()
	p.kick()
}

// kernelRemoved records a removal the kernel reported and wakes the loop.
func (p *Proxier) kernelRemoved(r netlinkutil.Removal) {
	p.mu.Lock()
	if r.Addr.IsValid() {
		p.removedAddrs = append(p.removedAddrs, r.Addr)
	} else {
		p.linkRemoved = true
	}
	p.mu.Unlock()
	p.kick()
}

// takeRemovals hands the reported removals to the reconciler: a removed
// interface makes this sync full, removed addresses still wanted are bound
// again by it. It reports whether the sync must be full.
func (p *Proxier) takeRemovals() bool {
	p.mu.Lock()
	addrs, link := p.removedAddrs, p.linkRemoved
	p.removedAddrs, p.linkRemoved = nil, false
	p.mu.Unlock()
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

// loop runs syncs: a partial one when something changed, no more often
// than MinSyncPeriod; a full one every SyncPeriod; and a partial one when a
// retry is due (a failed Service, consumer or kernel read, each with its
// own backoff). The retry time is taken from that state at every turn, so
// events never postpone or drop it.
func (p *Proxier) loop(ctx context.Context) {
	full := true
	var last, nextFull time.Time
	// A periodic resync's kernel read off the loop runs.
	var reading bool
	for {
		// The slices of a periodic resync follow one another at once
		// (changes that come meanwhile join the next one); other syncs
		// are at least MinSyncPeriod apart.
		if wait := p.cfg.MinSyncPeriod - p.clock.Since(last); wait > 0 && !last.IsZero() && !p.rec.Resyncing() {
			t := p.clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
		}
		last = p.clock.Now()
		if full {
			nextFull = last.Add(p.cfg.SyncPeriod)
			// The periodic resync reads the kernel off the loop when it
			// can: this turn syncs only what changed, and the resync
			// starts when the read is in.
			if run, ok := p.rec.StartResyncRead(); ok {
				reading = true
				go func() {
					run()
					p.kick()
				}()
				full = false
			}
		}
		if err := p.SyncOnce(full); err != nil {
			p.log.Error("sync failed; what failed is retried with backoff", zap.Error(err),
				zap.Time("nextRetry", p.nextRetry()))
		}
		full = false

		periodic := p.clock.NewTimer(nextFull.Sub(p.clock.Now()))
		var retry <-chan time.Time
		var retryTimer clock.Timer
		if at := p.nextRetry(); !at.IsZero() {
			retryTimer = p.clock.NewTimer(at.Sub(p.clock.Now()))
			retry = retryTimer.C()
		}
		select {
		case <-ctx.Done():
		case <-p.trigger:
		case <-periodic.C():
			// A read off the loop still running is this period's.
			full = !reading
			if !full {
				nextFull = p.clock.Now().Add(p.cfg.SyncPeriod)
			}
		case <-retry:
		}
		if reading && p.rec.ResyncReadDone() {
			// The read is in: the resync's full sync takes it.
			reading = false
			full = true
		}
		periodic.Stop()
		if retryTimer != nil {
			retryTimer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// nextRetry is when the earliest retry is due (zero: none waits).
func (p *Proxier) nextRetry() time.Time {
	next := p.rec.NextRetry()
	for _, b := range p.consumerRetry {
		if next.IsZero() || b.Next().Before(next) {
			next = b.Next()
		}
	}
	return next
}

// syncInputs is what one sync works from, taken under the lock.
type syncInputs struct {
	full bool
	node model.NodeInfo
	// ranges are the Service ranges routed as local; rangesChanged: they
	// changed since the last sync.
	ranges        []netip.Prefix
	rangesChanged bool
	services      map[types.NamespacedName]syncInput
	changed       map[types.NamespacedName]time.Time
}

type syncInput struct {
	svc    *model.Service
	slices []*model.EndpointSlice
}

// SyncOnce is one sync, in steps: snapshot the inputs, build the plans of
// the changed Services, apply them to the kernel, sync the consumers,
// record the outcome. full rebuilds every plan and re-reads the kernel.
func (p *Proxier) SyncOnce(full bool) error {
	start := p.clock.Now()
	full = p.takeRemovals() || full || p.rec.FullDue()
	in, nodeErr := p.snapshot(full)
	p.build(in)
	if !full && !p.rec.Pending() && len(in.services) == 0 && !p.consumersDue() {
		p.mu.Lock()
		if len(p.dirty) == 0 && !p.rebuild {
			p.pendingSince = time.Time{}
		}
		p.mu.Unlock()
		return nodeErr
	}
	known := len(p.rec.UnavailableSchedulers())
	// The consumers (the iptables glue above all: ipset and iptables
	// children) sync beside the reconciler's netlink writes, not after
	// them: they are driven by the same plans and none reads what the
	// other writes. At 10,000 Services cold, the two parts took 3.1 and
	// 2.3 s one after the other. Those that must follow IPVS
	// (AfterReconciler) sync once both are done.
	d := p.rec.Decide(full)
	var consumerErr error
	var consumers time.Duration
	consumersDone := make(chan struct{})
	go func() {
		defer close(consumersDone)
		consumersStart := p.clock.Now()
		consumerErr = p.syncConsumers(d.Full, false)
		consumers = p.clock.Since(consumersStart)
	}()
	st, err := p.rec.SyncAs(d)
	<-consumersDone
	if len(p.rec.UnavailableSchedulers()) > known {
		p.mu.Lock()
		p.rebuild = true
		p.mu.Unlock()
	}
	afterStart := p.clock.Now()
	consumerErr = errors.Join(consumerErr, p.syncConsumers(d.Full, true))
	consumers += p.clock.Since(afterStart)
	nodeErr = errors.Join(nodeErr, consumerErr)
	if err == nil && nodeErr == nil && len(p.finishers) > 0 {
		nodeErr = p.runFinishers()
	}
	p.record(start, st, consumers, err, nodeErr)
	return errors.Join(err, nodeErr)
}

// snapshot takes the changed Services (all on a rebuild) with their slices
// and the node's facts; on a full sync, or when the kernel reported a
// change, it re-reads the node's addresses.
func (p *Proxier) snapshot(full bool) (syncInputs, error) {
	var err error
	p.mu.Lock()
	reread := full || p.addrsChanged
	p.addrsChanged = false
	p.mu.Unlock()
	if reread {
		if err = p.refreshNodeAddresses(); err != nil {
			p.mu.Lock()
			p.addrsChanged = true // read again at the next sync
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A full sync re-reads the kernel, not the plans: they change only
	// with their inputs (events, the node's addresses and zone, the
	// schedulers the kernel refused), which set rebuild.
	rebuild := p.rebuild
	p.rebuild = false
	in := syncInputs{full: full, changed: p.dirty, ranges: p.ranges, rangesChanged: p.rangesChanged,
		node: model.NodeInfo{Name: p.cfg.NodeName, Zone: p.zone, NodePortAddresses: p.nodeAddrs, Addresses: p.nodeAll}}
	p.rangesChanged = false
	p.dirty = map[types.NamespacedName]time.Time{}
	names := make([]types.NamespacedName, 0, len(in.changed))
	for n := range in.changed {
		names = append(names, n)
	}
	if rebuild {
		for n := range p.services {
			if _, ok := in.changed[n]; !ok {
				names = append(names, n)
			}
		}
	}
	in.services = make(map[types.NamespacedName]syncInput, len(names))
	for _, n := range names {
		in.services[n] = syncInput{svc: p.services[n], slices: slices.Clone(p.slices[n])}
	}
	return in, err
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
	planner := p.cfg.Planner(p.unavailable()).WithRanges(in.ranges)
	if in.rangesChanged {
		p.applyRanges(in.ranges)
	}
	for n, si := range in.services {
		plan := planner.Plan(si.svc, si.slices, in.node)
		if plan != nil {
			p.report(n, si.svc, plan.Warnings)
		} else {
			p.report(n, nil, nil)
		}
		p.rec.SetPlan(n, plan)
		for _, c := range p.consumers {
			c.SetPlan(n, plan)
		}
	}
	for n, at := range in.changed {
		if old, ok := p.changes[n]; !ok || at.Before(old) {
			p.changes[n] = at
		}
	}
	for _, n := range p.rec.ConflictChanges() {
		p.reportConflicts(n)
	}
}

// reportConflicts logs a Service's conflicts and raises an Event on it.
func (p *Proxier) reportConflicts(name types.NamespacedName) {
	st, ok := p.rec.Status(name)
	if !ok {
		return
	}
	p.mu.Lock()
	svc := p.services[name]
	p.mu.Unlock()
	if len(st.Conflicts) == 0 {
		p.log.Info("service no longer in conflict", zap.String("service", name.String()))
		if p.recorder != nil && svc != nil {
			p.recorder.Event(svc.Ref(), corev1.EventTypeNormal, "VirtualServerConflictResolved", "the Service holds every virtual server it wants")
		}
		return
	}
	msgs := make([]string, len(st.Conflicts))
	for i, c := range st.Conflicts {
		msgs[i] = c.String()
	}
	msg := strings.Join(msgs, "; ") + "; this Service gets no traffic there"
	p.log.Warn("virtual servers held by an older Service", zap.String("service", name.String()), zap.Strings("conflicts", msgs))
	if p.recorder != nil && svc != nil {
		p.recorder.Event(svc.Ref(), corev1.EventTypeWarning, "VirtualServerConflict", msg)
	}
}

// consumersDue reports whether a consumer's retry is due or a consumer's
// background read waits to be applied.
func (p *Proxier) consumersDue() bool {
	now := p.clock.Now()
	for _, b := range p.consumerRetry {
		if b.Due(now) {
			return true
		}
	}
	for _, c := range p.consumers {
		if bc, ok := c.(consumer.BackgroundConsumer); ok && bc.Pending() {
			return true
		}
	}
	return false
}

// syncConsumers syncs the consumers that run beside the reconciler, or
// those that follow it (after): fully when the reconciler's sync is full
// or the consumer's retry is due. A failure is that consumer's alone: it
// is retried with a full sync after its backoff.
func (p *Proxier) syncConsumers(full, after bool) error {
	now := p.clock.Now()
	var errs []error
	for i, c := range p.consumers {
		if _, ok := c.(consumer.AfterReconciler); ok != after {
			continue
		}
		b := p.consumerRetry[i]
		cfull := full || (b != nil && b.Due(now))
		if err := c.Sync(cfull); err != nil {
			if b == nil {
				b = &reconciler.Backoff{}
				p.consumerRetry[i] = b
			}
			b.Fail(now, p.cfg.RetryBase, max(p.cfg.SyncPeriod, p.cfg.RetryBase))
			errs = append(errs, fmt.Errorf("%s: %w", c.Name(), err))
			continue
		}
		if cfull || b == nil {
			delete(p.consumerRetry, i)
		}
	}
	return errors.Join(errs...)
}

// record takes a sync's outcome into metrics, logs and health: recErr is
// the reconciler's, nodeErr that of the node's addresses and consumers;
// consumers is the time the consumers' syncs took.
func (p *Proxier) record(start time.Time, st reconciler.SyncStats, consumers time.Duration, recErr, nodeErr error) {
	kind := "partial"
	if st.Full {
		kind = "full"
	}
	now := p.clock.Now()
	total := now.Sub(start)
	p.metrics.SyncDuration.WithLabelValues(kind).Observe(total.Seconds())
	p.metrics.WritesPerSync.Observe(float64(st.Writes))
	p.metrics.ServiceFailures.Add(float64(len(st.Failed)))
	vs, rs := p.rec.Counts()
	p.metrics.VirtualServers.Set(float64(vs))
	p.metrics.RealServers.Set(float64(rs))
	failing, conflicts := 0, 0
	problems := p.rec.Problems()
	for _, s := range problems {
		if s.Failures > 0 {
			failing++
		}
		if len(s.Conflicts) > 0 {
			conflicts++
		}
	}
	p.metrics.ServicesFailing.Set(float64(failing))
	p.metrics.ServicesInConflict.Set(float64(conflicts))
	logAt := p.log.Debug
	if st.Full {
		logAt = p.log.Info
	}
	logAt("synced", zap.String("kind", kind), zap.Int("services", st.Services), zap.Int("failed", len(st.Failed)),
		zap.Int("writes", st.Writes), zap.Int("reads", st.Reads), zap.Duration("ipvs", st.Duration),
		zap.Duration("read", st.Read), zap.Duration("bind", st.Bind), zap.Duration("readOffLoop", st.ReadOffLoop), zap.Duration("consumers", consumers),
		zap.Duration("took", total), zap.Int("resyncLeft", st.ResyncLeft))
	if st.ResyncDone {
		p.metrics.SyncDuration.WithLabelValues("resync").Observe(st.ResyncTook.Seconds())
		p.log.Info("full resync complete", zap.Duration("took", st.ResyncTook))
	}

	// A change is programmed once its Service is not failing; a failed
	// kernel read applied nothing.
	if !st.ReadFailed {
		held := len(p.changes)
		for n, at := range p.changes {
			if p.rec.Failing(n) {
				continue
			}
			p.metrics.ProgrammingLatency.Observe(now.Sub(at).Seconds())
			delete(p.changes, n)
		}
		if len(p.changes) == 0 && held > 64 { // a map keeps its largest size: see emptied
			p.changes = map[types.NamespacedName]time.Time{}
		}
	}

	// Health: per-Service failures are the Services' own (status, Events,
	// metrics); a failed kernel read or consumer is the node's.
	if recErr != nil || nodeErr != nil {
		p.metrics.SyncErrors.Inc()
	}
	var healthErr error
	if st.ReadFailed {
		healthErr = recErr
	}
	healthErr = errors.Join(healthErr, nodeErr)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.problems = problems
	p.lastErr = errors.Join(recErr, nodeErr)
	if healthErr != nil {
		p.queuedLocked()
		return
	}
	p.metrics.LastSuccessfulSync.Set(float64(now.Unix()))
	p.lastOK = now
	switch {
	case len(p.dirty) == 0 && !p.rebuild && !p.rec.FullDue() && len(p.consumerRetry) == 0:
		p.pendingSince = time.Time{}
	default:
		// Changes came in during the sync: they are no older than its
		// start (an early bound, by at most one sync's duration).
		p.pendingSince = start
	}
	if p.rec.Pending() {
		p.kick()
	}
}

// refreshNodeAddresses reads the node's addresses for node ports; a change
// rebuilds every Service.
func (p *Proxier) refreshNodeAddresses() error {
	all, err := p.links.NodeAddresses(netlinkutil.ProxyInterfaces(p.cfg.Interface)...)
	if err != nil {
		return fmt.Errorf("read node addresses: %w", err)
	}
	addrs := model.FilterNodePortAddresses(all, p.cfg.NodePortAddresses)
	all = model.FilterNodePortAddresses(all, nil) // sorted, each once
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Equal(addrs, p.nodeAddrs) {
		p.log.Info("node-port addresses", zap.Stringers("addresses", addrs))
		p.nodeAddrs = addrs
		p.rebuild = true
	}
	if !slices.Equal(all, p.nodeAll) {
		p.nodeAll = all
		p.rebuild = true
	}
	return nil
}

// report logs a Service's warnings and raises an Event when they change.
func (p *Proxier) report(name types.NamespacedName, svc *model.Service, warnings []string) {
	msg := strings.Join(warnings, "; ")
	p.mu.Lock()
	old := p.warnings[name]
	if msg == "" {
		delete(p.warnings, name)
	} else {
		p.warnings[name] = msg
	}
	n := len(p.warnings)
	p.mu.Unlock()
	p.metrics.ServicesWithWarning.Set(float64(n))
	if msg == "" || msg == old {
		return
	}
	p.log.Warn("service has problems; programmed what could be", zap.String("service", name.String()), zap.Strings("problems", warnings))
	if p.recorder != nil && svc != nil {
		p.recorder.Event(svc.Ref(), corev1.EventTypeWarning, "IPVSProxyConfig", msg)
	}
}
