package agent

// The change tracker: the informers' handlers, the Services, EndpointSlices
// and node facts they deliver, which Services changed since the last sync,
// and the snapshot a sync works from.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// tracker holds what the informers delivered and what changed since the
// last sync. The informers' handlers write it under its lock and wake the
// loop; the loop takes a snapshot of it at the start of each sync.
type tracker struct {
	nodeName          string
	nodePortAddresses []netip.Prefix
	// readAddresses reads the node's addresses (netlinkutil.Links).
	readAddresses func() ([]netip.Addr, error)
	clock         clock.PassiveClock
	wake          func()
	log           *zap.Logger
	// reach waits for an apiserver that cannot be reached in the
	// informers' lists and watches (untilReachable).
	reach reacher
	// metrics: the changes received and pending, and when the last was
	// queued (kube-proxy's change trackers count them the same way).
	metrics *Metrics

	mu       sync.Mutex // guards the fields below
	services map[types.NamespacedName]*model.Service
	slices   map[types.NamespacedName][]*model.EndpointSlice
	node     nodeFacts
	dirty    map[types.NamespacedName]time.Time // first unsynced change
	// backlog: the last snapshot left changes for the next sync
	// (syncBatch's bound); they are as old as pendingSince says.
	backlog bool
	rebuild bool // every Service must be rebuilt
	// rebuildAddressed: the Services whose plans hold node addresses
	// (addressedService) must be rebuilt: the node's addresses changed.
	rebuildAddressed bool
	ranges           rangeFacts
	nodes            nodeAddrs
	// changedServices are the Services whose Service changed and
	// sliceChanges the EndpointSlice changes received since the last
	// snapshot: the pending changes of the metrics.
	changedServices map[types.NamespacedName]struct{}
	sliceChanges    int
	// pendingSince is when the oldest change not yet synced was received,
	// or when node-wide failures (a kernel read, a consumer) began; zero
	// when all is applied. A Service whose own writes fail does not count
	// here: it is retried alone and reported in its status.
	pendingSince time.Time
	// What the kernel reported removed from the interface since the last
	// sync (see Proxier.watchRemovals).
	removedAddrs []netip.Addr
	linkRemoved  bool
}

// nodeFacts are what the plans need of this node besides its Services.
type nodeFacts struct {
	zone     string
	eligible bool
	// portAddrs are the node-port addresses, all every node address
	// (model.NodeInfo.Addresses).
	portAddrs, all []netip.Addr
	// addrsChanged: the kernel reported a change of the node's addresses
	// since they were last read; allChanged: all changed since the last
	// snapshot (the Service ranges are checked again).
	addrsChanged, allChanged bool
	// podCIDRs and objAddrs are the Node object's podCIDRs and addresses.
	podCIDRs []netip.Prefix
	objAddrs []netip.Addr
}

// rangeFacts are the Service ranges to route as local (setRanges), the
// objects that asked for them (sources; none when configured), and, as of
// the last sync, those routed and those refused (rangesLocked); known once
// they are, changed until a sync applies them.
type rangeFacts struct {
	prefixes       []netip.Prefix
	sources        map[netip.Prefix]*corev1.ObjectReference
	routed         []netip.Prefix
	refused        []refusedRange
	known, changed bool
}

