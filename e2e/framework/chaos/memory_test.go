package chaos

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSummarizeSlopes: a series growing 0.5 MiB a minute is 30 MiB/hour;
// a warm-up jump is left out of the slope after it; a flat series is 0;
// nodes keep the order they first appear in, samples may come unsorted.
func TestSummarizeSlopes(t *testing.T) {
	var ss []MemSample
	for m := 20; m >= 0; m-- { // newest first: Summarize sorts
		grow := 100 + 0.5*float64(m)
		flat := 80.0
		if m < 10 {
			flat = 40 + 4*float64(m) // a warm-up climb to 76
		}
		ss = append(ss, MemSample{Node: "node-2", Minute: float64(m), RSSMiB: grow}, MemSample{Node: "node-1", Minute: float64(m), RSSMiB: flat})
	}
	got := Summarize(ss, 10)
	if len(got) != 2 || got[0].Node != "node-2" || got[1].Node != "node-1" {
		t.Fatalf("summaries %+v; want node-2 then node-1", got)
	}
	g, f := got[0], got[1]
	if g.Samples != 21 || g.FirstMiB != 100 || g.LastMiB != 110 || g.PeakMiB != 110 || !near(g.Slope, 30) || !near(g.SlopeAfterWarmup, 30) || g.AfterMinutes != 10 {
		t.Errorf("growing series: %+v; want 21 samples 100 -> 110 MiB, peak 110, 30 MiB/hour, 10 minutes after the warm-up", g)
	}
	if f.Slope <= 0 || !near(f.SlopeAfterWarmup, 0) || f.PeakMiB != 80 || f.FirstMiB != 40 || f.LastMiB != 80 {
		t.Errorf("flat after a warm-up climb: %+v; want a positive whole slope, 0 after the warm-up, 40 -> 80 MiB", f)
	}
}

// TestSummarizeShortSeries: one sample has no slope; nothing after the
// warm-up leaves the slope after it 0 over 0 minutes.
func TestSummarizeShortSeries(t *testing.T) {
	got := Summarize([]MemSample{{Node: "n", Minute: 0, RSSMiB: 50}}, 10)
	if len(got) != 1 || got[0].Slope != 0 || got[0].AfterMinutes != 0 || got[0].PeakMiB != 50 {
		t.Errorf("one sample: %+v", got)
	}
	got = Summarize([]MemSample{{Node: "n", Minute: 0, RSSMiB: 50}, {Node: "n", Minute: 6, RSSMiB: 56}}, 10)
	if !near(got[0].Slope, 60) || got[0].SlopeAfterWarmup != 0 || got[0].AfterMinutes != 0 {
		t.Errorf("6 minutes, warm-up 10: %+v; want 60 MiB/hour in all, nothing after the warm-up", got[0])
	}
}
