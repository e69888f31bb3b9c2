package main

import (
	"os"
	"testing"
	"time"
)

// TestIdleSince: the quiet period starts at the first sample after the
// last burst of CPU, and counts only once it has lasted long enough.
func TestIdleSince(t *testing.T) {
	s := func(at, cpu int) cpuSample {
		return cpuSample{at: time.Duration(at) * time.Second, self: time.Duration(cpu) * time.Millisecond}
	}
	l := cpuLog{samples: []cpuSample{s(0, 0), s(1, 500), s(2, 900), s(3, 910), s(4, 920), s(5, 930)}}
	if got, ok := l.idleSince(3*time.Second, 50*time.Millisecond); !ok || got.at != 2*time.Second {
		t.Errorf("idleSince(3s) = %v, %v; want the sample at 2s, true", got.at, ok)
	}
	if _, ok := l.idleSince(4*time.Second, 50*time.Millisecond); ok {
		t.Error("idleSince(4s): idle, but the quiet period has lasted 3s only")
	}
	l.samples = append(l.samples, s(6, 1000))
	if got, ok := l.idleSince(0, 50*time.Millisecond); !ok || got.at != 6*time.Second {
		t.Errorf("after a new burst idleSince(0) = %v, %v; want the last sample", got.at, ok)
	}
}

// TestSampleCPUSelf: this process's own stat reads, with a start time in
// the past and CPU time that grows with work.
func TestSampleCPUSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc:", err)
	}
	pid := os.Getpid()
	st, err := readStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.startTime <= 0 || st.startTime > uptime() {
		t.Errorf("start time %v, uptime %v", st.startTime, uptime())
	}
	a, err := sampleCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Work until the CPU time grows (a tick is 10 ms; a loaded machine
	// may give this process little of its time).
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		b, err := sampleCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		if b.total() > a.total() {
			return
		}
	}
	t.Errorf("CPU time did not grow over 10 s of work: %v", a.total())
}
