package agent

// Events: what every node writes to the apiserver about the Services it
// cannot program as asked. Each node writes its own, so N nodes × M bad
// Services would be N × M Events: bounded here per Service (client-go's
// spam filter) and per node (a token bucket in front of it).

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
)

// The bounds of a node's Events.
const (
	// eventsPerObjectBurst and eventsPerObjectQPS: per Service and node,
	// 10 at once, then one per 5 minutes (client-go's default is 25).
	eventsPerObjectBurst = 10
	eventsPerObjectQPS   = 1.0 / 300
	// eventsPerNodeBurst and eventsPerNodeQPS: per node, whatever the
	// number of Services, 100 at once, then one a second; the rest are
	// dropped (their log lines stay).
	eventsPerNodeBurst = 100
	eventsPerNodeQPS   = 1
)

// NewEventRecorder records Events on the API as this node's ipvs-proxy,
// within the bounds above; stop flushes and ends it.
func NewEventRecorder(ctx context.Context, client kube.Client, node string, log *zap.Logger) (_ record.EventRecorder, stop func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{
		BurstSize: eventsPerObjectBurst, QPS: eventsPerObjectQPS,
	}))
	broadcaster.StartRecordingToSink(client.Events())
	inner := broadcaster.NewRecorder(kube.NewScheme(), corev1.EventSource{Component: "ipvs-proxy", Host: node})
	return newLimitedRecorder(inner, flowcontrol.NewTokenBucketPassiveRateLimiter(eventsPerNodeQPS, eventsPerNodeBurst), log), broadcaster.Shutdown
}

// limitedRecorder drops the Events past a node-wide rate, and logs how
// many it dropped, at most once a minute.
type limitedRecorder struct {
	inner   record.EventRecorder
	limiter flowcontrol.PassiveRateLimiter
	log     *zap.Logger

	mu       sync.Mutex
	dropped  int
	lastNote time.Time
}

func newLimitedRecorder(inner record.EventRecorder, limiter flowcontrol.PassiveRateLimiter, log *zap.Logger) *limitedRecorder {
	return &limitedRecorder{inner: inner, limiter: limiter, log: log}
}

// allow takes a token for a Warning, or counts a dropped one. Normal Events
// (a failure's end: ServiceProgrammed, NodeSyncRecovered,
// VirtualServerConflictResolved) pass: dropping one would leave the last
// Event saying the failure goes on; each follows a Warning, and the spam
// filter bounds them per object.
func (r *limitedRecorder) allow(eventtype string) bool {
	if eventtype == corev1.EventTypeNormal || r.limiter.TryAccept() {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped++
	if now := time.Now(); now.Sub(r.lastNote) >= time.Minute {
		r.log.Warn("Events dropped: over the node's Event rate (the Services' log lines say the same)", zap.Int("dropped", r.dropped))
		r.lastNote, r.dropped = now, 0
	}
	return false
}

func (r *limitedRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	if r.allow(eventtype) {
		r.inner.Event(obj, eventtype, reason, message)
	}
}

func (r *limitedRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if r.allow(eventtype) {
		r.inner.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (r *limitedRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if r.allow(eventtype) {
		r.inner.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}
