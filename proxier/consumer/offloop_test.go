package consumer

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestOffLoop: one read at a time; its result is taken once, with the time
// it took; a read dropped before or after it ran is never handed over, and
// a new read can begin only once the loop has received the old one's
// result.
func TestOffLoop(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC))
	o := NewOffLoop[int](clk)
	woken := 0
	run, ok := o.Begin(func() int { clk.Step(3 * time.Second); return 7 }, func() { woken++ })
	if !ok || !o.Running() || o.Done() {
		t.Fatalf("Begin: ok %v, running %v, done %v", ok, o.Running(), o.Done())
	}
	if _, again := o.Begin(func() int { return 0 }, nil); again {
		t.Fatal("a second read began while one runs")
	}
	if _, _, ok := o.Take(); ok {
		t.Fatal("Take handed over a read that has not run")
	}
	run()
	if !o.Done() || woken != 1 {
		t.Fatalf("after the read: done %v, woken %d", o.Done(), woken)
	}
	v, took, ok := o.Take()
	if !ok || v != 7 || took != 3*time.Second || o.Running() || o.Done() {
		t.Fatalf("Take = %d, %v, %v; running %v, done %v", v, took, ok, o.Running(), o.Done())
	}
	if _, _, ok := o.Take(); ok {
		t.Fatal("a result was taken twice")
	}

	// Dropped while it runs: its result is discarded when it comes.
	run, _ = o.Begin(func() int { return 8 }, nil)
	o.Drop()
	if !o.Running() {
		t.Fatal("a dropped read still running is not counted as running")
	}
	run()
	if _, _, ok := o.Take(); ok || o.Running() {
		t.Fatalf("a read dropped while it ran was handed over (ok %v) or still counts as running", ok)
	}

	// Dropped once done: discarded at once.
	run, _ = o.Begin(func() int { return 9 }, nil)
	run()
	o.Drop()
	if o.Running() || o.Done() {
		t.Fatalf("after dropping a finished read: running %v, done %v", o.Running(), o.Done())
	}
	if _, ok := o.Begin(func() int { return 10 }, nil); !ok {
		t.Fatal("no new read after a dropped one")
	}
}
