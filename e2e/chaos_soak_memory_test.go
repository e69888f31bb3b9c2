package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
)

// soakMemorySuite names the soak's memory series in the results
// (chaos-soak-memory-<date>-<commit>.json); not a testlog suite.
const soakMemorySuite = "chaos-soak-memory"

// agentRSS is the resident memory of n's agent process, in MiB: its
// process_resident_memory_bytes (the process's own /proc/self/stat), read
// from its metrics on n's host. VmRSS by `pidof ipvs-proxy` is ambiguous
// on a cluster node: two processes answer (procsScript says which).
func agentRSS(ctx context.Context, n *cluster.Node) (float64, error) {
	out, err := n.VM.RunOK(ctx, "vmagent", "http", "--timeout", "20s", "http://127.0.0.1:10249/metrics")
	if err != nil {
		return 0, fmt.Errorf("%s: the agent's metrics: %w", n.Name, err)
	}
	var res agentapi.HTTPResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return 0, fmt.Errorf("%s: the agent's metrics: %w", n.Name, err)
	}
	b, ok, err := metricValue(res.Body, "process_resident_memory_bytes")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", n.Name, err)
	}
	if ok {
		return b / (1 << 20), nil
	}
	return 0, fmt.Errorf("%s: no process_resident_memory_bytes in the agent's metrics (status %d)", n.Name, res.Status)
}

// procsScript lists the node's ipvs-proxy processes: PID, parent, VmRSS,
// command line.
const procsScript = `for p in $(pidof ipvs-proxy); do echo "$p ppid $(awk '/^PPid/{print $2}' /proc/$p/status) ` +
	`$(grep VmRSS /proc/$p/status) $(tr '\0' ' ' </proc/$p/cmdline)"; done`

// memWatch reads each node's agent's RSS every minute until stop, which
// takes one reading more and returns them all.
type memWatch struct {
	stop func() []chaos.MemSample
}

func (s *soak) watchMemory(t *testing.T, start time.Time) memWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(s.ctx)
	var mu sync.Mutex
	var samples []chaos.MemSample
	for _, n := range s.c.Nodes {
		out, err := n.VM.RunOK(s.ctx, "sh", "-c", procsScript)
		t.Logf("%s: ipvs-proxy processes (%v):\n%s", n.Name, err, out)
	}
	read := func() {
		for _, n := range s.c.Nodes {
			mib, err := agentRSS(ctx, n)
			if err != nil {
				if ctx.Err() == nil {
					t.Logf("memory: %v", err)
				}
				continue
			}
			mu.Lock()
			samples = append(samples, chaos.MemSample{Node: n.Name, Minute: time.Since(start).Minutes(), RSSMiB: mib})
			mu.Unlock()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for read(); ; read() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	halt := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(halt) // no reading may log after the test
	return memWatch{stop: func() []chaos.MemSample {
		halt()
		ctx = s.ctx
		read()
		return samples
	}}
}

// memory summarizes the series per node, logs it, and fails the test for
// clear growth: a slope after the warm-up above soakSlopeLimit, asserted
// only when that part spans soakSlopeSpan minutes or more.
func (s *soak) memory(t *testing.T, samples []chaos.MemSample) []chaos.MemSummary {
	t.Helper()
	sums := chaos.Summarize(samples, soakWarmup)
	if len(sums) != len(s.c.Nodes) {
		t.Errorf("memory read on %d nodes of %d: %+v", len(sums), len(s.c.Nodes), sums)
	}
	for _, m := range sums {
		t.Logf("%s: agent RSS %d readings, first %.1f, last %.1f, peak %.1f MiB; slope %.1f MiB/hour in all, %.1f after minute %.0f (%.0f minutes of it)",
			m.Node, m.Samples, m.FirstMiB, m.LastMiB, m.PeakMiB, m.Slope, m.SlopeAfterWarmup, soakWarmup, m.AfterMinutes)
		switch {
		case m.AfterMinutes < soakSlopeSpan:
			t.Logf("%s: the slope is not asserted: %.0f minutes read after the warm-up, fewer than %.0f", m.Node, m.AfterMinutes, soakSlopeSpan)
		case m.SlopeAfterWarmup > soakSlopeLimit:
			t.Errorf("%s: the agent's RSS grew %.1f MiB/hour after minute %.0f (limit %.0f): %.1f -> %.1f MiB, peak %.1f",
				m.Node, m.SlopeAfterWarmup, soakWarmup, soakSlopeLimit, m.FirstMiB, m.LastMiB, m.PeakMiB)
		}
	}
	return sums
}

// soakFigures is the soak's record in the results: its size and churn,
// each node's memory in short and the per-minute series.
type soakFigures struct {
	Services    int                `json:"services"`
	SoakSeconds float64            `json:"soak_seconds"`
	Rounds      int                `json:"rounds"`
	Memory      []chaos.MemSummary `json:"memory"`
	Samples     []chaos.MemSample  `json:"samples"`
}

// keep writes the soak's figures into the results (framework/results).
func (s *soak) keep(t *testing.T, samples []chaos.MemSample, sums []chaos.MemSummary) {
	t.Helper()
	p, err := results.Keep(soakMemorySuite, soakFigures{Services: s.size, SoakSeconds: s.dur.Seconds(), Rounds: s.churn.rounds,
		Memory: sums, Samples: samples})
	if err != nil {
		t.Errorf("keep the memory series: %v", err)
		return
	}
	t.Logf("memory series in %s", p)
}

// memNotes is the memory in a chaos row's notes.
func memNotes(sums []chaos.MemSummary) string {
	var parts []string
	for _, m := range sums {
		parts = append(parts, fmt.Sprintf("%s %.0f -> %.0f MiB (peak %.0f), %.1f MiB/hour (%.1f after minute %.0f)",
			m.Node, m.FirstMiB, m.LastMiB, m.PeakMiB, m.Slope, m.SlopeAfterWarmup, soakWarmup))
	}
	return strings.Join(parts, ", ")
}

// TestMetricValue: a series' value from the text format, absent, or a
// line that is not a number.
func TestMetricValue(t *testing.T) {
	body := "# HELP x\nprocess_resident_memory_bytes 5.24288e+07\nipvs_proxy_sync_netlink_writes_sum 804\nbad nope\n"
	if v, ok, err := metricValue(body, "process_resident_memory_bytes"); v != 52428800 || !ok || err != nil {
		t.Errorf("rss: %v %v %v", v, ok, err)
	}
	if v, ok, err := metricValue(body, "ipvs_proxy_sync_netlink_writes"); v != 0 || ok || err != nil {
		t.Errorf("a prefix of a series matched: %v %v %v", v, ok, err)
	}
	if _, _, err := metricValue(body, "bad"); err == nil {
		t.Error("a value that is no number: no error")
	}
}
