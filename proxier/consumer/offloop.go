package consumer

import (
	"time"

	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/background"
)

// OffLoop is a read of the kernel made off the sync loop, one at a time,
// whose result the loop takes when it is done: the reconciler's periodic
// resync and the iptables glue's check read this way, so that the loop's
// changes are not held up by a long read. Begin numbers a read; Drop (the
// loop read the kernel itself, or wrote what the read would judge) makes
// the read under way stale, and Take hands over only a result still
// wanted. Only the loop calls its methods; the read runs on another
// goroutine and must touch nothing the loop uses.
type OffLoop[T any] struct {
	clock clock.PassiveClock
	done  chan offLoopResult[T]
	// running: a read began and its result was not received yet; gen
	// numbers the reads, want is the one whose result is wanted (0: none).
	running   bool
	gen, want uint64
}

type offLoopResult[T any] struct {
	gen  uint64
	val  T
	took time.Duration
}

// NewOffLoop returns an OffLoop that times its reads with clk.
func NewOffLoop[T any](clk clock.PassiveClock) *OffLoop[T] {
	return &OffLoop[T]{clock: clk, done: make(chan offLoopResult[T], 1)}
}

// Begin starts a read: it returns run, which makes the read and hands its
// result over (then calls wake, if not nil, to ask the loop for a sync),
// to be run off the loop. It returns false while a read runs or its
// result waits.
func (o *OffLoop[T]) Begin(read func() T, wake func()) (run func(), ok bool) {
	if o.running {
		return nil, false
	}
	o.gen++
	o.running, o.want = true, o.gen
	gen, clk, done := o.gen, o.clock, o.done
	return func() {
		start := clk.Now()
		v := read()
		done <- offLoopResult[T]{gen: gen, val: v, took: clk.Since(start)}
		if wake != nil {
			wake()
		}
	}, true
}

// Start is Begin with the read started by start (a goroutine of its own:
// background.Go, or background.LowPriority's thread).
func (o *OffLoop[T]) Start(start background.Start, read func() T, wake func()) bool {
	run, ok := o.Begin(read, wake)
	if ok {
		start(run)
	}
	return ok
}

// Running reports whether a read began and the loop has not received its
// result yet (it may be done: see Done).
func (o *OffLoop[T]) Running() bool { return o.running }

// Done reports whether a read's result waits for Take.
func (o *OffLoop[T]) Done() bool { return len(o.done) > 0 }

// Take receives a finished read's result and the time it took; ok is false
// when none is done, or when the read was dropped.
func (o *OffLoop[T]) Take() (v T, took time.Duration, ok bool) {
	select {
	case r := <-o.done:
		o.running = false
		if r.gen != o.want {
			return v, 0, false
		}
		o.want = 0
		return r.val, r.took, true
	default:
		return v, 0, false
	}
}

// Drop makes the read under way, or its result waiting, of no use: a
// result waiting is discarded, one to come will be.
func (o *OffLoop[T]) Drop() {
	o.want = 0
	select {
	case <-o.done:
		o.running = false
	default:
	}
}
