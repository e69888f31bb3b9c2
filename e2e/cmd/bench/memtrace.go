package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// gctraceAgent runs the bed's ipvs-proxy with the collector's trace on
// (-gctrace): each collection's heap sizes go to its log, read by
// gcPeak.
const gctraceAgent = "/usr/local/bin/ipvs-proxy-gctrace"

// installGCTrace writes gctraceAgent into the guest: it execs the agent,
// so that its process is still named ipvs-proxy.
func installGCTrace(ctx context.Context, v *vm.VM) error {
	script := "#!/bin/sh\nGODEBUG=gctrace=1 exec " + bed.GuestBinary + " \"$@\"\n"
	if err := v.WriteFile(ctx, gctraceAgent, []byte(script), 0o755); err != nil {
		return fmt.Errorf("install %s: %w", gctraceAgent, err)
	}
	return nil
}

// withGCTrace is p started through gctraceAgent.
func withGCTrace(p proxyKind) proxyKind {
	p.start = startAgentAt(gctraceAgent, p.agentArgs...)
	return p
}

// gcLine is one line of GODEBUG=gctrace=1: "gc N @T s P%: ... A->B->C MB, G MB goal".
var gcLine = regexp.MustCompile(`(?m)^gc (\d+) @([0-9.]+)s .* (\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// gcSummary is what a process's collections say about its heap.
type gcSummary struct {
	collections int
	// peakHeap: the largest heap at a collection's start (MB), and when
	// (seconds after the process started); peakGoal the largest goal.
	peakHeap, peakGoal int
	peakAt             float64
	// lastLive: the heap marked live by the last collection.
	lastLive int
}

func gcPeak(log string) gcSummary {
	var s gcSummary
	for _, m := range gcLine.FindAllStringSubmatch(log, -1) {
		s.collections++
		start, _ := strconv.Atoi(m[3])
		live, _ := strconv.Atoi(m[5])
		goal, _ := strconv.Atoi(m[6])
		if start > s.peakHeap {
			s.peakHeap = start
			s.peakAt, _ = strconv.ParseFloat(m[2], 64)
		}
		s.peakGoal = max(s.peakGoal, goal)
		s.lastLive = live
	}
	return s
}

// statusFields are the lines of /proc/PID/status that split a process's
// memory: its peak, what it holds now, and that by kind of page.
var statusFields = []string{"VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"}

// logMemory logs where ipvs-proxy's memory is (when: what the process
// has done so far), from its status (the text of /proc/PID/status), its
// mappings and, with -gctrace, its log's collections. A failed read is
// left out, not returned: it is a diagnosis.
func (bn *bench) logMemory(ctx context.Context, p proxyKind, n int, when, status, log string) {
	if !p.ours {
		return
	}
	var parts []string
	for _, l := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(l, ":")
		for _, f := range statusFields {
			if ok && k == f {
				parts = append(parts, k+" "+strings.Join(strings.Fields(v), " "))
			}
		}
	}
	msg := strings.Join(parts, ", ")
	if maps, err := bn.bed.VM.RunOK(ctx, "sh", "-c", "awk "+mappingsRss+" /proc/$(pidof "+p.comm+")/smaps | sort -rn"); err == nil {
		msg += "; resident by mapping (kB): " + strings.Join(strings.Split(strings.TrimSpace(maps), "\n"), "; ")
	}
	if g := gcPeak(log); g.collections > 0 {
		msg += fmt.Sprintf("; %d collections, the largest heap %d MB (at %.1fs), the largest goal %d MB, the last live heap %d MB",
			g.collections, g.peakHeap, g.peakAt, g.peakGoal, g.lastLive)
		if path, err := keepLog(fmt.Sprintf("agent-%s-%d-%d.log", p.name, n, g.collections), log); err == nil {
			msg += ", log " + path
		}
	}
	logf("%s, %d Services, memory after %s: %s", p.name, n, when, msg)
}

// mappingsRss is an awk program over /proc/PID/smaps: resident kB by
// mapping (its file, or [heap], [stack], "anon") and permissions, those
// of 1 MiB or more.
const mappingsRss = `'/^[0-9a-f]+-[0-9a-f]+ / { m = ($6 == "" ? "anon" : $6) "(" $2 ")" } /^Rss:/ { r[m] += $2 } END { for (k in r) if (r[k] >= 1024) print r[k], k }'`