func newTracker(cfg Config, readAddresses func() ([]netip.Addr, error), wake func(), metrics *Metrics, log *zap.Logger) *tracker {
	t := &tracker{nodeName: cfg.NodeName, nodePortAddresses: cfg.NodePortAddresses, readAddresses: readAddresses,
		clock: cfg.Clock, wake: wake, metrics: metrics, log: log, reach: newReacher(cfg.Clock, log),
		services: map[types.NamespacedName]*model.Service{},
		slices:   map[types.NamespacedName][]*model.EndpointSlice{},
		dirty:    map[types.NamespacedName]time.Time{},
		rebuild:  true,
		nodes:    nodeAddrs{byName: map[string][]netip.Addr{}},
	}
	if cfg.RouteServiceRanges && len(cfg.ServiceRanges) > 0 {
		t.ranges = rangeFacts{prefixes: RoutableRanges(cfg.ServiceRanges), known: true, changed: true}
	}
	return t
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

func (t *tracker) onService(obj any, deleted bool) {
	s, ok := serviceName(obj)
	if !ok {
		return
	}
	name := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	t.mu.Lock()
	if deleted {
		delete(t.services, name)
	} else {
		t.services[name] = s
	}
	if t.changedServices == nil {
		t.changedServices = map[types.NamespacedName]struct{}{}
	}
	t.changedServices[name] = struct{}{}
	t.metrics.ServiceChanges.Inc()
	t.metrics.ServiceChangesPending.Set(float64(len(t.changedServices)))
	t.mu.Unlock()
	t.markDirty(name, t.clock.Now())
}

func (t *tracker) onSlice(obj any, deleted bool) {
	s, name, ok := sliceOf(obj)
	if d, tomb := obj.(cache.DeletedFinalStateUnknown); tomb && d.Obj == nil {
		s, name, ok = t.sliceByKey(d.Key)
	}
	if !ok {
		return
	}
	t.mu.Lock()
	// A Service's slices, most often one: a list, not a map each.
	have := slices.DeleteFunc(t.slices[name], func(o *model.EndpointSlice) bool { return o.Name == s.Name })
	if !deleted {
		have = append(have, s)
	}
	if len(have) == 0 {
		delete(t.slices, name)
	} else {
		t.slices[name] = have
	}
	t.sliceChanges++
	t.metrics.EndpointChanges.Inc()
	t.metrics.EndpointChangesPending.Set(float64(t.sliceChanges))
	t.mu.Unlock()
	t.markDirty(name, changeTime(s, t.clock.Now()))
}

// sliceByKey finds a slice the agent holds by its informer key
// (namespace/name): a tombstone may carry only that.
func (t *tracker) sliceByKey(key string) (*model.EndpointSlice, types.NamespacedName, bool) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, types.NamespacedName{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for svc, have := range t.slices {
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

// sliceHandler is handler(t.onSlice), except that a slice whose
// kubernetes.io/service-name label changed (or went) leaves the Service it
// named before: it is listed by that label.
func (t *tracker) sliceHandler() cache.ResourceEventHandlerFuncs {
	h := handler(t.onSlice)
	h.UpdateFunc = func(old, o any) {
		if sameVersion(old, o) {
			return
		}
		if _, before, ok := sliceOf(old); ok {
			if _, after, ok := sliceOf(o); !ok || after != before {
				t.onSlice(old, true)
			}
		}
		t.onSlice(o, false)
	}
	return h
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

// handler calls add for each object added, changed or deleted. An update
// of an object to the same version is no change: an informer's relist
// (after an apiserver outage, a watch that expired) delivers one for every
// object it still holds, and marking every Service dirty then would make
// the first sync after an outage rebuild them all (kube-proxy's change
// trackers drop such updates too).
func handler(add func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { add(o, false) },
		UpdateFunc: func(old, o any) {
			if !sameVersion(old, o) {
				add(o, false)
			}
		},
		DeleteFunc: func(o any) { add(o, true) },
	}
}

// sameVersion tells an update that changes nothing: both objects carry
// the same resourceVersion, which the apiserver changes on every write.
func sameVersion(old, o any) bool {
	a, errA := meta.Accessor(old)
	b, errB := meta.Accessor(o)
	return errA == nil && errB == nil && a.GetResourceVersion() != "" && a.GetResourceVersion() == b.GetResourceVersion()
}

// markDirty records a change to a Service; at is when the change was made
// (for the programming latency metric). It queues a sync: the time is
// kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds.
func (t *tracker) markDirty(name types.NamespacedName, at time.Time) {
	t.mu.Lock()
	if _, ok := t.dirty[name]; !ok {
		t.dirty[name] = at
	}
	t.queuedLocked()
	t.metrics.LastQueued.Set(unixSeconds(t.clock.Now()))
	t.mu.Unlock()
	t.wake()
}

// queuedLocked records that a change waits to be applied; t.mu is held.
func (t *tracker) queuedLocked() {
	if t.pendingSince.IsZero() {
		t.pendingSince = t.clock.Now()
	}
}

// nodeAddressesChanged makes the next sync re-read the node's addresses.
func (t *tracker) nodeAddressesChanged() {
	t.mu.Lock()
	t.node.addrsChanged = true
	t.mu.Unlock()
	t.wake()
}

// kernelRemoved records a removal the kernel reported and wakes the loop.
func (t *tracker) kernelRemoved(r netlinkutil.Removal) {
	t.mu.Lock()
	if r.Addr.IsValid() {
		t.removedAddrs = append(t.removedAddrs, r.Addr)
	} else {
		t.linkRemoved = true
	}
	t.mu.Unlock()
	t.wake()
}

// snapshot takes the changed Services (all on a rebuild; else at most
// limit of them, 0: all, pickBatch) with their slices and the node's facts;
// on a full sync, or when the kernel reported a change, it re-reads the
// node's addresses.
func (t *tracker) snapshot(full bool, limit int) (syncInputs, error) {
	var err error
	t.mu.Lock()
	reread := full || t.node.addrsChanged
	t.node.addrsChanged = false
	t.mu.Unlock()
	if reread {
		if err = t.refreshNodeAddresses(); err != nil {
			t.mu.Lock()
			t.node.addrsChanged = true // read again at the next sync
			t.mu.Unlock()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	in := syncInputs{full: full,
		node: model.NodeInfo{Name: t.nodeName, Zone: t.node.zone, NodePortAddresses: t.node.portAddrs, Addresses: t.node.all}}
	var othersChanged bool
	in.otherNodes, othersChanged = t.othersLocked()
	in.ranges, in.rangesChanged, in.refusedRanges = t.rangesLocked(othersChanged || t.node.allChanged)
	t.node.allChanged = false
	// A full sync re-reads the kernel, not the plans: they change only
	// with their inputs (events, the node's addresses and zone, the
	// Service ranges, the schedulers the kernel refused), which set
	// rebuild.
	rebuild, addressed := t.rebuild, t.rebuildAddressed
	t.rebuild, t.rebuildAddressed = false, false
	var names []types.NamespacedName
	switch {
	case rebuild:
		in.rebuilt = true
		names = t.takeAllLocked(&in, func(*model.Service) bool { return true })
	case addressed:
		in.rebuilt = true
		names = t.takeAllLocked(&in, addressedService)
	default:
		names = t.takeBatchLocked(&in, limit)
	}
	in.services = make([]syncInput, len(names))
	for i, n := range names {
		in.services[i] = syncInput{name: n, svc: t.services[n], slices: slices.Clone(t.slices[n])}
	}
	return in, err
}

// takeAllLocked takes every change and names, beside them, every Service
// that rebuilt tells (a rebuild).
func (t *tracker) takeAllLocked(in *syncInputs, rebuilt func(*model.Service) bool) []types.NamespacedName {
	in.changed = t.takeDirtyLocked()
	names := make([]types.NamespacedName, 0, len(t.services)+len(in.changed))
	for n := range in.changed {
		names = append(names, n)
	}
	for n, s := range t.services {
		if _, ok := in.changed[n]; !ok && rebuilt(s) {
			names = append(names, n)
		}
	}
	return names
}

// addressedService reports whether s's plan holds the node's addresses:
// node ports on them, and externalIPs or LoadBalancer IPs that may be one
// of them (model.VSPlan.NodeAddress). A clusterIP's plan holds none: a
// change of the node's addresses leaves it as it is.
func addressedService(s *model.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer ||
		len(s.Spec.ExternalIPs) > 0 || len(s.Status.LoadBalancer.Ingress) > 0
}

// takeBatchLocked takes the changed Services a sync builds: all of them,
// or, past limit, the first limit by pickBatch, the rest left for the
// next sync (backlog).
func (t *tracker) takeBatchLocked(in *syncInputs, limit int) []types.NamespacedName {
	names := pickBatch(t.dirty, t.services, limit, t.clock.Now())
	if len(names) == len(t.dirty) {
		in.changed = t.takeDirtyLocked()
		return names
	}
	in.changed = make(map[types.NamespacedName]time.Time, len(names))
	for _, n := range names {
		in.changed[n] = t.dirty[n]
		delete(t.dirty, n)
		delete(t.changedServices, n)
	}
	t.backlog, in.backlog = true, len(t.dirty)
	// Pending changes are counted per Service while a backlog waits.
	t.sliceChanges = len(t.dirty) - len(t.changedServices)
	t.metrics.ServiceChangesPending.Set(float64(len(t.changedServices)))
	t.metrics.EndpointChangesPending.Set(float64(t.sliceChanges))
	return names
}

// takeDirtyLocked takes every change and clears the pending counts.
func (t *tracker) takeDirtyLocked() map[types.NamespacedName]time.Time {
	changed := t.dirty
	t.dirty = map[types.NamespacedName]time.Time{}
	t.backlog = false
	t.changedServices, t.sliceChanges = nil, 0
	t.metrics.ServiceChangesPending.Set(0)
	t.metrics.EndpointChangesPending.Set(0)
	return changed
}

// refreshNodeAddresses reads the node's addresses for node ports; a change
// rebuilds the Services that hold them (addressedService).
func (t *tracker) refreshNodeAddresses() error {
	all, err := t.readAddresses()
	if err != nil {
		return nodeFailure{part: "node addresses", err: fmt.Errorf("read node addresses: %w", err)}
	}
	t.nodeAddressesRead(all)
	return nil
}

// nodeAddressesRead takes the node's addresses as read in the loop; a
// change rebuilds the Services that hold them (at the next sync, whole),
// and is reported.
func (t *tracker) nodeAddressesRead(all []netip.Addr) bool {
	addrs := model.FilterNodePortAddresses(all, t.nodePortAddresses)
	all = model.FilterNodePortAddresses(all, nil) // sorted, each once
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.Equal(addrs, t.node.portAddrs) {
		t.log.Info("node-port addresses", zap.Stringers("addresses", addrs))
		t.node.portAddrs = addrs
		t.rebuildAddressed = true
	}
	if !slices.Equal(all, t.node.all) {
		t.node.all = all
		t.node.allChanged = true // the Service ranges are checked again
		t.rebuildAddressed = true
	}
	return t.rebuildsLocked()
}

// rebuildsLocked reports whether the next sync rebuilds plans; t.mu is
// held.
func (t *tracker) rebuildsLocked() bool { return t.rebuild || t.rebuildAddressed }

// offLoopAddresses takes the node's addresses as a periodic resync's read
// off the loop found them. That read took them as it began, which may be
// before the node's addresses last changed (under load, a minute before
// its adoption: a renumbering's new address then lost its node ports until
// the next change): addresses that differ from the loop's own are not
// taken, the next sync reads them again in the loop. It reports whether a
// sync is due for them.
func (t *tracker) offLoopAddresses(all []netip.Addr) bool {
	port := model.FilterNodePortAddresses(all, t.nodePortAddresses)
	all = model.FilterNodePortAddresses(all, nil)
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Equal(port, t.node.portAddrs) && slices.Equal(all, t.node.all) {
		return t.rebuildsLocked()
	}
	t.node.addrsChanged = true
	return true
}

// syncInputs is what one sync works from, taken under the lock.
type syncInputs struct {
	full bool
	// rebuilt: every Service is in services (a rebuild), not only the
	// changed ones; backlog: the changed Services left for the next sync.
	rebuilt bool
	backlog int
	node    model.NodeInfo
	// ranges are the Service ranges routed as local; rangesChanged: they
	// changed since the last sync.
	ranges        []netip.Prefix
	rangesChanged bool
	// refusedRanges are the Service ranges newly refused (saneRanges).
	refusedRanges []refusedRange
	// otherNodes are the other Nodes' addresses
	// (model.BuildConfig.OtherNodes).
	otherNodes map[netip.Addr]string
	// services are the Services to build, each once (a list, not a map:
	// at 100,000 a cold sync's map cost a look-up each into a table larger
	// than the CPU's caches).
	services []syncInput
	changed  map[types.NamespacedName]time.Time
}

type syncInput struct {
	name   types.NamespacedName
	svc    *model.Service
	slices []*model.EndpointSlice
}

// watch adds the informers of Services, EndpointSlices, Nodes (every
// one, for their addresses) and, when the ranges are routed and not given, ServiceCIDRs, with the
// tracker's handlers; it returns what tells when each has handled its
// initial list.
//
// The informers keep no index (the factory's would index every object by
// namespace, which the agent never asks), and model.Compact keeps in their
// caches only what the agent reads, in the agent's own types. Services and
// slices of other proxies (service-proxy-name) and headless ones are not
// ours (ServiceSelector); both are listed in pages (pagedListWatch).
func (t *tracker) watch(ctx context.Context, client kube.Client, infs *informerSet, watchRanges bool) ([]cache.InformerSynced, error) {
	svcReg, err := infs.add(serviceInformer(client, t.reach), handler(t.onService))
	if err != nil {
		return nil, fmt.Errorf("watch services: %w", err)
	}
	sliceReg, err := infs.add(sliceInformer(client, t.reach), t.sliceHandler())
	if err != nil {
		return nil, fmt.Errorf("watch endpointslices: %w", err)
	}
	nodeReg, err := infs.add(nodeInformer(client, t.reach), handler(t.onNode))
	if err != nil {
		return nil, fmt.Errorf("watch nodes: %w", err)
	}
	synced := []cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced, nodeReg.HasSynced}
	if !watchRanges {
		return synced, nil
	}
	has, err := t.watchServiceCIDRs(ctx, client, infs)
	if err != nil {
		t.log.Warn("cannot read the cluster's ServiceCIDRs (networking.k8s.io/v1, Kubernetes 1.33 and later; the ClusterRole must allow list and watch): binding one address per clusterIP; --service-cidrs names the ranges instead",
			zap.Error(err))
		return synced, nil
	}
	return append(synced, has), nil
}

// service is the Service of that name as last delivered (nil: none).
func (t *tracker) service(name types.NamespacedName) *model.Service {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.services[name]
}

// count is the number of Services held.
func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.services)
}

// status is the tracker's part of Status: the changes not yet synced, since
// when, and whether the Node may get traffic.
func (t *tracker) status() (pending int, since time.Time, eligible bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.dirty), t.pendingSince, t.node.eligible
}

// takeRemovals hands over the removals the kernel reported since the last
// call: addresses, and whether the interface itself went.
func (t *tracker) takeRemovals() ([]netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	addrs, link := t.removedAddrs, t.linkRemoved
	t.removedAddrs, t.linkRemoved = nil, false
	return addrs, link
}

// backlogged reports whether the last snapshot left changes for the next
// sync (syncBatch's bound).
func (t *tracker) backlogged() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.backlog && len(t.dirty) > 0
}

// rebuildAll makes the next sync rebuild every Service's plan (the kernel
// refused a scheduler: their Services get the default).
func (t *tracker) rebuildAll() {
	t.mu.Lock()
	t.rebuild = true
	t.mu.Unlock()
}

// queued records that something waits to be applied (a failed sync).
func (t *tracker) queued() {
	t.mu.Lock()
	t.queuedLocked()
	t.mu.Unlock()
}

// settleIfIdle clears pendingSince when nothing waits: a sync that found
// nothing to do.
func (t *tracker) settleIfIdle() {
	t.mu.Lock()
	if len(t.dirty) == 0 && !t.rebuildsLocked() {
		t.pendingSince = time.Time{}
	}
	t.mu.Unlock()
}

// settle records a successful sync that began at start: nothing pending
// unless changes came in meanwhile or others (busy) still wait, in which
// case they are no older than its start (an early bound, by at most one
// sync's duration); a backlog the sync left keeps its own age.
func (t *tracker) settle(start time.Time, busy bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.dirty) == 0 && !t.rebuildsLocked() && !busy {
		t.pendingSince = time.Time{}
		return
	}
	if !t.backlog {
		t.pendingSince = start
	}
}
