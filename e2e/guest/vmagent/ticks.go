package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// ticksResult is what ticks prints when stopped: how long it ran, its
// ticks, and each gap between two ticks longer than --gap (when it began
// on this machine's clock, how long it was), the longest gap, and the load
// average at the end.
type ticksResult struct {
	Started time.Time     `json:"started"`
	Ran     time.Duration `json:"ran"`
	Ticks   int           `json:"ticks"`
	Gaps    []tickGap     `json:"gaps"`
	Longest time.Duration `json:"longest"`
	LoadAvg string        `json:"loadavg"`
}

type tickGap struct {
	At  time.Time     `json:"at"`
	Gap time.Duration `json:"gap"`
}

// ticksCmd wakes every --every until stopped and records the wake-ups
// that came more than --gap late: the times this machine (a VM that the
// host did not run, or a process its own load starved) stood still.
func ticksCmd(args []string, stdout io.Writer) error {
	fs := newFlags("ticks")
	every := fs.Duration("every", 100*time.Millisecond, "pause between two ticks")
	gap := fs.Duration("gap", time.Second, "a tick later than this is a gap")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	res := ticksResult{Started: time.Now(), Gaps: []tickGap{}}
	last := res.Started
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(*every):
		}
		now := time.Now()
		if late := now.Sub(last) - *every; late > *gap {
			res.Gaps = append(res.Gaps, tickGap{At: last, Gap: late})
		}
		res.Longest = max(res.Longest, now.Sub(last)-*every)
		last = now
		res.Ticks++
	}
	res.Ran = time.Since(res.Started)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.LoadAvg = strings.TrimSpace(string(b))
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return fmt.Errorf("ticks: %w", err)
	}
	return nil
}
