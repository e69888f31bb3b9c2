package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/upstream"
)

// testSuites are the suites of testlog (go test -json) whose runs the
// "test-runs" table lists, in the Makefile's names.
var testSuites = map[string]bool{"unit": true, "unit-chart": true, "test-bed": true, "test-cluster": true,
	"takeover": true, "cluster": true, "e2e": true, "chaos-tests": true, "chaos-nodes": true, "chaos-outage": true, "chaos-soak": true, "hash": true, "dsr": true, "direct-server-return": true, "dsr-ecmp": true}

// render makes every generated table from the runs in dir, by name.
func render(dir string) (map[string]string, error) {
	runs, err := results.Read(dir, "")
	if err != nil {
		return nil, err
	}
	tables := map[string]string{}
	tables["test-runs"], err = testRunsTable(runs)
	if err != nil {
		return nil, err
	}
	if tables["chaos"], err = latestChaos(runs); err != nil {
		return nil, err
	}
	if tables["chaos-cases"], err = chaosCases(runs); err != nil {
		return nil, err
	}
	if tables["conformance"], err = conformanceTable(runs); err != nil {
		return nil, err
	}
	if tables["bench"], err = latestBench(runs, anyBench); err != nil {
		return nil, err
	}
	if tables["bench-datapath"], err = latestBench(runs, measuredDataPath); err != nil {
		return nil, err
	}
	return tables, nil
}

// machine is a run's machine, short.
func machine(r results.Run) string {
	m := fmt.Sprintf("%d CPUs, %d GiB", r.Machine.CPUs, r.Machine.MemGiB)
	if r.Machine.CI {
		m += ", CI=true"
	}
	return m
}

func when(r results.Run) string { return r.Date.Format("2006-01-02 15:04") }

// testRunsTable lists every run of the test targets: when, on what, its
// wall time, its counts and its three slowest tests.
func testRunsTable(runs []results.Run) (string, error) {
	var b strings.Builder
	b.WriteString("| date (UTC), commit | machine | target's step | wall | passed / failed / skipped | slowest tests |\n")
	b.WriteString("|---|---|---|---:|---|---|\n")
	for _, r := range runs {
		if !testSuites[r.Suite] {
			continue
		}
		var tr results.TestRun
		if err := json.Unmarshal(r.Figures, &tr); err != nil {
			return "", fmt.Errorf("%s run of %s: %w", r.Suite, when(r), err)
		}
		var slow []string
		for _, t := range tr.Slowest(3) {
			slow = append(slow, fmt.Sprintf("`%s` %.0f s", t.Name, t.Seconds))
		}
		fmt.Fprintf(&b, "| %s, %s | %s | %s | %s | %d / %d / %d | %s |\n", when(r), r.Commit, machine(r), r.Suite,
			minutes(tr.WallSeconds), tr.Passed, tr.Failed, tr.Skipped, strings.Join(slow, ", "))
	}
	return b.String(), nil
}

func minutes(s float64) string {
	m := int(s+0.5) / 60
	return fmt.Sprintf("%dm%02ds", m, int(s+0.5)-60*m)
}

// latestChaos is the newest chaos run's table.
func latestChaos(runs []results.Run) (string, error) {
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].Suite != "chaos" {
			continue
		}
		var rows []chaos.Row
		if err := json.Unmarshal(runs[i].Figures, &rows); err != nil {
			return "", fmt.Errorf("chaos run of %s: %w", when(runs[i]), err)
		}
		return fmt.Sprintf("%s, %s, %s:\n\n%s", when(runs[i]), runs[i].Commit, machine(runs[i]), chaos.Table(rows)), nil
	}
	return "no chaos run kept yet\n", nil
}

// chaosCases lists, newest first, every kept run of the chaos suites
// that boot beds of their own (suites "<target>-cases": chaos-nodes,
// chaos-soak, chaos-outage), one table a run: their runs differ in size
// and cases, and issue 45 asks for each size's table.
func chaosCases(runs []results.Run) (string, error) {
	var b strings.Builder
	for i := len(runs) - 1; i >= 0; i-- {
		target, ok := strings.CutSuffix(runs[i].Suite, "-cases")
		if !ok {
			continue
		}
		var rows []chaos.Row
		if err := json.Unmarshal(runs[i].Figures, &rows); err != nil {
			return "", fmt.Errorf("%s run of %s: %w", runs[i].Suite, when(runs[i]), err)
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "`make %s`, %s, %s, %s:\n\n%s", target, when(runs[i]), runs[i].Commit, machine(runs[i]), chaos.Table(rows))
	}
	if b.Len() == 0 {
		return "no run kept yet\n", nil
	}
	return b.String(), nil
}

