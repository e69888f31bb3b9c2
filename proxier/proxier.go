// Package proxier turns Kubernetes Services and EndpointSlices into IPVS
// virtual servers. model.Build (a pure function) makes one Service's plan,
// model.Diff the operations that bring the kernel to the plans, the
// Reconciler applies them with per-Service status and retries, and the Proxier
// watches the API and drives both from one sync loop.
package proxier

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
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
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
}

// Consumer is another part of the node's data plane driven by the same
// plans: the iptables glue and the health-check server. It is told of every
// plan change, then synced after the IPVS reconciler; a failed Sync forces a
// full resync of everything, like a failed IPVS write.
type Consumer interface {
	// Name names the consumer in logs and errors.
	Name() string
	// SetPlan records the plan of a Service; nil means it is gone.
	SetPlan(name types.NamespacedName, plan *model.ServicePlan)
	// Sync applies what changed; full re-reads and repairs all of it.
	Sync(full bool) error
}

// Proxier watches Services, EndpointSlices and its Node and keeps the kernel
// in line with them.
type Proxier struct {
	cfg       Config
	client    kubernetes.Interface
	links     netlinkutil.Links
	rec       *Reconciler
	log       *zap.Logger
	recorder  record.EventRecorder
	metrics   *Metrics
	consumers []Consumer

	trigger chan struct{}

	mu        sync.Mutex // guards the fields below
	services  map[types.NamespacedName]*corev1.Service
	slices    map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice
	zone      string
	nodeAddrs []netip.Addr
	dirty     map[types.NamespacedName]time.Time // first unsynced change
	rebuild   bool                               // every Service must be rebuilt
	warnings  map[types.NamespacedName]string
	lastOK    time.Time
	lastErr   error
	// pendingSince is when the oldest change not yet in the kernel was
	// received, or when syncs began to fail; zero when all is applied.
	pendingSince time.Time
	nodeEligible bool
}

// New returns a Proxier. recorder may be nil (no Events).
func New(cfg Config, client kubernetes.Interface, ipvs netlinkutil.IPVS, links netlinkutil.Links,
	recorder record.EventRecorder, metrics *Metrics, log *zap.Logger) *Proxier {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	own := model.Ownership{Interface: cfg.Interface, NodePortRange: cfg.NodePortRange, ExcludeCIDRs: cfg.ExcludeCIDRs}
	return &Proxier{
		cfg: cfg, client: client, links: links, log: log, recorder: recorder, metrics: metrics,
		rec:      NewReconciler(ipvs, links, own, log),
		trigger:  make(chan struct{}, 1),
		services: map[types.NamespacedName]*corev1.Service{},
		slices:   map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{},
		dirty:    map[types.NamespacedName]time.Time{},
		warnings: map[types.NamespacedName]string{},
		rebuild:  true,
	}
}

// SetConntrack makes syncs clear the conntrack entries of removed UDP real
// servers; call it before Run.
func (p *Proxier) SetConntrack(c netlinkutil.Conntrack) { p.rec.SetConntrack(c) }

// AddConsumer adds a consumer of plans; call it before Run.
func (p *Proxier) AddConsumer(c Consumer) { p.consumers = append(p.consumers, c) }

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

// queuedLocked records that a change waits to be applied; p.mu is held.
func (p *Proxier) queuedLocked() {
	if p.pendingSince.IsZero() {
		p.pendingSince = time.Now()
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
func changeTime(obj metav1.Object) time.Time {
	if v, ok := obj.GetAnnotations()[corev1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t
		}
	}
	return time.Now()
}

func serviceName(obj any) (*corev1.Service, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*corev1.Service)
	return s, ok
}

func sliceOf(obj any) (*discoveryv1.EndpointSlice, types.NamespacedName, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, types.NamespacedName{}, false
	}
	svc := s.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return nil, types.NamespacedName{}, false
	}
	return s, types.NamespacedName{Namespace: s.Namespace, Name: svc}, true
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
	p.markDirty(name, time.Now())
}

func (p *Proxier) onSlice(obj any, deleted bool) {
	s, name, ok := sliceOf(obj)
	if !ok {
		return
	}
	p.mu.Lock()
	m := p.slices[name]
	if deleted {
		delete(m, s.Name)
		if len(m) == 0 {
			delete(p.slices, name)
		}
	} else {
		if m == nil {
			m = map[string]*discoveryv1.EndpointSlice{}
			p.slices[name] = m
		}
		m[s.Name] = s
	}
	p.mu.Unlock()
	p.markDirty(name, changeTime(s))
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

func handler(add func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { add(o, false) },
		UpdateFunc: func(_, o any) { add(o, false) },
		DeleteFunc: func(o any) { add(o, true) },
	}
}

