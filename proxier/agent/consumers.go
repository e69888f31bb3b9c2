package agent

// The consumers the sync loop drives besides the reconciler, each with its
// own retry, and the finishers that run once the node is fully programmed.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// consumerSet is the consumers of plans, the backoff of each whose last
// Sync failed (by index in list), and the pending finishers. Only the sync
// loop touches it once Run has begun.
type consumerSet struct {
	list                []consumer.Consumer
	retry               map[int]*reconciler.Backoff
	finishers           []finisher
	retryBase, retryMax time.Duration
	log                 *zap.Logger
}

// finisher is a task to run once the node is fully programmed.
type finisher struct {
	name string
	fn   func(ctx context.Context) error
}

func newConsumerSet(retryBase, retryMax time.Duration, log *zap.Logger) *consumerSet {
	return &consumerSet{retry: map[int]*reconciler.Backoff{}, retryBase: retryBase, retryMax: retryMax, log: log}
}

// add adds a consumer; one that reads off the loop gets wake.
func (cs *consumerSet) add(c consumer.Consumer, wake func()) {
	if bc, ok := c.(consumer.BackgroundConsumer); ok {
		bc.SetWake(wake)
	}
	cs.list = append(cs.list, c)
}

// setPlan tells every consumer of a Service's plan (nil: it is gone).
func (cs *consumerSet) setPlan(name types.NamespacedName, plan *model.ServicePlan) {
	for _, c := range cs.list {
		c.SetPlan(name, plan)
	}
}

// setRanges tells the consumers that need them of the Service ranges routed
// as local, before the plans built with them.
func (cs *consumerSet) setRanges(ranges []netip.Prefix) {
	for _, c := range cs.list {
		if rc, ok := c.(RangeConsumer); ok {
			rc.SetServiceRanges(ranges)
		}
	}
}

// due reports whether a consumer's retry is due or a consumer's background
// read waits to be applied.
func (cs *consumerSet) due(now time.Time) bool {
	for _, b := range cs.retry {
		if b.Due(now) {
			return true
		}
	}
	for _, c := range cs.list {
		if bc, ok := c.(consumer.BackgroundConsumer); ok && bc.Pending() {
			return true
		}
	}
	return false
}

// retrying reports whether a consumer's last Sync failed.
func (cs *consumerSet) retrying() bool { return len(cs.retry) > 0 }

// nextRetry is the earlier of next and the consumers' next retry (zero:
// none waits).
func (cs *consumerSet) nextRetry(next time.Time) time.Time {
	for _, b := range cs.retry {
		if at := b.Next(); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// sync syncs the consumers that run beside the reconciler, or those that
// follow it (after): fully when the reconciler's sync is full or the
// consumer's retry is due. A failure is that consumer's alone: it is
// retried with a full sync after its backoff.
func (cs *consumerSet) sync(now time.Time, full, after bool) error {
	var errs []error
	for i, c := range cs.list {
		if _, ok := c.(consumer.AfterReconciler); ok != after {
			continue
		}
		b := cs.retry[i]
		cfull := full || (b != nil && b.Due(now))
		if err := c.Sync(cfull); err != nil {
			if b == nil {
				b = &reconciler.Backoff{}
				cs.retry[i] = b
			}
			b.Fail(now, cs.retryBase, cs.retryMax)
			errs = append(errs, nodeFailure{part: c.Name(), err: fmt.Errorf("%s: %w", c.Name(), err)})
			continue
		}
		if sr, ok := c.(consumer.ServiceReporter); ok && sr.Retry() {
			// Healthy, but some Service's writes were refused: again
			// after the backoff.
			// (A partial sync meanwhile leaves the backoff as it is.)
			if b == nil {
				b = &reconciler.Backoff{}
				cs.retry[i] = b
				b.Fail(now, cs.retryBase, cs.retryMax)
			} else if cfull {
				b.Fail(now, cs.retryBase, cs.retryMax)
			}
			continue
		}
		if cfull || b == nil {
			delete(cs.retry, i)
		}
	}
	return errors.Join(errs...)
}

// runFinishers runs the pending finishers; those that succeed are done.
func (cs *consumerSet) runFinishers() error {
	var errs []error
	left := cs.finishers[:0]
	for _, f := range cs.finishers {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := f.fn(ctx)
		cancel()
		if err != nil {
			cs.log.Warn("finisher failed; it runs again after the next successful sync", zap.String("finisher", f.name), zap.Error(err))
			errs = append(errs, nodeFailure{part: f.name, err: fmt.Errorf("%s: %w", f.name, err)})
			left = append(left, f)
			continue
		}
		cs.log.Info("finisher done", zap.String("finisher", f.name))
	}
	cs.finishers = left
	return errors.Join(errs...)
}
