package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
)

// TestTreeTablesAreTheFiles: every generated table of e2e/README.md is
// what docs/results gives, so that each figure there traces to a run.
func TestTreeTablesAreTheFiles(t *testing.T) {
	page, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	tables, err := render("../../../docs/results")
	if err != nil {
		t.Fatal(err)
	}
	got, err := replaceSections(string(page), tables)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(page) {
		t.Error("e2e/README.md's generated tables differ from docs/results: run `make results`")
	}
}

func TestTablesFromRuns(t *testing.T) {
	dir := t.TempDir()
	env := func(string) string { return "" }
	tr := results.TestRun{WallSeconds: 754, Passed: 2, Tests: []results.Test{
		{Package: "p", Name: "TestSlow", Outcome: "pass", Seconds: 600},
		{Package: "p", Name: "TestSlow/sub", Outcome: "pass", Seconds: 500},
		{Package: "p", Name: "TestQuick", Outcome: "pass", Seconds: 1},
	}}
	bench := []map[string]any{{"shape": "10 Services × 2 endpoints", "proxies": []string{"ipvs-proxy", "kube-proxy-nftables"},
		"rows": []map[string]any{{"label": "cold", "values": []string{"1s", "3s"}, "ratios": map[string]string{"kube-proxy-nftables": "3.0"}}}}}
	for suite, figures := range map[string]any{"test-bed": tr, "bench": bench} {
		r, err := results.New(suite, figures, env)
		if err != nil {
			t.Fatal(err)
		}
		r.Date = time.Date(2026, 11, 29, 1, 2, 0, 0, time.UTC)
		if _, err := results.Write(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	tables, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(tables["test-runs"]), "\n")
	if len(rows) != 3 {
		t.Fatalf("test-runs table:\n%s\nwant a header and one row (the bench's run is not a test run)", tables["test-runs"])
	}
	for _, want := range []string{"| 2026-11-29 01:02, ", "| test-bed | 12m34s | 2 / 0 / 0 |", "`TestSlow` 600 s, `TestQuick` 1 s |"} {
		if !strings.Contains(rows[2], want) {
			t.Errorf("row %q lacks %q", rows[2], want)
		}
	}
	if want := "| cold | 1s | 3s | 3.0 |"; !strings.Contains(tables["bench"], want) {
		t.Errorf("bench table:\n%s\nwant the row %q", tables["bench"], want)
	}
	if !strings.Contains(tables["chaos"], "no chaos run") {
		t.Errorf("chaos table without a run: %q", tables["chaos"])
	}
}

// TestChaosCasesEveryRun: the rows of the suites with beds of their own
// ("<target>-cases") are listed run by run, newest first, each with its
// target, date and commit; `make chaos`'s rows stay in "chaos" alone.
func TestChaosCasesEveryRun(t *testing.T) {
	dir := t.TempDir()
	env := func(string) string { return "" }
	for i, run := range []struct {
		suite, notes string
	}{
		{"chaos-nodes-cases", "300 Services"},
		{"chaos", "one node"},
		{"chaos-nodes-cases", "2000 Services"},
	} {
		r, err := results.New(run.suite, []chaos.Row{{Case: "nodes-node-lost", TrafficAttempted: 10, Notes: run.notes}}, env)
		if err != nil {
			t.Fatal(err)
		}
		r.Date = time.Date(2026, 12, 7, i, 0, 0, 0, time.UTC)
		if _, err := results.Write(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	tables, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := tables["chaos-cases"]
	first, second := strings.Index(got, "2000 Services"), strings.Index(got, "300 Services")
	if first < 0 || second < 0 || first > second || strings.Contains(got, "one node") {
		t.Errorf("chaos-cases:\n%s\nwant the 2000-Service run, then the 300-Service one, and not make chaos's", got)
	}
	if !strings.Contains(got, "`make chaos-nodes`, 2026-12-07 02:00, ") {
		t.Errorf("chaos-cases:\n%s\nwant each run headed by its target and date", got)
	}
	if !strings.Contains(tables["chaos"], "one node") || strings.Contains(tables["chaos"], "Services") {
		t.Errorf("chaos:\n%s\nwant make chaos's run alone", tables["chaos"])
	}
}

func TestReplaceSections(t *testing.T) {
	page := "# x\n<!-- results:a -->\nold\n<!-- /results -->\ntext\n"
	got, err := replaceSections(page, map[string]string{"a": "new\n"})
	if err != nil || got != "# x\n<!-- results:a -->\nnew\n<!-- /results -->\ntext\n" {
		t.Errorf("replaceSections: %q, %v", got, err)
	}
	if _, err := replaceSections(page, map[string]string{"a": "", "b": ""}); err == nil || !strings.Contains(err.Error(), "no section for the table b") {
		t.Errorf("a table without a section: %v", err)
	}
	if _, err := replaceSections(page, map[string]string{}); err == nil {
		t.Error("a section without a table was accepted")
	}
}

// TestMakefileSuitesAreTestRuns: every suite name the Makefile gives
// testlog is one the test-runs table lists, and none is the name of
// another kind of record (the chaos rows, a conformance run, the bench).
func TestMakefileSuitesAreTestRuns(t *testing.T) {
	b, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?:E2E_SUITE=|-suite )([a-z0-9-]+)`).FindAllStringSubmatch(string(b), -1)
	if len(names) < 5 {
		t.Fatalf("found %d suite names in the Makefile; want the test targets'", len(names))
	}
	for _, m := range names {
		if !testSuites[m[1]] {
			t.Errorf("the Makefile's suite %q is not in testSuites: its runs would not be listed", m[1])
		}
	}
	for _, other := range []string{"chaos", "chaos-soak-memory", "conformance", "conformance-core", "bench", "heapbench"} {
		if testSuites[other] {
			t.Errorf("testSuites has %q, the name of another kind of record", other)
		}
	}
}

// TestBenchDataPathKept: the newest bench run fills "bench"; the newest
// one that measured the data path fills "bench-datapath", even when a
// later run did not measure it.
func TestBenchDataPathKept(t *testing.T) {
	dir := t.TempDir()
	env := func(string) string { return "" }
	run := func(label, value string, at time.Time) {
		bench := []map[string]any{{"shape": "10000 Services × 2 endpoints", "proxies": []string{"ipvs-proxy"},
			"rows": []map[string]any{{"label": label, "values": []string{value}, "ratios": map[string]string{}}}}}
		r, err := results.New("bench", bench, env)
		if err != nil {
			t.Fatal(err)
		}
		r.Date = at
		if _, err := results.Write(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	run("data path: one stream through a clusterIP, from a pod", "71 MiB/s", day)
	run("peak RSS", "98 MiB", day.Add(time.Hour))
	tables, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tables["bench"], "| peak RSS | 98 MiB |") || strings.Contains(tables["bench"], "71 MiB/s") {
		t.Errorf("bench table, want the newest run's:\n%s", tables["bench"])
	}
	if !strings.Contains(tables["bench-datapath"], "71 MiB/s") {
		t.Errorf("bench-datapath table, want the data path's run:\n%s", tables["bench-datapath"])
	}
}
