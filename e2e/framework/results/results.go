// Package results keeps what a suite measured as data: one small JSON file
// per run, with the date, the commit and the machine's facts beside the
// figures, so that a number in a README can be traced to the run that
// produced it. Runs write into bin/results (RESULTS_DIR); `make results`
// moves them into docs/results, where they are kept in the tree and the
// README tables are generated from them.
package results

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Machine is what the figures depend on.
type Machine struct {
	CPUs     int    `json:"cpus"`
	MemGiB   int    `json:"mem_gib"`
	CPUModel string `json:"cpu_model,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	Go       string `json:"go"`
	// CI is true in CI's runs (CI=true).
	CI bool `json:"ci"`
}

// Run is one run's record: which suite, when, on what, and its figures
// (the suite's own shape).
type Run struct {
	Suite   string          `json:"suite"`
	Date    time.Time       `json:"date"`
	Commit  string          `json:"commit"`
	Machine Machine         `json:"machine"`
	Figures json.RawMessage `json:"figures"`
}

// Env is the process environment the package reads (os.Getenv in
// production), passed in so that tests need no global state.
type Env func(string) string

// Dir is where runs are written: $RESULTS_DIR, else bin/results under
// the repository's top (found from the working directory).
func Dir(getenv Env) string {
	if d := getenv("RESULTS_DIR"); d != "" {
		return d
	}
	if top, err := gitOutput("rev-parse", "--show-toplevel"); err == nil {
		return filepath.Join(top, "bin", "results")
	}
	return filepath.Join("bin", "results")
}

// New is a record of suite's figures made now, on this machine, at the
// working tree's commit ("-dirty" when it has uncommitted changes).
func New(suite string, figures any, getenv Env) (Run, error) {
	b, err := json.Marshal(figures)
	if err != nil {
		return Run{}, fmt.Errorf("results: %s: %w", suite, err)
	}
	return Run{Suite: suite, Date: time.Now().UTC().Truncate(time.Second), Commit: Commit(),
		Machine: ThisMachine(getenv), Figures: b}, nil
}

// Write writes r into dir as <suite>-<date>-<commit>.json and returns
// the file's path.
func Write(dir string, r Run) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("results: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("results: %s: %w", r.Suite, err)
	}
	name := fmt.Sprintf("%s-%s-%s.json", r.Suite, r.Date.Format("20060102T150405Z"), r.Commit)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("results: %w", err)
	}
	return p, nil
}

// Keep records figures as a run of suite made now and writes it into
// Dir (RESULTS_DIR, else bin/results); it returns the file's path.
func Keep(suite string, figures any) (string, error) {
	return KeepAt(suite, Commit(), figures)
}

// KeepAt is Keep for figures of the code at commit: a run that built
// what it measures at its start (Commit then) and writes its figures an
// hour later, while the tree may have moved on.
func KeepAt(suite, commit string, figures any) (string, error) {
	r, err := New(suite, figures, os.Getenv)
	if err != nil {
		return "", err
	}
	r.Commit = commit
	return Write(Dir(os.Getenv), r)
}

// Read reads every run in dir (*.json), oldest first; suite, if not
// empty, keeps only that suite's.
func Read(dir, suite string) ([]Run, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var runs []Run
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r Run
		if err := json.Unmarshal(b, &r); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if r.Suite == "" || r.Date.IsZero() || r.Commit == "" {
			errs = append(errs, fmt.Errorf("%s: no suite, date or commit", p))
			continue
		}
		if suite == "" || r.Suite == suite {
			runs = append(runs, r)
		}
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Date.Before(runs[j].Date) })
	return runs, errors.Join(errs...)
}

// Commit is the working tree's short commit, "-dirty" added when it has
// uncommitted changes to tracked files, or "unknown" outside git.
func Commit() string {
	c, err := gitOutput("rev-parse", "--short=7", "HEAD")
	if err != nil {
		return "unknown"
	}
	if out, err := gitOutput("status", "--porcelain", "--untracked-files=no"); err == nil && out != "" {
		c += "-dirty"
	}
	return c
}

func gitOutput(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	return strings.TrimSpace(string(out)), err
}

// ThisMachine reads the machine's facts.
func ThisMachine(getenv Env) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), CI: getenv("CI") == "true"}
	if kb := procField("/proc/meminfo", "MemTotal"); kb != "" {
		n, _ := strconv.Atoi(strings.TrimSuffix(kb, " kB"))
		m.MemGiB = (n + 512*1024) / (1024 * 1024)
	}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// procField is the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
