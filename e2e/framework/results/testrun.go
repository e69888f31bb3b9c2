package results

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// TestRun is the figures of one `go test -json` run: each test's outcome
// and time, as CI and the named targets report them.
type TestRun struct {
	// Wall is from the first event to the last.
	WallSeconds float64 `json:"wall_seconds"`
	Passed      int     `json:"passed"`
	Failed      int     `json:"failed"`
	Skipped     int     `json:"skipped"`
	// BuildFailed names packages that did not build or whose test
	// binary failed outside any test.
	BuildFailed []string `json:"build_failed,omitempty"`
	Tests       []Test   `json:"tests"`
}

// Test is one test's (or subtest's) outcome.
type Test struct {
	Package string  `json:"package"`
	Name    string  `json:"name"`
	Outcome string  `json:"outcome"` // pass, fail or skip
	Seconds float64 `json:"seconds"`
}

// testEvent is test2json's event.
type testEvent struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// ReadTestJSON reads `go test -json` from r, writes the log to w as it
// comes and returns the run's figures. verbose writes every output line
// (the plain -v log); otherwise a test's lines are written only if it
// fails, and the packages' own lines (ok, FAIL) always. A line that is
// not JSON, such as a build error, is written as it is.
func ReadTestJSON(r io.Reader, w io.Writer, verbose bool) (TestRun, error) {
	var run TestRun
	var first, last time.Time
	held := map[string][]string{} // package + test -> its lines, when not verbose
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev testEvent
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		if !ev.Time.IsZero() {
			if first.IsZero() {
				first = ev.Time
			}
			last = ev.Time
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "output", "build-output":
			switch {
			case verbose || ev.Test == "" && ev.Output != "PASS\n":
				io.WriteString(w, ev.Output)
			case ev.Test != "":
				held[key] = append(held[key], ev.Output)
			}
		case "pass", "fail", "skip":
			if ev.Action == "fail" {
				io.WriteString(w, strings.Join(held[key], ""))
			}
			delete(held, key)
			if ev.Test == "" {
				if ev.Action == "fail" {
					run.BuildFailed = append(run.BuildFailed, ev.Package)
				}
				continue
			}
			run.Tests = append(run.Tests, Test{Package: ev.Package, Name: ev.Test, Outcome: ev.Action, Seconds: ev.Elapsed})
		case "build-fail":
			run.BuildFailed = append(run.BuildFailed, ev.Package)
		}
	}
	if err := sc.Err(); err != nil {
		return run, fmt.Errorf("read go test -json: %w", err)
	}
	run.WallSeconds = last.Sub(first).Seconds()
	run.count()
	return run, nil
}

func (run *TestRun) count() {
	run.Passed, run.Failed, run.Skipped = 0, 0, 0
	for _, t := range run.Tests {
		switch t.Outcome {
		case "pass":
			run.Passed++
		case "fail":
			run.Failed++
		case "skip":
			run.Skipped++
		}
	}
	// A package's own "fail" follows its failed tests: only one with no
	// failed test failed outside them.
	failedIn := map[string]bool{}
	for _, t := range run.Tests {
		if t.Outcome == "fail" {
			failedIn[t.Package] = true
		}
	}
	run.BuildFailed = slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(run.BuildFailed))),
		func(pkg string) bool { return failedIn[pkg] })
}

// Problems is why the run does not pass: failed tests, skipped ones (the
// suites choose tests with -run and -skip, never t.Skip), packages that
// failed outside any test, or no test at all.
func (run TestRun) Problems() []string {
	var p []string
	for _, t := range run.Tests {
		switch t.Outcome {
		case "fail":
			p = append(p, fmt.Sprintf("FAILED  %s %s", t.Package, t.Name))
		case "skip":
			p = append(p, fmt.Sprintf("SKIPPED %s %s (choose tests with -run/-skip lists, not t.Skip)", t.Package, t.Name))
		}
	}
	for _, pkg := range run.BuildFailed {
		p = append(p, fmt.Sprintf("FAILED  %s (outside any test: build, panic or TestMain)", pkg))
	}
	if len(run.Tests) == 0 && len(run.BuildFailed) == 0 {
		p = append(p, "no test ran")
	}
	return p
}

// Slowest is the n slowest top-level tests, slowest first.
func (run TestRun) Slowest(n int) []Test {
	var top []Test
	for _, t := range run.Tests {
		if !strings.Contains(t.Name, "/") {
			top = append(top, t)
		}
	}
	slices.SortStableFunc(top, func(a, b Test) int {
		switch {
		case a.Seconds > b.Seconds:
			return -1
		case a.Seconds < b.Seconds:
			return 1
		}
		return 0
	})
	return top[:min(n, len(top))]
}