// conformanceTable lists every kept run of Kubernetes' own tests.
func conformanceTable(runs []results.Run) (string, error) {
	var b strings.Builder
	b.WriteString("| date (UTC), commit | machine | suite | proxy, nodes | tests | wall | passed / failed / skipped / not run | passed at a second attempt |\n")
	b.WriteString("|---|---|---|---|---|---:|---|---:|\n")
	for _, r := range runs {
		if r.Suite != "conformance" && r.Suite != "conformance-core" {
			continue
		}
		var f upstream.RunFigures
		if err := json.Unmarshal(r.Figures, &f); err != nil {
			return "", fmt.Errorf("%s run of %s: %w", r.Suite, when(r), err)
		}
		fmt.Fprintf(&b, "| %s, %s | %s | %s | %s, %d | %s | %s | %d / %d / %d / %d | %d |\n", when(r), r.Commit, machine(r), r.Suite,
			f.Proxy, f.Nodes, f.Selection, minutes(f.WallSeconds), f.Passed, f.Failed, f.Skipped, f.NotRun, f.Flaked)
	}
	return b.String(), nil
}

var sectionRE = regexp.MustCompile(`(?s)(<!-- results:([a-z-]+) -->\n)(.*?)(<!-- /results -->)`)

// replaceSections puts each table into its section of page; a section
// whose name has no table, or a table without a section, is an error.
func replaceSections(page string, tables map[string]string) (string, error) {
	seen := map[string]bool{}
	var errs []string
	out := sectionRE.ReplaceAllStringFunc(page, func(m string) string {
		sub := sectionRE.FindStringSubmatch(m)
		name := sub[2]
		table, ok := tables[name]
		if !ok {
			errs = append(errs, "a section "+name+" that no table fills")
			return m
		}
		seen[name] = true
		return sub[1] + table + sub[4]
	})
	var missing []string
	for name := range tables {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	for _, name := range missing {
		errs = append(errs, "no section for the table "+name)
	}
	if len(errs) > 0 {
		return page, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// benchShape is what the table reads of the bench's figures (e2e/cmd/bench's
// sizeFigures: the printed table's cells).
type benchShape struct {
	Shape   string   `json:"shape"`
	Proxies []string `json:"proxies"`
	Rows    []struct {
		Label  string            `json:"label"`
		Values []string          `json:"values"`
		Ratios map[string]string `json:"ratios"`
	} `json:"rows"`
}

// latestBench is the newest bench run's tables whose shapes keep
// accepts, one per shape: each proxy's figure and each other proxy's
// ratio to ipvs-proxy.
func latestBench(runs []results.Run, keep func([]benchShape) bool) (string, error) {
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		if r.Suite != "bench" {
			continue
		}
		var shapes []benchShape
		if err := json.Unmarshal(r.Figures, &shapes); err != nil {
			return "", fmt.Errorf("bench run of %s: %w", when(r), err)
		}
		if !keep(shapes) {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s, %s, %s:\n", when(r), r.Commit, machine(r))
		for _, sh := range shapes {
			var others []string
			head, sep := "| "+sh.Shape+" |", "|---|"
			for _, p := range sh.Proxies {
				head += " " + p + " |"
				sep += "---|"
				if p != "ipvs-proxy" {
					others = append(others, p)
				}
			}
			for _, p := range others {
				head += " " + p + " / ipvs-proxy |"
				sep += "---|"
			}
			fmt.Fprintf(&b, "\n%s\n%s\n", head, sep)
			for _, row := range sh.Rows {
				line := "| " + row.Label + " |"
				for _, v := range row.Values {
					line += " " + v + " |"
				}
				for _, p := range others {
					line += " " + row.Ratios[p] + " |"
				}
				b.WriteString(line + "\n")
			}
		}
		return b.String(), nil
	}
	return "no bench run kept yet\n", nil
}

func anyBench([]benchShape) bool { return true }

// measuredDataPath: a run of make bench -datapath (issue 46 part 1), whose
// tables the newest run without it would otherwise replace.
func measuredDataPath(shapes []benchShape) bool {
	for _, sh := range shapes {
		for _, row := range sh.Rows {
			if strings.HasPrefix(row.Label, "data path:") {
				return true
			}
		}
	}
	return false
}
