package main

// One change while ipvs-proxy is busy: made while its periodic resync and
// the glue's check run (-busy-rounds).

import (
	"context"
	"regexp"
	"slices"
	"strconv"
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
	window := busyWindow(proc.Output())
	if window <= 0 {
		window = defaultBusyWindow
	}
	r.busyWindow = window.Seconds()
	for i := range n {
		delay := window * time.Duration(i) / time.Duration(n)
		var lat struct {
			Seconds []float64 `json:"seconds"`
		}
		if err := bn.helper(ctx, &lat, append(args, "-during-sync-of", p.comm, "-sync-delay", delay.String(), "-rounds", "1")...); err != nil {
			return err
		}
		r.busy = append(r.busy, lat.Seconds...)
	}
	logf("%s: one change while its resync and glue check run (spread over %v): %v", p.name, window, r.busy)
	slices.Sort(r.busy)
	return nil
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
