package agent

// The reporter: what the agent tells about its syncs and Services, in
// metrics, logs, Events and the health that /healthz and /livez read.

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// reporter keeps the outcome of the syncs: the health, each Service's
// warnings and problems, and when each change not yet programmed was made
// (for the programming latency).
type reporter struct {
	metrics  *Metrics
	recorder record.EventRecorder // nil: no Events
	node     string               // the Node that node-wide Events are about
	clock    clock.PassiveClock
	log      *zap.Logger
	// changes holds, per Service, when its oldest change not yet in the
	// kernel was made. Only the sync loop touches it.
	changes map[types.NamespacedName]time.Time

	mu       sync.Mutex // guards the fields below
	warnings map[types.NamespacedName]string
	problems []reconciler.ServiceStatus // failing or in conflict, as of the last sync
	lastOK   time.Time
	lastErr  error
	failing  []string // node-wide parts whose last sync failed (nodeFailure)
}

// outcome is what the reporter reads of the reconciler after a sync.
type outcome interface {
	Counts() (virtualServers, realServers int)
	Problems() []reconciler.ServiceStatus
	Failing(name types.NamespacedName) bool
}

func newReporter(metrics *Metrics, recorder record.EventRecorder, node string, clk clock.PassiveClock, log *zap.Logger) *reporter {
	return &reporter{metrics: metrics, recorder: recorder, node: node, clock: clk, log: log,
		changes: map[types.NamespacedName]time.Time{}, warnings: map[types.NamespacedName]string{}}
}

// syncHealth is the reporter's part of Status.
type syncHealth struct {
	lastOK  time.Time
	lastErr error
	failing []string
}

// health is the last successful sync, the last sync's error and the
// node-wide parts that failed in it.
func (r *reporter) health() syncHealth {
	r.mu.Lock()
	defer r.mu.Unlock()
	return syncHealth{lastOK: r.lastOK, lastErr: r.lastErr, failing: slices.Clone(r.failing)}
}

// serviceProblems returns the problems as of the last sync.
func (r *reporter) serviceProblems() []reconciler.ServiceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.problems)
}

// changed records when the Services' changes were made; the earliest one
// not yet programmed counts.
func (r *reporter) changed(changes map[types.NamespacedName]time.Time) {
	if len(r.changes) == 0 && len(changes) > 64 {
		r.changes = make(map[types.NamespacedName]time.Time, len(changes)) // sized once, not grown
	}
	for n, at := range changes {
		if old, ok := r.changes[n]; !ok || at.Before(old) {
			r.changes[n] = at
		}
	}
}

// warn logs a Service's warnings and raises an Event when they change.
func (r *reporter) warn(name types.NamespacedName, svc *model.Service, warnings []string) {
	msg := strings.Join(warnings, "; ")
	r.mu.Lock()
	old := r.warnings[name]
	if msg == "" {
		delete(r.warnings, name)
	} else {
		r.warnings[name] = msg
	}
	n := len(r.warnings)
	r.mu.Unlock()
	r.metrics.ServicesWithWarning.Set(float64(n))
	if msg == "" || msg == old {
		return
	}
	r.log.Warn("service has problems; programmed what could be", zap.String("service", name.String()), zap.Strings("problems", warnings))
	if r.recorder != nil && svc != nil {
		r.recorder.Event(svc.Ref(), corev1.EventTypeWarning, "IPVSProxyConfig", msg)
	}
}

// conflicts logs a Service's conflicts and raises an Event on it.
func (r *reporter) conflicts(name types.NamespacedName, st reconciler.ServiceStatus, svc *model.Service) {
	if len(st.Conflicts) == 0 {
		r.log.Info("service no longer in conflict", zap.String("service", name.String()))
		if r.recorder != nil && svc != nil {
			r.recorder.Event(svc.Ref(), corev1.EventTypeNormal, "VirtualServerConflictResolved", "the Service holds every virtual server it wants")
		}
		return
	}
	msgs := make([]string, len(st.Conflicts))
	for i, c := range st.Conflicts {
		msgs[i] = c.String()
	}
	msg := strings.Join(msgs, "; ") + "; this Service gets no traffic there"
	r.log.Warn("virtual servers held by an older Service", zap.String("service", name.String()), zap.Strings("conflicts", msgs))
	if r.recorder != nil && svc != nil {
		r.recorder.Event(svc.Ref(), corev1.EventTypeWarning, "VirtualServerConflict", msg)
	}
}

// syncTimes are the parts of a sync's time beside the reconciler's: the
// snapshot and build of the plans, and the consumers' syncs; and what it
// left for the next.
type syncTimes struct {
	build, consumers time.Duration
	// backlog is the changed Services the sync left for the next
	// (syncBatch's bound).
	backlog int
}

// record takes a sync's outcome into metrics, logs and health: recErr is
// the reconciler's, nodeErr that of the node's addresses and consumers;
// times are the sync's parts beside the reconciler's. It returns the error
// that makes the node unhealthy: a failed kernel read or node-wide
// failure (nil when healthy); per-Service failures are the Services' own
// (status, Events, metrics).
func (r *reporter) record(start time.Time, st reconciler.SyncStats, times syncTimes, rec outcome, recErr, nodeErr error) error {
	now := r.clock.Now()
	r.logSync(st, times, now.Sub(start))
	problems := r.countServices(st, rec)
	if !st.ReadFailed { // a failed kernel read applied nothing
		r.observeLatency(now, rec)
	}
	if recErr != nil || nodeErr != nil {
		r.metrics.SyncErrors.Inc()
	}
	var healthErr error
	if st.ReadFailed {
		healthErr = nodeFailure{part: "kernel read", err: recErr}
	}
	healthErr = errors.Join(healthErr, nodeErr)
	r.nodeFailing(healthErr)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = problems
	r.lastErr = errors.Join(recErr, nodeErr)
	if healthErr == nil {
		r.metrics.LastSuccessfulSync.Set(unixSeconds(now))
		r.lastOK = now
	}
	return healthErr
}

