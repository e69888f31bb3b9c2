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
	// ImportPath names the package of a build-output or build-fail
	// event (Go 1.24+).
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// ReadTestJSON reads `go test -json` from r, writes the log to w as it
// comes and returns the run's figures. verbose writes every output line
// (the plain -v log); otherwise a test's lines are written only if it
// fails, and the packages' own lines (ok, FAIL) always. A line that is
// not JSON is written as it is. A test that started and never ended (its
// binary panicked in another goroutine, exited or timed out) counts as
// failed, and its lines are written at the end.
func ReadTestJSON(r io.Reader, w io.Writer, verbose bool) (TestRun, error) {
	rd := reader{w: w, verbose: verbose, held: map[string][]string{}, started: map[string]testEvent{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev testEvent
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		rd.event(ev)
	}
	if err := sc.Err(); err != nil {
		return rd.run, fmt.Errorf("read go test -json: %w", err)
	}
	rd.unfinished()
	rd.run.WallSeconds = rd.last.Sub(rd.first).Seconds()
	rd.run.count()
	return rd.run, nil
}

// reader is ReadTestJSON's state.
type reader struct {
	w           io.Writer
	verbose     bool
	run         TestRun
	first, last time.Time
	held        map[string][]string  // package + test -> its lines, when not verbose
	started     map[string]testEvent // package + test -> its run event, until it ends
}

func (rd *reader) event(ev testEvent) {
	if !ev.Time.IsZero() {
		if rd.first.IsZero() {
			rd.first = ev.Time
		}
		rd.last = ev.Time
	}
	key := ev.Package + " " + ev.Test
	switch ev.Action {
	case "run":
		rd.started[key] = ev
	case "output", "build-output":
		switch {
		case rd.verbose || ev.Test == "" && ev.Output != "PASS\n":
			// The log is best effort, as every write to w here: a
			// failing writer does not change the run's figures.
			_, _ = io.WriteString(rd.w, ev.Output)
		case ev.Test != "":
			rd.held[key] = append(rd.held[key], ev.Output)
		}
	case "pass", "fail", "skip":
		if ev.Action == "fail" {
			_, _ = io.WriteString(rd.w, strings.Join(rd.held[key], "")) // best effort, as above
		}
		delete(rd.held, key)
		delete(rd.started, key)
		if ev.Test == "" {
			if ev.Action == "fail" {
				rd.run.BuildFailed = append(rd.run.BuildFailed, ev.Package)
			}
			return
		}
		rd.run.Tests = append(rd.run.Tests, Test{Package: ev.Package, Name: ev.Test, Outcome: ev.Action, Seconds: ev.Elapsed})
	case "build-fail":
		pkg := ev.ImportPath
		if pkg == "" {
			pkg = ev.Package
		}
		rd.run.BuildFailed = append(rd.run.BuildFailed, pkg)
	}
}

// unfinished counts the tests that started and never ended as failed,
// and writes their lines.
func (rd *reader) unfinished() {
	keys := make([]string, 0, len(rd.started))
	for k := range rd.started {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ev := rd.started[k]
		fmt.Fprintf(rd.w, "testlog: %s %s started and never ended (a panic elsewhere, an exit or the timeout); its output:\n%s",
			ev.Package, ev.Test, strings.Join(rd.held[k], ""))
		rd.run.Tests = append(rd.run.Tests, Test{Package: ev.Package, Name: ev.Test, Outcome: "fail", Seconds: rd.last.Sub(ev.Time).Seconds()})
	}
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
