package upstream

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Column is one column of a comparison table: the reports of one proxy's
// runs (the parts of a run, a rerun of some tests) on clusters of one
// size.
type Column struct {
	// Label heads the column; it starts with the proxy's name ("ipvs-proxy",
	// "kube-proxy run 2"), which chooses the skip list's groups.
	Label string
	// Reports are JUnit files, or directories holding junit_01.xml, in the
	// order they ran: a test reported by several (a part, then a rerun
	// alone) shows every outcome, first to last.
	Reports []string
}

// Proxy is the proxy the column's label names.
func (c Column) Proxy() string {
	for _, p := range []string{"ipvs-proxy", "kube-proxy"} {
		if strings.HasPrefix(c.Label, p) {
			return p
		}
	}
	return ""
}

// ParseColumn reads "LABEL=REPORT,REPORT,...".
func ParseColumn(arg string) (Column, error) {
	label, reports, ok := strings.Cut(arg, "=")
	c := Column{Label: strings.TrimSpace(label)}
	for _, r := range strings.Split(reports, ",") {
		if r = strings.TrimSpace(r); r != "" {
			c.Reports = append(c.Reports, r)
		}
	}
	if !ok || len(c.Reports) == 0 || c.Proxy() == "" {
		return Column{}, fmt.Errorf("column %q: want PROXY[ LABEL]=REPORT[,REPORT...], PROXY ipvs-proxy or kube-proxy", arg)
	}
	return c, nil
}

// columnResults are what one column's reports say of each test that ran
// (passed, failed or skipped by the test itself), in report order.
type columnResults struct {
	plan *Plan
	ran  map[string][]Result
}

// Compare writes a Markdown table of the focus's tests that a cluster of
// nodes nodes runs with at least one column's proxy, one column per
// Column: each cell is the test's outcome and time in each report that
// ran it ("not run" if none did), with its failed attempts noted. A last
// row counts each column's tests by their last outcome.
func Compare(w io.Writer, nodes int, cols []Column) error {
	if len(cols) == 0 {
		return fmt.Errorf("compare: no columns")
	}
	names := map[string]bool{}
	var crs []columnResults
	for _, c := range cols {
		p, err := NewPlan(false)
		if err != nil {
			return err
		}
		if err := p.ForNodes(nodes); err != nil {
			return err
		}
		if err := p.ForProxy(c.Proxy()); err != nil {
			return err
		}
		cr := columnResults{plan: p, ran: map[string][]Result{}}
		for _, r := range c.Reports {
			path := r
			if fi, err := os.Stat(r); err == nil && fi.IsDir() {
				path = filepath.Join(r, "junit_01.xml")
			}
			res, err := readJUnitFile(path)
			if err != nil {
				return fmt.Errorf("compare: column %q: %w", c.Label, err)
			}
			for _, x := range res {
				if !p.InFocus(x.Name) {
					continue
				}
				if p.selected(x.Name) {
					names[x.Name] = true
				}
				if !x.NotRun {
					cr.ran[x.Name] = append(cr.ran[x.Name], x)
					names[x.Name] = true
				}
			}
		}
		crs = append(crs, cr)
	}
	sorted := slices.Sorted(maps.Keys(names))
	var b strings.Builder
	fmt.Fprintf(&b, "| test (%d on %d node(s)) |", len(sorted), nodes)
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", cell(c.Label))
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	counts := make([]map[Outcome]int, len(cols))
	for i := range counts {
		counts[i] = map[Outcome]int{}
	}
	for _, n := range sorted {
		fmt.Fprintf(&b, "| %s |", cell(strings.TrimPrefix(n, "[sig-network] ")))
		for i, cr := range crs {
			rs := cr.ran[n]
			last := NotRun
			switch {
			case len(rs) > 0:
				last = rs[len(rs)-1].Outcome
			case !cr.plan.selected(n):
				if g := cr.plan.SkipGroupOf(n); g != nil {
					fmt.Fprintf(&b, " skip list: %s |", cell(g.Short()))
					counts[i]["skip list"]++
					continue
				}
			}
			counts[i][last]++
			fmt.Fprintf(&b, " %s |", escape(outcomes(rs)))
		}
		b.WriteString("\n")
	}
	b.WriteString("| **in all** |")
	for i := range cols {
		var parts []string
		for _, o := range []Outcome{Passed, Failed, Skipped, NotRun, "skip list"} {
			if n := counts[i][o]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, o))
			}
		}
		fmt.Fprintf(&b, " %s |", strings.Join(parts, ", "))
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// reasonLen bounds each reason in a cell of the table, so that a long
// failure message cannot hide the outcomes after it.
const reasonLen = 160

// outcomes is a cell: each report's outcome of the test, first to last,
// each reason clipped to reasonLen (the last outcome is the one counted,
// so it must always show).
func outcomes(rs []Result) string {
	if len(rs) == 0 {
		return string(NotRun)
	}
	var parts []string
	for _, r := range rs {
		s := string(r.Outcome)
		if r.Duration > 0 {
			s += " " + r.Duration.Round(100*time.Millisecond).String()
		}
		if r.Retries > 0 {
			s += fmt.Sprintf(" (after %d failed attempt(s): %s)", r.Retries, clip(r.RetryWhy, reasonLen))
		}
		if r.Outcome != Passed && r.Why != "" {
			s += ": " + clip(r.Why, reasonLen)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; then ")
}
