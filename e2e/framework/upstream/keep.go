package upstream

import (
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
)

// RunFigures is a run of the suite as data (framework/results), as Keep
// writes it.
type RunFigures struct {
	Proxy       string       `json:"proxy"`
	Nodes       int          `json:"nodes"`
	Selection   string       `json:"selection"`
	WallSeconds float64      `json:"wall_seconds"`
	Passed      int          `json:"passed"`
	Failed      int          `json:"failed"`
	Skipped     int          `json:"skipped"`
	NotRun      int          `json:"not_run"`
	Flaked      int          `json:"flaked"`
	Tests       []TestFigure `json:"tests"`
}

// TestFigure is one test of a kept run: its outcome, time, failed
// attempts before the last, and why it failed or was skipped.
type TestFigure struct {
	Name    string  `json:"name"`
	Outcome string  `json:"outcome"`
	Seconds float64 `json:"seconds"`
	Retries int     `json:"retries,omitempty"`
	Why     string  `json:"why,omitempty"`
}

// Keep writes the run's summary as data under suite (e.g. "conformance",
// "conformance-core"): the tests that ran, with their outcome and time;
// selection says which tests were chosen (the core, a part, the
// [Conformance] ones...). It returns the file's path.
func Keep(suite string, s Summary, nodes int, selection string) (string, error) {
	f := RunFigures{Proxy: s.Proxy, Nodes: nodes, Selection: selection, WallSeconds: s.Wall.Seconds(),
		Passed: s.Passed, Failed: s.Failed, Skipped: s.Skipped, NotRun: s.NotRun, Flaked: s.Flaked}
	for _, r := range s.Rows {
		if r.NotRun {
			continue
		}
		f.Tests = append(f.Tests, TestFigure{Name: r.Name, Outcome: string(r.Outcome), Seconds: r.Duration.Seconds(),
			Retries: r.Retries, Why: r.Why})
	}
	return results.Keep(suite, f)
}
