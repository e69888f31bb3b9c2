package agent

// The sync runner: when syncs run, and whether each is full.

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/background"
)

// runner paces the syncs: a partial one when something changed (kick), no
// more often than minPeriod; a full one every period; and a partial one
// when a retry is due (a failed Service, consumer or kernel read, each with
// its own backoff). The retry time is taken from that state at every turn,
// so events never postpone or drop it.
type runner struct {
	clock     clock.WithTicker
	minPeriod time.Duration
	period    time.Duration
	trigger   chan struct{}
	// news is kicked with trigger when the tracker has something new (a
	// Service change): it ends a wait for the min period that the
	// change need not wait (waitMinPeriod).
	news chan struct{}
	log  *zap.Logger
	// background starts the resync's read off the loop.
	background background.Start

	beatMu sync.Mutex
	beat   time.Time // the loop's heartbeat (heartbeat)
}

// syncer is what the runner runs: one sync, when the earliest retry is
// due (zero: none waits), whether Service changes wait, and whether the
// last sync left some of them for the next (backlogged).
type syncer interface {
	SyncOnce(full bool) error
	nextRetry() time.Time
	changesWaiting() bool
	backlogged() bool
}

// resyncer is the reconciler's periodic resync, whose kernel read runs off
// the loop when it can.
type resyncer interface {
	StartResyncRead() (run func(), ok bool)
	ResyncReadDone() bool
	Resyncing() bool
}

func newRunner(clk clock.WithTicker, minPeriod, period time.Duration, log *zap.Logger) *runner {
	return &runner{clock: clk, minPeriod: minPeriod, period: period, trigger: make(chan struct{}, 1), news: make(chan struct{}, 1), log: log,
		background: background.Go}
}

// kickNews is kick for the tracker: it also tells a wait for the min
// period to look again whether Service changes wait.
func (r *runner) kickNews() {
	select {
	case r.news <- struct{}{}:
	default:
	}
	r.kick()
}

// kick asks for a sync; kicks before it starts are one.
func (r *runner) kick() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// turns is the runner's state between syncs.
type turns struct {
	full           bool
	last, nextFull time.Time
	// changed is when the last sync that carried Service changes began.
	changed time.Time
	// reading: a periodic resync's kernel read off the loop runs; adopt:
	// it is done, and this turn's full sync adopts it.
	reading, adopt bool
}

// run syncs until ctx ends.
func (r *runner) run(ctx context.Context, s syncer, rs resyncer) {
	t := turns{full: true}
	for {
		// The slices of a periodic resync follow one another at once
		// (changes that come meanwhile join the next one), and so do
		// the syncs of a backlog of changes (syncBatch); other syncs
		// are at least minPeriod apart, except that Service changes
		// wait only for the last sync that carried changes.
		if !r.waitMinPeriod(ctx, t, s, rs.Resyncing() || s.backlogged()) {
			return
		}
		t.last = r.clock.Now()
		if s.changesWaiting() {
			t.changed = t.last
		}
		if t.full {
			r.startFull(&t, rs)
		}
		r.beatNow()
		if t.full && t.adopt && s.changesWaiting() {
			// Changes first: the resync's read waits for one partial sync.
			r.sync(s, false)
		}
		r.sync(s, t.full)
		r.beatNow()
		t.adopt = false
		t.full = false
		r.waitNext(ctx, &t, s.nextRetry())
		if t.reading && rs.ResyncReadDone() {
			// The read is in: the resync's full sync takes it.
			t.reading = false
			t.full, t.adopt = true, true
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// sync runs one sync and logs its failure.
func (r *runner) sync(s syncer, full bool) {
	if err := s.SyncOnce(full); err != nil {
		r.log.Error("sync failed; what failed is retried with backoff", zap.Error(err),
			zap.Time("nextRetry", s.nextRetry()))
	}
}

// beatNow records that the loop is alive: it starts or has finished a sync.
func (r *runner) beatNow() {
	now := r.clock.Now()
	r.beatMu.Lock()
	r.beat = now
	r.beatMu.Unlock()
}

// heartbeat is when the loop last started or finished a sync; zero before
// its first. Between syncs the loop waits at most the period (the
// periodic sync), after the min period since the last one began.
func (r *runner) heartbeat() time.Time {
	r.beatMu.Lock()
	defer r.beatMu.Unlock()
	return r.beat
}

// waitMinPeriod waits until minPeriod has passed since the last sync
// began (not at all when atOnce: a resync, a backlog), or, while Service
// changes wait, since the last sync that carried changes: the min period
// coalesces changes, and a change waits for no sync that carried none (a
// glue check's repair, a retry, the resync's adoption of its read). False
// when ctx ended.
func (r *runner) waitMinPeriod(ctx context.Context, t turns, s syncer, atOnce bool) bool {
	if atOnce {
		return true
	}
	for {
		from := t.last
		if s.changesWaiting() {
			from = t.changed
		}
		wait := r.minPeriod - r.clock.Since(from)
		if wait <= 0 || from.IsZero() {
			return true
		}
		if done, ok := r.sleepOrNews(ctx, wait); done {
			return ok
		}
	}
}

// sleepOrNews waits d, until the tracker has news (done false: look
// again) or ctx ends (ok false).
func (r *runner) sleepOrNews(ctx context.Context, d time.Duration) (done, ok bool) {
	timer := r.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return true, false
	case <-timer.C():
		return true, true
	case <-r.news:
		return false, true
	}
}

// sleep waits d on clk; false when ctx ended first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	timer := clk.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C():
		return true
	}
}

// startFull schedules the next periodic sync. The periodic resync reads
// the kernel off the loop when it can: this turn then syncs only what
// changed, and the resync starts when the read is in.
func (r *runner) startFull(t *turns, rs resyncer) {
	t.nextFull = t.last.Add(r.period)
	if run, ok := rs.StartResyncRead(); ok {
		t.reading = true
		r.background(func() {
			run()
			r.kick()
		})
		t.full = false
	}
}

// waitNext waits for a kick, the periodic sync (which makes the next turn
// full unless a read off the loop still runs: that read is this period's),
// the retry at retryAt, or the end of ctx.
func (r *runner) waitNext(ctx context.Context, t *turns, retryAt time.Time) {
	periodic := r.clock.NewTimer(t.nextFull.Sub(r.clock.Now()))
	defer periodic.Stop()
	var retry <-chan time.Time
	if !retryAt.IsZero() {
		retryTimer := r.clock.NewTimer(retryAt.Sub(r.clock.Now()))
		defer retryTimer.Stop()
		retry = retryTimer.C()
	}
	select {
	case <-ctx.Done():
	case <-r.trigger:
	case <-periodic.C():
		t.full = !t.reading
		if !t.full {
			t.nextFull = r.clock.Now().Add(r.period)
		}
	case <-retry:
	}
}