// Run watches the API and syncs until ctx ends.
func (p *Proxier) Run(ctx context.Context) error {
	// Services and slices of other proxies (service-proxy-name) and headless
	// ones are not ours.
	notOurs := func(o *metav1.ListOptions) {
		o.LabelSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
	}
	f := informers.NewSharedInformerFactoryWithOptions(p.client, 0, informers.WithTweakListOptions(notOurs))
	svcReg, err := f.Core().V1().Services().Informer().AddEventHandler(handler(p.onService))
	if err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	sliceReg, err := f.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler(p.onSlice))
	if err != nil {
		return fmt.Errorf("watch endpointslices: %w", err)
	}
	nf := informers.NewSharedInformerFactoryWithOptions(p.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.NodeName).String()
	}))
	nodeReg, err := nf.Core().V1().Nodes().Informer().AddEventHandler(handler(p.onNode))
	if err != nil {
		return fmt.Errorf("watch node: %w", err)
	}
	f.Start(ctx.Done())
	nf.Start(ctx.Done())
	defer f.Shutdown()
	defer nf.Shutdown()
	// Wait until the handlers, not only the caches, have seen every
	// existing object: a first full sync on part of the Services would
	// delete the others' virtual servers and cut their connections.
	p.log.Info("waiting for the initial list of Services, EndpointSlices and the Node")
	if !cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, sliceReg.HasSynced, nodeReg.HasSynced) {
		return fmt.Errorf("initial list of Services, EndpointSlices and the Node: %w", ctx.Err())
	}
	p.mu.Lock()
	n := len(p.services)
	p.mu.Unlock()
	p.log.Info("initial list received", zap.Int("services", n))
	p.loop(ctx)
	return nil
}

// loop runs syncs: partial ones when something changed, no more often than
// MinSyncPeriod; a full one every SyncPeriod; after a failure, a full one
// after a backoff that doubles up to SyncPeriod.
func (p *Proxier) loop(ctx context.Context) {
	full := true
	backoff := time.Duration(0)
	var last time.Time
	periodic := time.NewTicker(p.cfg.SyncPeriod)
	defer periodic.Stop()
	for {
		if wait := p.cfg.MinSyncPeriod - time.Since(last); wait > 0 && !last.IsZero() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		err := p.SyncOnce(full)
		full = false
		var retry <-chan time.Time
		if err != nil {
			backoff = min(max(2*backoff, time.Second), p.cfg.SyncPeriod)
			p.log.Error("sync failed; a full resync follows", zap.Error(err), zap.Duration("retryIn", backoff))
			retry = time.After(backoff)
		} else {
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-p.trigger:
		case <-periodic.C:
			full = true
		case <-retry:
			full = true
		}
	}
}