// nodeFailing records the node-wide parts that failed in a sync (err nil:
// none) for Status and the ipvs_proxy_node_sync_failing gauge, and raises
// an Event on the Node when they change: its message names the parts, not
// the errors, which name Services and addresses (the log has them, with
// ipvs-proxy status).
func (r *reporter) nodeFailing(err error) {
	parts := failedParts(err)
	r.mu.Lock()
	old := r.failing
	r.failing = parts
	r.mu.Unlock()
	if slices.Equal(old, parts) {
		return
	}
	r.metrics.NodeSyncFailing.Reset()
	for _, p := range parts {
		r.metrics.NodeSyncFailing.WithLabelValues(p).Set(1)
	}
	if r.recorder == nil || r.node == "" {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Node", Name: r.node, UID: types.UID(r.node)}
	if len(parts) == 0 {
		r.recorder.Event(ref, corev1.EventTypeNormal, "NodeSyncRecovered", "every node-wide part of the sync succeeds again")
		return
	}
	r.recorder.Eventf(ref, corev1.EventTypeWarning, "NodeSyncFailed",
		"failing: %s; retried with backoff; details in ipvs-proxy's log on the node and in `ipvs-proxy status`", strings.Join(parts, ", "))
}

// nodeFailure is the failure of one node-wide part of a sync: a consumer
// (the iptables glue), a finisher, the node's addresses, the kernel read.
// part names it where the error's details must not go (/healthz, Events).
type nodeFailure struct {
	part string
	err  error
}

func (f nodeFailure) Error() string { return f.err.Error() }
func (f nodeFailure) Unwrap() error { return f.err }

// failedParts are the parts of err's node failures, sorted, each once;
// "sync" stands for a failure of no named part. A joined error counts
// each of its errors.
func failedParts(err error) []string {
	if err == nil {
		return nil
	}
	var parts []string
	var walk func(error)
	walk = func(e error) {
		if joined, ok := e.(interface{ Unwrap() []error }); ok {
			for _, b := range joined.Unwrap() {
				walk(b)
			}
			return
		}
		var f nodeFailure
		if errors.As(e, &f) {
			parts = append(parts, f.part)
		} else {
			parts = append(parts, "sync")
		}
	}
	walk(err)
	slices.Sort(parts)
	return slices.Compact(parts)
}

// slowSync is the time from which a partial sync is logged at info level,
// with its parts: what a change waited for (a full sync always is).
const slowSync = time.Second

// logSync observes a sync's duration and writes, and logs it.
func (r *reporter) logSync(st reconciler.SyncStats, times syncTimes, total time.Duration) {
	kind := "partial"
	if st.Full {
		kind = "full"
	}
	r.metrics.SyncDuration.Observe(total.Seconds())
	if st.Full {
		r.metrics.FullSyncDuration.Observe(total.Seconds())
	} else {
		r.metrics.PartialSyncDuration.Observe(total.Seconds())
	}
	r.metrics.WritesPerSync.Observe(float64(st.Writes))
	logAt := r.log.Debug
	if st.Full || total >= slowSync {
		logAt = r.log.Info
	}
	logAt("synced", zap.String("kind", kind), zap.Int("services", st.Services), zap.Int("failed", len(st.Failed)),
		zap.Int("writes", st.Writes), zap.Int("reads", st.Reads), zap.Duration("ipvs", st.Duration),
		zap.Duration("read", st.Read), zap.Duration("bind", st.Bind), zap.Duration("readOffLoop", st.ReadOffLoop), zap.Duration("build", times.build), zap.Duration("consumers", times.consumers),
		zap.Duration("took", total), zap.Int("resyncLeft", st.ResyncLeft), zap.Int("backlog", times.backlog))
	if st.ResyncDone {
		r.metrics.ResyncDuration.Observe(st.ResyncTook.Seconds())
		r.log.Info("full resync complete", zap.Duration("took", st.ResyncTook))
	}
}

// countServices sets the gauges of kernel objects and of Services failing
// or in conflict, and returns the reconciler's problems.
func (r *reporter) countServices(st reconciler.SyncStats, rec outcome) []reconciler.ServiceStatus {
	r.metrics.ServiceFailures.Add(float64(len(st.Failed)))
	vs, rs := rec.Counts()
	r.metrics.VirtualServers.Set(float64(vs))
	r.metrics.RealServers.Set(float64(rs))
	failing, conflicts := 0, 0
	problems := rec.Problems()
	for _, s := range problems {
		if s.Failures > 0 {
			failing++
		}
		if len(s.Conflicts) > 0 {
			conflicts++
		}
	}
	r.metrics.ServicesFailing.Set(float64(failing))
	r.metrics.ServicesInConflict.Set(float64(conflicts))
	return problems
}

// observeLatency observes the programming latency of every change whose
// Service is not failing: it is programmed.
func (r *reporter) observeLatency(now time.Time, rec outcome) {
	held := len(r.changes)
	for n, at := range r.changes {
		if rec.Failing(n) {
			continue
		}
		r.metrics.ProgrammingLatency.Observe(now.Sub(at).Seconds())
		delete(r.changes, n)
	}
	if len(r.changes) == 0 && held > 64 { // a map keeps its largest size
		r.changes = map[types.NamespacedName]time.Time{}
	}
}
