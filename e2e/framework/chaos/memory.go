package chaos

import "slices"

// MemSample is one reading of a node's agent's resident memory during a
// soak.
type MemSample struct {
	Node string `json:"node"`
	// Minute is the time of the reading since the soak began.
	Minute float64 `json:"minute"`
	RSSMiB float64 `json:"rss_mib"`
}

// MemSummary is one node's series in short: its first, last and peak
// readings and the least-squares slope of the whole series and of the
// part after the warm-up, in MiB per hour.
type MemSummary struct {
	Node     string  `json:"node"`
	Samples  int     `json:"samples"`
	FirstMiB float64 `json:"first_mib"`
	LastMiB  float64 `json:"last_mib"`
	PeakMiB  float64 `json:"peak_mib"`
	// Slope is over every sample; SlopeAfterWarmup over those at or after
	// the warm-up, which span AfterMinutes (0: fewer than two samples).
	Slope            float64 `json:"slope_mib_per_hour"`
	SlopeAfterWarmup float64 `json:"slope_after_warmup_mib_per_hour"`
	AfterMinutes     float64 `json:"after_warmup_minutes"`
}

// Summarize summarizes samples per node (in the order nodes first appear);
// warmup is the minute from which SlopeAfterWarmup counts.
func Summarize(samples []MemSample, warmup float64) []MemSummary {
	var order []string
	byNode := map[string][]MemSample{}
	for _, s := range samples {
		if _, ok := byNode[s.Node]; !ok {
			order = append(order, s.Node)
		}
		byNode[s.Node] = append(byNode[s.Node], s)
	}
	out := make([]MemSummary, 0, len(order))
	for _, n := range order {
		out = append(out, summarizeNode(n, byNode[n], warmup))
	}
	return out
}

func summarizeNode(node string, ss []MemSample, warmup float64) MemSummary {
	slices.SortFunc(ss, func(a, b MemSample) int {
		switch {
		case a.Minute < b.Minute:
			return -1
		case a.Minute > b.Minute:
			return 1
		}
		return 0
	})
	m := MemSummary{Node: node, Samples: len(ss), FirstMiB: ss[0].RSSMiB, LastMiB: ss[len(ss)-1].RSSMiB}
	var after []MemSample
	for _, s := range ss {
		m.PeakMiB = max(m.PeakMiB, s.RSSMiB)
		if s.Minute >= warmup {
			after = append(after, s)
		}
	}
	m.Slope = slopePerHour(ss)
	if len(after) >= 2 {
		m.SlopeAfterWarmup = slopePerHour(after)
		m.AfterMinutes = after[len(after)-1].Minute - after[0].Minute
	}
	return m
}

// slopePerHour is the least-squares slope of RSS over time, in MiB per
// hour; 0 for fewer than two distinct times.
func slopePerHour(ss []MemSample) float64 {
	n := float64(len(ss))
	var sx, sy float64
	for _, s := range ss {
		sx += s.Minute
		sy += s.RSSMiB
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for _, s := range ss {
		sxy += (s.Minute - mx) * (s.RSSMiB - my)
		sxx += (s.Minute - mx) * (s.Minute - mx)
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx * 60
}