// SyncOnce builds the plans of changed Services and applies them; full
// rebuilds and re-reads everything.
func (p *Proxier) SyncOnce(full bool) error {
	start := time.Now()
	if full {
		if err := p.refreshNodeAddresses(); err != nil {
			p.fail(err)
			return err
		}
	}
	p.mu.Lock()
	rebuild := p.rebuild || full
	p.rebuild = false
	changed := p.dirty
	p.dirty = map[types.NamespacedName]time.Time{}
	var names []types.NamespacedName
	if rebuild {
		for n := range p.services {
			names = append(names, n)
		}
		for n := range changed { // deleted Services
			if _, ok := p.services[n]; !ok {
				names = append(names, n)
			}
		}
	} else {
		for n := range changed {
			names = append(names, n)
		}
	}
	node := model.NodeInfo{Name: p.cfg.NodeName, Zone: p.zone, NodePortAddresses: p.nodeAddrs}
	type input struct {
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
	}
	inputs := make(map[types.NamespacedName]input, len(names))
	for _, n := range names {
		in := input{svc: p.services[n]}
		for _, s := range p.slices[n] {
			in.slices = append(in.slices, s)
		}
		inputs[n] = in
	}
	p.mu.Unlock()

	// Schedulers the kernel refused make a failed sync; the next sync
	// rebuilds every Service, with the default in their place.
	unavailable := map[string]bool{}
	for _, n := range p.rec.UnavailableSchedulers() {
		unavailable[n] = true
	}
	bcfg := model.BuildConfig{Scheduler: p.cfg.Scheduler, IPv4: p.cfg.IPv4, IPv6: p.cfg.IPv6, ExcludeCIDRs: p.cfg.ExcludeCIDRs,
		Unavailable: unavailable}
	for n, in := range inputs {
		var plan *model.ServicePlan
		if in.svc != nil && !model.Skip(in.svc) {
			built := model.Build(in.svc, in.slices, node, bcfg)
			plan = &built
			p.report(n, in.svc, built.Warnings)
		} else {
			p.report(n, nil, nil)
		}
		p.rec.SetPlan(n, plan)
		for _, c := range p.consumers {
			c.SetPlan(n, plan)
		}
	}
	if !p.rec.Pending() && !full && len(inputs) == 0 {
		p.mu.Lock()
		if len(p.dirty) == 0 && !p.rebuild {
			p.pendingSince = time.Time{}
		}
		p.mu.Unlock()
		return nil
	}
	st, err := p.rec.Sync(full)
	if len(p.rec.UnavailableSchedulers()) > len(unavailable) {
		p.mu.Lock()
		p.rebuild = true
		p.mu.Unlock()
	}
	for _, c := range p.consumers {
		if cerr := c.Sync(st.Full); cerr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", c.Name(), cerr))
		}
	}
	kind := "partial"
	if st.Full {
		kind = "full"
	}
	total := time.Since(start)
	p.metrics.SyncDuration.WithLabelValues(kind).Observe(total.Seconds())
	p.metrics.WritesPerSync.Observe(float64(st.Writes))
	p.countServers()
	logAt := p.log.Debug
	if st.Full {
		logAt = p.log.Info
	}
	logAt("synced", zap.String("kind", kind), zap.Int("services", st.Services),
		zap.Int("writes", st.Writes), zap.Int("reads", st.Reads), zap.Duration("ipvs", st.Duration),
		zap.Duration("took", total))
	if err != nil {
		p.fail(err)
		return err
	}
	now := time.Now()
	for _, at := range changed {
		p.metrics.ProgrammingLatency.Observe(now.Sub(at).Seconds())
	}
	p.metrics.LastSuccessfulSync.Set(float64(now.Unix()))
	recPending := p.rec.Pending()
	p.mu.Lock()
	p.lastOK, p.lastErr = now, nil
	if len(p.dirty) == 0 && !p.rebuild && !recPending {
		p.pendingSince = time.Time{}
	} else {
		// Changes came in during the sync: they are no older than its
		// start (an early bound, by at most one sync's duration).
		p.pendingSince = start
	}
	p.mu.Unlock()
	if recPending {
		p.kick()
	}
	return nil
}

func (p *Proxier) fail(err error) {
	p.metrics.SyncErrors.Inc()
	p.rec.ForceFull()
	p.mu.Lock()
	p.lastErr = err
	p.queuedLocked()
	p.mu.Unlock()
}

// refreshNodeAddresses reads the node's addresses for node ports; a change
// rebuilds every Service.
func (p *Proxier) refreshNodeAddresses() error {
	all, err := p.links.NodeAddresses(p.cfg.Interface)
	if err != nil {
		return fmt.Errorf("read node addresses: %w", err)
	}
	addrs := FilterNodePortAddresses(all, p.cfg.NodePortAddresses)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Equal(addrs, p.nodeAddrs) {
		p.log.Info("node-port addresses", zap.Stringers("addresses", addrs))
		p.nodeAddrs = addrs
		p.rebuild = true
	}
	return nil
}

// FilterNodePortAddresses keeps the addresses inside the prefixes (all when
// there are none), sorted and deduplicated.
func FilterNodePortAddresses(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		keep := len(prefixes) == 0
		for _, p := range prefixes {
			if p.Contains(a) {
				keep = true
				break
			}
		}
		if keep {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// report logs a Service's warnings and raises an Event when they change.
func (p *Proxier) report(name types.NamespacedName, svc *corev1.Service, warnings []string) {
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
		p.recorder.Event(svc, corev1.EventTypeWarning, "IPVSProxyConfig", msg)
	}
}

func (p *Proxier) countServers() {
	vs, rs := p.rec.Counts()
	p.metrics.VirtualServers.Set(float64(vs))
	p.metrics.RealServers.Set(float64(rs))
}
