package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ: 100 on
// Linux x86).
const clockTick = 10 * time.Millisecond

// procStat is what the benchmark reads of /proc/<pid>/stat.
type procStat struct {
	comm      string
	ppid      int
	self      time.Duration // utime + stime: every thread of the process
	children  time.Duration // cutime + cstime: children it has waited for
	startTime time.Duration // since boot
}

func readStat(pid int) (procStat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(data)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	// Fields after the command, numbered from 3 (state) as in proc(5).
	f := strings.Fields(s[closing+1:])
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	num := func(field int) int64 {
		v, _ := strconv.ParseInt(f[field-3], 10, 64)
		return v
	}
	return procStat{
		comm:      s[open+1 : closing],
		ppid:      int(num(4)),
		self:      time.Duration(num(14)+num(15)) * clockTick,
		children:  time.Duration(num(16)+num(17)) * clockTick,
		startTime: time.Duration(num(22)) * clockTick,
	}, nil
}

// allStats reads every process's stat (processes that end meanwhile are
// left out).
func allStats() (map[int]procStat, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	out := make(map[int]procStat, len(dirs))
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, err := readStat(pid); err == nil {
			out[pid] = st
		}
	}
	return out, nil
}

// findProc waits up to timeout for the one process named comm.
func findProc(comm string, timeout time.Duration) (int, procStat, error) {
	deadline := time.Now().Add(timeout)
	for {
		all, err := allStats()
		if err != nil {
			return 0, procStat{}, err
		}
		var found []int
		for pid, st := range all {
			if st.comm == comm {
				found = append(found, pid)
			}
		}
		switch {
		case len(found) == 1:
			return found[0], all[found[0]], nil
		case len(found) > 1:
			return 0, procStat{}, fmt.Errorf("%d processes named %s: %v", len(found), comm, found)
		case time.Now().After(deadline):
			return 0, procStat{}, fmt.Errorf("no process named %s after %v", comm, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// uptime is the time since boot, on the clock of /proc/<pid>/stat's start
// times.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(err) // every Linux has CLOCK_BOOTTIME
	}
	return time.Duration(ts.Nano())
}

// cpuSample is the CPU time of a process and of every process it runs.
type cpuSample struct {
	at       time.Duration // uptime
	self     time.Duration
	children time.Duration // waited-for children, and the live ones' so far
}

func (s cpuSample) total() time.Duration { return s.self + s.children }

// sampleCPU reads pid's CPU time and that of its live descendants (a child
// that runs, e.g. iptables-restore, counts before the proxy waits for it).
func sampleCPU(pid int) (cpuSample, error) {
	at := uptime()
	all, err := allStats()
	if err != nil {
		return cpuSample{}, err
	}
	st, ok := all[pid]
	if !ok {
		return cpuSample{}, fmt.Errorf("process %d has ended", pid)
	}
	s := cpuSample{at: at, self: st.self, children: st.children}
	descends := func(p int) bool {
		for depth := 0; p > 1 && depth < 32; depth++ {
			if p == pid {
				return true
			}
			p = all[p].ppid
		}
		return false
	}
	for p, c := range all {
		if p != pid && descends(c.ppid) {
			s.children += c.self + c.children
		}
	}
	return s, nil
}

// cpuLog keeps a process's CPU samples to tell when it went idle.
type cpuLog struct {
	pid     int
	samples []cpuSample
}

func (l *cpuLog) sample() (cpuSample, error) {
	s, err := sampleCPU(l.pid)
	if err != nil {
		return s, err
	}
	l.samples = append(l.samples, s)
	return s, nil
}

// idleSince returns the first sample after the process's last burst of
// work: the earliest sample from which it used less than slack of CPU up
// to the latest one. ok is false unless that was at least quiet ago.
func (l *cpuLog) idleSince(quiet, slack time.Duration) (cpuSample, bool) {
	if len(l.samples) == 0 {
		return cpuSample{}, false
	}
	last := l.samples[len(l.samples)-1]
	i := len(l.samples) - 1
	for i > 0 && last.total()-l.samples[i-1].total() < slack {
		i--
	}
	s := l.samples[i]
	return s, last.at-s.at >= quiet
}
