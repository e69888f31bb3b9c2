// Package background starts the agent's reads off its sync loop (the
// periodic resync's read of the kernel, the iptables glue's check) at a
// lower CPU priority than the loop, so that on a busy node a change's sync
// gets the CPU before the background work does.
//
// The sync loop and a background read share the agent's CPU share (the
// container's cgroup); the kernel divides it among their threads by their
// nice values. A read runs on an OS thread of its own, locked to its
// goroutine, with a higher nice value; the processes it starts
// (iptables-save) inherit it. The thread is never unlocked: it ends with
// the read's goroutine, so no other goroutine ever runs at that priority.
package background

import (
	"fmt"
	"runtime"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Start runs f off the caller's goroutine.
type Start func(f func())

// Go is a Start that runs f on a plain goroutine.
func Go(f func()) { go f() }

// DefaultNice is the nice value LowPriority adds for the agent's reads: a
// thread at +10 weighs about a tenth of one at 0 (the kernel's weights
// grow by 1.25 a step), so the loop keeps about 90% of the agent's share
// while both want the CPU, and a read on an idle node still runs at once.
const DefaultNice = 10

// LowPriority returns a Start that runs f at nice higher than the calling
// thread's (at most 19, the lowest priority). A thread whose priority
// cannot be set runs f at the normal one; the first such failure is
// logged as a warning.
func LowPriority(nice int, log *zap.Logger) Start {
	var once sync.Once
	return func(f func()) {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with f
			if err := lowerThread(nice); err != nil {
				once.Do(func() {
					log.Warn("background reads run at the sync loop's priority", zap.Error(err))
				})
			}
			f()
		}()
	}
}

// lowerThread raises the calling thread's nice value by nice.
func lowerThread(nice int) error {
	tid := unix.Gettid()
	cur, err := threadNice(tid)
	if err != nil {
		return err
	}
	want := min(cur+nice, 19)
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, want); err != nil {
		return fmt.Errorf("set thread %d's nice value to %d: %w", tid, want, err)
	}
	return nil
}

// threadNice is thread tid's nice value. The getpriority system call
// returns 20 - nice (so that no value is negative); golang.org/x/sys
// passes the raw value on.
func threadNice(tid int) (int, error) {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return 0, fmt.Errorf("read thread %d's nice value: %w", tid, err)
	}
	return 20 - raw, nil
}
