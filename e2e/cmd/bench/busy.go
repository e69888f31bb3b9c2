package main

// One change while ipvs-proxy is busy: made while its periodic resync and
// the glue's check run (-busy-rounds).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// defaultBusyWindow is the span the busy changes are spread over when the
// proxy's log shows no finished resync and glue check to measure it by.
const defaultBusyWindow = 10 * time.Second

// whileBusy times -busy-rounds single changes, each made a little later
// after the start of one of ipvs-proxy's periodic syncs, spread over the
// span that its last resync and glue check took together (from the
// resync's read to the glue's repair of its check): so that the changes
// meet every part of that work, the reads off the loop, the adoption of
// the read, the resync's slices and the check's repair (args: ipvsbench
// latency's).
func (bn *bench) whileBusy(ctx context.Context, p proxyKind, r *proxyResult, proc running, args []string) error {
	n := bn.cfg.busyRounds
	if n == 0 || !p.ours {
		return nil
	}
	window := bn.cfg.busyWindow
	if window <= 0 {
		window = busyWindow(proc.Output())
	}
	if window <= 0 {
		window = defaultBusyWindow
	}
	r.busyWindow = window.Seconds()
	var at []float64
	for i := range n {
		delay := window * time.Duration(i) / time.Duration(n)
		var lat struct {
			Seconds []float64 `json:"seconds"`
			At      []float64 `json:"at"`
		}
		if err := bn.helper(ctx, &lat, append(args, "-during-sync-of", p.comm, "-sync-delay", delay.String(), "-rounds", "1")...); err != nil {
			return err
		}
		r.busy = append(r.busy, lat.Seconds...)
		at = append(at, lat.At...)
	}
	logf("%s: one change while its resync and glue check run (spread over %v): %v", p.name, window, r.busy)
	if bn.cfg.busyDebug {
		bn.explainBusy(p, proc.Output(), at, r.busy)
	}
	slices.Sort(r.busy)
	return nil
}

// busyProcess is p as started for the restart, whose process then takes
// the busy rounds: with -busy-debug, ipvs-proxy logs at debug level, so
// that its log has every sync, partial ones too (explainBusy).
func (bn *bench) busyProcess(p proxyKind) proxyKind {
	if p.ours && bn.cfg.busyDebug && bn.cfg.busyRounds > 0 {
		p.start = startAgent(append(slices.Clone(p.agentArgs), "--log-level", "debug")...)
	}
	return p
}

// explainBusy logs, for each busy change (made at at[i], VM time, landed
// took[i] later), the syncs of the loop and the glue it met, by the
// process's debug log, and keeps that log in bin/bench.
func (bn *bench) explainBusy(p proxyKind, log string, at, took []float64) {
	if path, err := keepLog("agent-"+p.name+".log", log); err == nil {
		logf("%s: its log during the busy rounds (debug): %s", p.name, path)
	}
	entries := syncEntries(log)
	for i := range min(len(at), len(took)) {
		logf("%s: busy change %d: %.0f ms; met: %s", p.name, i, took[i]*1000, strings.Join(metSyncs(entries, at[i], took[i]), "; "))
	}
}

// keepLog writes a proxy's log into bin/bench as name.
func keepLog(name, log string) (string, error) {
	path := filepath.Join("bin", "bench", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("keep %s: %w", name, err)
	}
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		return "", fmt.Errorf("keep %s: %w", name, err)
	}
	return path, nil
}

// syncEntry is one sync of ipvs-proxy's log: the loop's ("synced") or the
// glue's ("iptables glue synced", "iptables glue checked"), with when it
// began and ended (VM time, seconds) and its fields.
type syncEntry struct {
	msg        string
	start, end float64
	fields     map[string]any
}

// syncEntries are the syncs of a JSON log, in its order.
func syncEntries(log string) []syncEntry {
	var out []syncEntry
	for _, line := range strings.Split(log, "\n") {
		i := strings.IndexByte(line, '{')
		if i < 0 {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line[i:]), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		if msg != "synced" && msg != "iptables glue synced" && msg != "iptables glue checked" {
			continue
		}
		ts, _ := m["ts"].(float64)
		d, _ := m["took"].(float64)
		out = append(out, syncEntry{msg: msg, start: ts - d, end: ts, fields: m})
	}
	return out
}

// metSyncs describes the syncs that ran while a change made at at took
// took seconds to land: each with its start relative to the change, its
// time and its scope.
func metSyncs(entries []syncEntry, at, took float64) []string {
	var out []string
	for _, e := range entries {
		if e.end < at || e.start > at+took {
			continue
		}
		f := e.fields
		var what string
		switch e.msg {
		case "synced":
			what = fmt.Sprintf("%v sync of %v Services (resyncLeft %v, ipvs %vs, consumers %vs)",
				f["kind"], f["services"], f["resyncLeft"], f["ipvs"], f["consumers"])
			if off, _ := f["readOffLoop"].(float64); off > 0 {
				what += fmt.Sprintf(", adopting a read of %vs off the loop", off)
			}
		case "iptables glue synced":
			what = fmt.Sprintf("glue sync (full %v, sets %v)", f["full"], f["sets"])
		default:
			what = fmt.Sprintf("glue check applied (read off the loop %vs)", f["readTook"])
		}
		out = append(out, fmt.Sprintf("%+.0f ms: %s, %.0f ms", (e.start-at)*1000, what, (e.end-e.start)*1000))
	}
	return out
}

// A periodic resync's adoption of its read (its start: the line's time
// less the sync's and the read's), and a glue check's end.
var (
	adoptLine   = regexp.MustCompile(`"ts":([0-9.e+]+).*"msg":"synced".*"kind":"full".*"readOffLoop":([0-9.e-]+).*"took":([0-9.e-]+)`)
	checkedLine = regexp.MustCompile(`"ts":([0-9.e+]+).*"msg":"iptables glue checked"`)
)

// busyWindow is how long ipvs-proxy's last periodic resync and glue check
// took together, by its log: from the start of the resync's read off the
// loop to the end of the last glue check after it; 0 when the log shows
// none.
func busyWindow(log string) time.Duration {
	var starts, ends []float64
	for _, m := range adoptLine.FindAllStringSubmatch(log, -1) {
		off, _ := strconv.ParseFloat(m[2], 64)
		if off == 0 {
			continue // a whole full sync, read in the loop
		}
		ts, _ := strconv.ParseFloat(m[1], 64)
		took, _ := strconv.ParseFloat(m[3], 64)
		starts = append(starts, ts-took-off)
	}
	for _, m := range checkedLine.FindAllStringSubmatch(log, -1) {
		ts, _ := strconv.ParseFloat(m[1], 64)
		ends = append(ends, ts)
	}
	for i := len(ends) - 1; i >= 0; i-- {
		for j := len(starts) - 1; j >= 0; j-- {
			if starts[j] < ends[i] {
				return time.Duration((ends[i] - starts[j]) * float64(time.Second))
			}
		}
	}
	return 0
}
