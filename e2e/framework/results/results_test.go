package results

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// stream is `go test -json` of a package with a passing test with a
// subtest, a skipped test and a failed one, and a package that did not
// build.
const stream = `{"Time":"2026-11-29T01:00:00Z","Action":"start","Package":"p"}
{"Time":"2026-11-29T01:00:00Z","Action":"run","Package":"p","Test":"TestA"}
{"Time":"2026-11-29T01:00:00Z","Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Time":"2026-11-29T01:00:01Z","Action":"pass","Package":"p","Test":"TestA/sub","Elapsed":1}
{"Time":"2026-11-29T01:00:02Z","Action":"pass","Package":"p","Test":"TestA","Elapsed":2}
{"Time":"2026-11-29T01:00:02Z","Action":"skip","Package":"p","Test":"TestB","Elapsed":0}
{"Time":"2026-11-29T01:00:07Z","Action":"fail","Package":"p","Test":"TestC","Elapsed":5}
{"Time":"2026-11-29T01:00:07Z","Action":"fail","Package":"p","Elapsed":7}
not json: a build error
{"Time":"2026-11-29T01:00:09Z","Action":"fail","Package":"q","Elapsed":0}
`

func TestReadTestJSON(t *testing.T) {
	var log strings.Builder
	run, err := ReadTestJSON(strings.NewReader(stream), &log, true)
	if err != nil {
		t.Fatal(err)
	}
	want := TestRun{WallSeconds: 9, Passed: 2, Failed: 1, Skipped: 1, BuildFailed: []string{"q"}, Tests: []Test{
		{"p", "TestA/sub", "pass", 1}, {"p", "TestA", "pass", 2}, {"p", "TestB", "skip", 0}, {"p", "TestC", "fail", 5},
	}}
	if d := cmp.Diff(want, run); d != "" {
		t.Errorf("ReadTestJSON (-want +got):\n%s", d)
	}
	if got := log.String(); got != "=== RUN   TestA\nnot json: a build error\n" {
		t.Errorf("log %q", got)
	}
	problems := strings.Join(run.Problems(), "\n")
	for _, w := range []string{"SKIPPED p TestB", "FAILED  p TestC", "FAILED  q (outside any test"} {
		if !strings.Contains(problems, w) {
			t.Errorf("problems %q: no %q", problems, w)
		}
	}
	if strings.Contains(problems, "FAILED  p (") {
		t.Errorf("problems %q: p's own fail counted though its test failed", problems)
	}
	if got := run.Slowest(2); len(got) != 2 || got[0].Name != "TestC" || got[1].Name != "TestA" {
		t.Errorf("Slowest(2) = %+v; want TestC, TestA (top-level only)", got)
	}
	if p := (TestRun{}).Problems(); len(p) != 1 || p[0] != "no test ran" {
		t.Errorf("an empty run's problems: %q", p)
	}
}

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	env := func(k string) string { return map[string]string{"CI": "true"}[k] }
	r, err := New("unit", TestRun{Passed: 3}, env)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Machine.CI || r.Machine.CPUs < 1 || r.Commit == "" {
		t.Errorf("record %+v: want CI, the CPUs and a commit", r)
	}
	older := r
	older.Suite, older.Date = "other", r.Date.Add(-time.Hour)
	for _, x := range []Run{r, older} {
		if _, err := Write(dir, x); err != nil {
			t.Fatal(err)
		}
	}
	all, err := Read(dir, "")
	if err != nil || len(all) != 2 || all[0].Suite != "other" {
		t.Fatalf("Read: %+v, %v; want both runs, oldest first", all, err)
	}
	mine, err := Read(dir, "unit")
	if err != nil || len(mine) != 1 {
		t.Fatalf("Read(unit): %+v, %v", mine, err)
	}
	var got TestRun
	if err := json.Unmarshal(mine[0].Figures, &got); err != nil || got.Passed != 3 {
		t.Errorf("figures %s: %+v, %v", mine[0].Figures, got, err)
	}
}

func TestReadTestJSONQuiet(t *testing.T) {
	const quiet = `{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":1}
{"Action":"output","Package":"p","Test":"TestC","Output":"want 1, got 2\n"}
{"Action":"fail","Package":"p","Test":"TestC","Elapsed":1}
{"Action":"output","Package":"p","Output":"FAIL\tp\t2s\n"}
{"Action":"output","Package":"q","Output":"PASS\n"}
{"Action":"output","Package":"q","Output":"ok  \tq\t1s\n"}
`
	var log strings.Builder
	if _, err := ReadTestJSON(strings.NewReader(quiet), &log, false); err != nil {
		t.Fatal(err)
	}
	if got, want := log.String(), "want 1, got 2\nFAIL\tp\t2s\nok  \tq\t1s\n"; got != want {
		t.Errorf("quiet log %q; want %q (only the failed test's lines and the packages' own)", got, want)
	}
}

// TestUnfinishedTestFails: a test whose binary died under it (no pass or
// fail event, only the package's fail) counts as failed, with its lines;
// a build failure names its package from ImportPath.
func TestUnfinishedTestFails(t *testing.T) {
	const died = `{"Time":"2026-11-29T01:00:00Z","Action":"run","Package":"p","Test":"TestB"}
{"Time":"2026-11-29T01:00:00Z","Action":"output","Package":"p","Test":"TestB","Output":"panic: boom\n"}
{"Time":"2026-11-29T01:00:03Z","Action":"fail","Package":"p","Elapsed":3}
{"ImportPath":"q [q.test]","Action":"build-fail"}
`
	var log strings.Builder
	run, err := ReadTestJSON(strings.NewReader(died), &log, false)
	if err != nil {
		t.Fatal(err)
	}
	if run.Failed != 1 || len(run.Tests) != 1 || run.Tests[0].Name != "TestB" || run.Tests[0].Seconds != 3 {
		t.Errorf("run %+v; want TestB failed after 3 s", run)
	}
	if !strings.Contains(log.String(), "p TestB started and never ended") || !strings.Contains(log.String(), "panic: boom") {
		t.Errorf("log %q: want TestB named with its output", log.String())
	}
	problems := strings.Join(run.Problems(), "\n")
	if !strings.Contains(problems, "FAILED  p TestB") || !strings.Contains(problems, "FAILED  q [q.test] (outside") || strings.Contains(problems, "FAILED   (") {
		t.Errorf("problems %q", problems)
	}
}

// TestKeepAt: a run's figures name the commit it measured, not the one
// the tree is at when they are written.
func TestKeepAt(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("RESULTS_DIR", dir)
	p, err := KeepAt("bench", "abc1234", map[string]int{"x": 1})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := Read(dir, "bench")
	if err != nil || len(runs) != 1 {
		t.Fatalf("Read = %v, %v", runs, err)
	}
	if runs[0].Commit != "abc1234" || !strings.HasSuffix(p, "-abc1234.json") {
		t.Errorf("kept %s with commit %q, want abc1234", p, runs[0].Commit)
	}
}
