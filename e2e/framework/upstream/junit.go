package upstream

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// junitSuites is the part of Ginkgo's JUnit report that the summary reads.
type junitSuites struct {
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name  string      `xml:"name,attr"`
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string        `xml:"name,attr"`
	Status  string        `xml:"status,attr"`
	Time    float64       `xml:"time,attr"`
	Skipped *junitMessage `xml:"skipped"`
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
	// SystemErr is the spec's timeline: with --flake-attempts it holds
	// each failed attempt ("[FAILED] Failure recorded during attempt N:"
	// and its message, then "Attempt #N Failed.  Retrying").
	SystemErr string `xml:"system-err"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// Outcome is what became of one test.
type Outcome string

// The outcomes of a test.
const (
	// Passed is a test that ran and passed.
	Passed Outcome = "passed"
	// Failed is a test that ran and failed.
	Failed Outcome = "failed"
	// Skipped is a test that the suite skipped.
	Skipped Outcome = "skipped"
	// NotRun is a selected test that did not run: the suite stopped
	// before it (a failed [SynchronizedBeforeSuite], a timeout).
	NotRun Outcome = "not run"
)

// Result is one test case of a report.
type Result struct {
	// Name is the spec's full text, without Ginkgo's "[It] " node type.
	Name    string
	Outcome Outcome
	// Why is the reason of a skip or the first line of a failure.
	Why      string
	Duration time.Duration
	// NotRun marks a spec that the focus and skip expressions left out
	// (Ginkgo reports it as skipped with no reason).
	NotRun bool
	// Retries counts the failed attempts before the last one (Ginkgo's
	// --flake-attempts); RetryWhy is the first one's failure.
	Retries  int
	RetryWhy string
}

// readJUnit parses a Ginkgo JUnit report.
func readJUnit(r io.Reader) ([]Result, error) {
	var s junitSuites
	if err := xml.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("JUnit report: %w", err)
	}
	var out []Result
	for _, suite := range s.Suites {
		for _, c := range suite.Cases {
			res := Result{Name: strings.TrimPrefix(c.Name, "[It] "), Duration: time.Duration(c.Time * float64(time.Second))}
			res.Retries, res.RetryWhy = retries(c.SystemErr)
			switch {
			case c.Failure != nil:
				res.Outcome, res.Why = Failed, firstLine(c.Failure.Message, c.Failure.Text)
			case c.Error != nil:
				res.Outcome, res.Why = Failed, firstLine(c.Error.Message, c.Error.Text)
			case c.Skipped != nil:
				res.Outcome = Skipped
				// "skipped": left out by the filters; "skipped - REASON":
				// the test called Skip; "pending": not written yet.
				reason, called := strings.CutPrefix(c.Skipped.Message, "skipped - ")
				if called {
					res.Why = firstLine(reason)
				} else {
					res.NotRun = true
					if c.Skipped.Message != "skipped" {
						res.Why = c.Skipped.Message
					}
				}
			case c.Status == "passed" || c.Status == "":
				res.Outcome = Passed
			default: // panicked, interrupted, aborted, timedout
				res.Outcome, res.Why = Failed, c.Status
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// retryMark opens the record of a failed attempt in a spec's timeline.
var retryMark = regexp.MustCompile(`(?m)^Attempt #\d+ Failed\.  Retrying`)

// retries reads a spec's timeline: the number of failed attempts that
// Ginkgo retried, and the first one's failure message.
func retries(timeline string) (int, string) {
	n := len(retryMark.FindAllStringIndex(timeline, -1))
	if n == 0 {
		return 0, ""
	}
	_, after, found := strings.Cut(timeline, "Failure recorded during attempt 1:")
	if !found {
		return n, ""
	}
	return n, firstLine(after)
}

func readJUnitFile(path string) ([]Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := readJUnit(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// firstLine is the first non-empty line of the texts.
func firstLine(texts ...string) string {
	for _, t := range texts {
		for _, l := range strings.Split(t, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				return l
			}
		}
	}
	return ""
}

// Summary is the table of one run.
type Summary struct {
	Proxy string
	// Wall is the run's wall time.
	Wall time.Duration
	// Rows are the tests of the focus, sorted by name.
	Rows                            []Result
	Passed, Failed, Skipped, NotRun int
	// Flaked counts the passed tests that failed an attempt first.
	Flaked int
}

// summarize keeps the results of the plan's tests: those run (passed,
// failed or skipped by the test itself), those the skip list leaves out
// (with the group's reason), those selected that did not run, and failed
// suite-level nodes (a failed [SynchronizedBeforeSuite] explains why
// nothing ran). all is every test's name (e2e.test --list-tests): the
// report lacks the tests when the suite failed before them.
func summarize(results []Result, all []string, p *Plan, proxy string, wall time.Duration) Summary {
	s := Summary{Proxy: proxy, Wall: wall}
	reported := map[string]bool{}
	for _, r := range results {
		reported[r.Name] = true
	}
	for _, n := range all {
		if !reported[n] {
			results = append(results, Result{Name: n, Outcome: Skipped, NotRun: true})
		}
	}
	for _, r := range results {
		suiteNode := strings.HasPrefix(r.Name, "[SynchronizedBeforeSuite]") || strings.HasPrefix(r.Name, "[BeforeSuite]") ||
			strings.HasPrefix(r.Name, "[SynchronizedAfterSuite]") || strings.HasPrefix(r.Name, "[AfterSuite]") ||
			strings.HasPrefix(r.Name, "[ReportAfterSuite]") || strings.HasPrefix(r.Name, "[ReportBeforeSuite]")
		switch {
		case suiteNode:
			if r.Outcome != Failed {
				continue
			}
		case !p.InFocus(r.Name):
			continue
		case r.NotRun:
			g := p.SkipGroupOf(r.Name)
			if g == nil {
				// Left out by --conformance-only, or the suite stopped
				// before reaching it.
				if p.conformanceOnly && !IsConformance(r.Name) {
					continue
				}
				r.Outcome = NotRun
			} else {
				r.Why = "skip list: " + g.Short()
			}
		}
		switch r.Outcome {
		case Passed:
			s.Passed++
			if r.Retries > 0 {
				s.Flaked++
			}
		case Failed:
			s.Failed++
		case Skipped:
			s.Skipped++
		case NotRun:
			s.NotRun++
		}
		s.Rows = append(s.Rows, r)
	}
	sort.SliceStable(s.Rows, func(i, j int) bool { return s.Rows[i].Name < s.Rows[j].Name })
	return s
}

// WriteMarkdown writes the summary as a Markdown table, ending with the
// plain "N passed, N failed, N skipped" line.
func (s Summary) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kubernetes e2e (Services focus) with %s\n\n", s.Proxy)
	fmt.Fprintf(&b, "Wall time: %s. Passed: %d, failed: %d, skipped: %d", s.Wall.Round(time.Second), s.Passed, s.Failed, s.Skipped)
	if s.Flaked > 0 {
		fmt.Fprintf(&b, ", passed after a failed attempt: %d", s.Flaked)
	}
	if s.NotRun > 0 {
		fmt.Fprintf(&b, ", not run: %d", s.NotRun)
	}
	b.WriteString(".\n\n")
	b.WriteString("| Test | Result | Time | Note |\n| --- | --- | ---: | --- |\n")
	for _, r := range s.Rows {
		t := ""
		if r.Duration > 0 {
			t = r.Duration.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.Name), r.Outcome, t, cell(r.note()))
	}
	fmt.Fprintf(&b, "\n%s\n", s.Line())
	_, err := io.WriteString(w, b.String())
	return err
}

// Line is the plain closing line: "N passed, N failed, N skipped", and
// the tests that passed only after a failed attempt, named.
func (s Summary) Line() string {
	l := fmt.Sprintf("%d passed, %d failed, %d skipped", s.Passed, s.Failed, s.Skipped)
	if s.Flaked == 0 {
		return l
	}
	var names []string
	for _, r := range s.Rows {
		if r.Outcome == Passed && r.Retries > 0 {
			names = append(names, r.Name)
		}
	}
	return fmt.Sprintf("%s; %d passed after a failed attempt: %s", l, s.Flaked, strings.Join(names, "; "))
}

// note is a row's Note cell: why it failed or was skipped, and its
// failed attempts.
func (r Result) note() string {
	if r.Retries == 0 {
		return r.Why
	}
	n := fmt.Sprintf("%d failed attempt(s) first; attempt 1: %s", r.Retries, r.RetryWhy)
	if r.Why != "" {
		n = r.Why + " (" + n + ")"
	}
	return n
}

// cell escapes text for a Markdown table cell of at most 300 bytes.
func cell(s string) string {
	return clip(escape(s), 300)
}

// escape makes s one cell of a Markdown table row.
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// clip shortens s to at most n bytes, ending in "..." when cut, without
// splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
