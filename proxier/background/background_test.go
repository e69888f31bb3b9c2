package background

import (
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// inF is what a read started by a Start saw of its priority.
type inF struct {
	thread, child int
	err           error
}

// runIn starts a read through start that reports its thread's nice value
// and that of a process it starts (field 19 of /proc/PID/stat), as the
// glue's check starts iptables-save.
func runIn(start Start) inF {
	done := make(chan inF)
	start(func() {
		var r inF
		if r.thread, r.err = threadNice(unix.Gettid()); r.err != nil {
			done <- r
			return
		}
		out, err := exec.Command("sh", "-c", `cut -d' ' -f19 /proc/$$/stat`).Output()
		if err != nil {
			r.err = err
		} else {
			r.child, r.err = strconv.Atoi(strings.TrimSpace(string(out)))
		}
		done <- r
	})
	return <-done
}

// TestLowPriority: the read's thread and the processes it starts run at
// the caller's nice value plus the Start's, at most 19; the caller's thread
// keeps its own; no warning. Go runs the read at the caller's priority.
func TestLowPriority(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base, err := threadNice(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	for _, c := range []struct {
		name  string
		start Start
		want  int
	}{
		{"default", LowPriority(DefaultNice, zap.New(core)), min(base+DefaultNice, 19)},
		{"beyond 19", LowPriority(100, zap.New(core)), 19},
		{"plain goroutine", Go, base},
	} {
		got := runIn(c.start)
		if got.err != nil || got.thread != c.want || got.child != c.want {
			t.Errorf("%s: the read's thread at nice %d, its child at %d (%v); want both %d", c.name, got.thread, got.child, got.err, c.want)
		}
		if now, err := threadNice(unix.Gettid()); err != nil || now != base {
			t.Errorf("%s: the caller's thread at nice %d (%v) after the read; want %d", c.name, now, err, base)
		}
	}
	if logs.Len() != 0 {
		t.Errorf("warnings: %v", logs.All())
	}
}
