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
	list  []consumer.Consumer
	retry map[int]*reconciler.Backoff
	// failed is the error of each consumer in retry: it still fails until
	// a full sync of it succeeds, whatever partial syncs do meanwhile.
	failed map[int]error
	// again holds the backoff of each consumer whose Sync succeeded but
	// asked to be synced again (consumer.ServiceReporter's Retry: writes
	// the kernel refused for some Service): due like a retry, but the node
	// is not failing for it.
	again               map[int]*reconciler.Backoff
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
	return &consumerSet{retry: map[int]*reconciler.Backoff{}, failed: map[int]error{}, again: map[int]*reconciler.Backoff{},
		retryBase: retryBase, retryMax: retryMax, log: log}
}

// add adds a consumer; one that reads off the loop gets wake.
func (cs *consumerSet) add(c consumer.Consumer, wake func()) {
	if bc, ok := c.(consumer.BackgroundConsumer); ok {
		bc.SetWake(wake)
	}
	cs.list = append(cs.list, c)
}

// setPlan tells every consumer of a Service's plan (nil: it is gone): the
// plan IPVS is given, or the plan as built to a consumer.AsBuilt.
func (cs *consumerSet) setPlan(name types.NamespacedName, plan, built *model.ServicePlan) {
	for _, c := range cs.list {
		if _, ok := c.(consumer.AsBuilt); ok {
			c.SetPlan(name, built)
		} else {
			c.SetPlan(name, plan)
		}
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
	for _, m := range []map[int]*reconciler.Backoff{cs.retry, cs.again} {
		for _, b := range m {
			if b.Due(now) {
				return true
			}
		}
	}
	for _, c := range cs.list {
		if bc, ok := c.(consumer.BackgroundConsumer); ok && bc.Pending() {
			return true
		}
	}
	return false
}

// yield asks the consumers that can (consumer.Yielder) to leave the
// repair of a finished background read to the next sync: this one carries
// Service changes.
func (cs *consumerSet) yield() {
	for _, c := range cs.list {
		if y, ok := c.(consumer.Yielder); ok {
			y.Yield()
		}
	}
}

// retrying reports whether a consumer's last Sync failed.
func (cs *consumerSet) retrying() bool { return len(cs.retry) > 0 }

// nextRetry is the earlier of next and the consumers' next retry (zero:
// none waits).
func (cs *consumerSet) nextRetry(next time.Time) time.Time {
	for _, m := range []map[int]*reconciler.Backoff{cs.retry, cs.again} {
		for _, b := range m {
			if at := b.Next(); next.IsZero() || at.Before(next) {
				next = at
			}
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
		b, a := cs.retry[i], cs.again[i]
		cfull := full || (b != nil && b.Due(now))
		if err := c.Sync(cfull || (a != nil && a.Due(now))); err != nil {
			if b == nil {
				b = &reconciler.Backoff{}
				cs.retry[i] = b
			}
			b.Fail(now, cs.retryBase, cs.retryMax)
			cs.failed[i] = nodeFailure{part: c.Name(), err: fmt.Errorf("%s: %w", c.Name(), err)}
			errs = append(errs, cs.failed[i])
			continue
		}
		if cfull || b == nil {
			delete(cs.retry, i)
			delete(cs.failed, i)
		} else if err := cs.failed[i]; err != nil {
			// A partial sync between the retries of a failed full one
			// (the glue: sets written, the rules still not restored).
			errs = append(errs, err)
		}
		cs.syncAgain(i, c, now)
	}
	return errors.Join(errs...)
}

// syncAgain keeps the backoff of a consumer that asks to be synced again
// (consumer.ServiceReporter's Retry): started at its first ask, doubled at
// each due sync that still asks, gone once it stops asking.
func (cs *consumerSet) syncAgain(i int, c consumer.Consumer, now time.Time) {
	sr, ok := c.(consumer.ServiceReporter)
	a := cs.again[i]
	switch {
	case !ok || !sr.Retry():
		delete(cs.again, i)
	case a == nil:
		a = &reconciler.Backoff{}
		cs.again[i] = a
		a.Fail(now, cs.retryBase, cs.retryMax)
	case a.Due(now):
		a.Fail(now, cs.retryBase, cs.retryMax)
	}
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
