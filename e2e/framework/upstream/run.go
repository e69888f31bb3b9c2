package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// RunOptions configure Suite.Run.
type RunOptions struct {
	// Kubeconfig is the cluster's kubeconfig.
	Kubeconfig string
	// Proxy names the cluster's Service proxy in the summary.
	Proxy string
	// OutDir receives junit_01.xml, e2e.log and summary.md; it is emptied
	// first.
	OutDir string
	// Timeout is Ginkgo's time limit of the suite; StartupTimeout how long
	// the suite waits for schedulable nodes.
	Timeout, StartupTimeout time.Duration
	// Nodes is the cluster's number of nodes, told to e2e.test
	// (--num-nodes): without it the tests that call
	// SkipUnlessNodeCountIsAtLeast skip themselves ("not -1"). 0: not told.
	Nodes int
	// Extra are more arguments of e2e.test.
	Extra []string
	// Procs > 1 runs the tests on that many parallel processes through
	// Ginkgo's runner at Ginkgo (EnsureGinkgo), as upstream's
	// hack/ginkgo-e2e.sh does; tests marked [Serial] still run alone, at
	// the end. 0 or 1 runs e2e.test itself, one test at a time.
	Procs  int
	Ginkgo string
	// FlakeAttempts > 1 lets Ginkgo run a failed test again, up to that
	// many attempts in all; the summary names every test that passed
	// only after a failed attempt, with the first failure.
	FlakeAttempts int
	// Output receives e2e.test's output as well as e2e.log (optional).
	Output io.Writer
	// Logf receives progress messages (optional).
	Logf func(format string, args ...any)
}

// Run runs the plan's tests against the cluster and writes the JUnit
// report, the suite's log and the summary table (summary.md) into OutDir.
// It fails when a test failed, a selected test did not run, or none
// passed.
func (s Suite) Run(ctx context.Context, p *Plan, o RunOptions) (Summary, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	out, err := filepath.Abs(o.OutDir)
	if err != nil {
		return Summary{}, err
	}
	if err := os.RemoveAll(out); err != nil {
		return Summary{}, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Summary{}, err
	}
	kubeconfig, err := filepath.Abs(o.Kubeconfig)
	if err != nil {
		return Summary{}, err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		// skeleton: no cloud provider and no SSH to nodes; the tests
		// that need either skip themselves.
		"--provider=skeleton",
		"--kubectl-path=" + s.Kubectl(),
		"--report-dir=" + out,
		"--e2e-output-dir=" + out,
		"--disable-log-dump",
		"--node-schedulable-timeout=" + o.StartupTimeout.String(),
	}
	if o.Nodes > 0 {
		args = append(args, fmt.Sprintf("--num-nodes=%d", o.Nodes))
	}
	args = append(args, p.ginkgoArgs()...)
	args = append(args, o.Extra...)
	bin, args, err := s.command(o, args)
	if err != nil {
		return Summary{}, err
	}
	logPath := filepath.Join(out, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return Summary{}, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = out
	cmd.Stdout = io.Writer(logFile)
	if o.Output != nil {
		cmd.Stdout = io.MultiWriter(o.Output, logFile)
	}
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	logf("running %s %s", bin, strings.Join(args, " "))
	start := time.Now()
	runErr := cmd.Run()
	wall := time.Since(start)

	junit := filepath.Join(out, "junit_01.xml")
	results, err := readJUnitFile(junit)
	if err != nil {
		return Summary{}, errors.Join(fmt.Errorf("e2e.test: %w (log: %s)", runErr, logPath), err)
	}
	all, err := s.listTests(ctx)
	if err != nil {
		return Summary{}, err
	}
	sum := summarize(results, all, p, o.Proxy, wall)
	summaryPath := filepath.Join(out, "summary.md")
	f, err := os.Create(summaryPath)
	if err != nil {
		return sum, err
	}
	if err := errors.Join(sum.WriteMarkdown(f), f.Close()); err != nil {
		return sum, fmt.Errorf("write %s: %w", summaryPath, err)
	}
	logf("%s: wall time %s; report %s, summary %s", o.Proxy, wall.Round(time.Second), junit, summaryPath)
	if sum.Failed > 0 || sum.NotRun > 0 || sum.Passed == 0 {
		if runErr != nil {
			return sum, fmt.Errorf("%d failed, %d not run, %d passed (e2e.test: %w)", sum.Failed, sum.NotRun, sum.Passed, runErr)
		}
		return sum, fmt.Errorf("%d failed, %d not run, %d passed (e2e.test: exit status 0)", sum.Failed, sum.NotRun, sum.Passed)
	}
	return sum, nil
}

// List writes every test of the focus: whether it runs or the skip list
// leaves it out, and the counts per skip group. It checks the selection
// against e2e.test's own dry run with the expressions Run passes.
func (s Suite) List(ctx context.Context, p *Plan, w io.Writer) error {
	names, err := s.listTests(ctx)
	if err != nil {
		return err
	}
	var run, conf, skipped int
	byGroup := map[string]int{}
	var lines []string
	for _, n := range names {
		if !p.InFocus(n) {
			continue
		}
		mark := "run "
		if g := p.SkipGroupOf(n); g != nil {
			mark = "skip"
			skipped++
			byGroup[g.Reason]++
		} else if p.selected(n) {
			run++
		} else {
			mark = "-   " // left out by --conformance-only
		}
		if IsConformance(n) {
			conf++
		}
		lines = append(lines, mark+" "+n)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "\n%d tests in the focus, %d [Conformance]; %d run, %d skipped:\n", len(lines), conf, run, skipped)
	for _, g := range p.Groups {
		fmt.Fprintf(w, "  %3d  %s\n", byGroup[g.Reason], g.Reason)
	}
	dry, err := s.dryRun(ctx, p)
	if err != nil {
		return err
	}
	if dry != run {
		return fmt.Errorf("e2e.test's dry run with the focus and skip expressions selects %d tests, the list %d", dry, run)
	}
	fmt.Fprintf(w, "e2e.test --ginkgo.dry-run with the same expressions selects the same %d tests.\n", dry)
	return nil
}

// command is the program and arguments that run e2e.test with args (its
// own flags and the plan's --ginkgo ones): e2e.test itself, or Ginkgo's
// runner on o.Procs processes.
func (s Suite) command(o RunOptions, args []string) (string, []string, error) {
	suite := []string{"--ginkgo.timeout=" + o.Timeout.String(), "--ginkgo.no-color"}
	if o.Procs <= 1 {
		if o.FlakeAttempts > 1 {
			suite = append(suite, fmt.Sprintf("--ginkgo.flake-attempts=%d", o.FlakeAttempts))
		}
		return s.E2ETest(), append(suite, args...), nil
	}
	if o.Ginkgo == "" {
		return "", nil, fmt.Errorf("%d parallel processes need Ginkgo's runner (RunOptions.Ginkgo)", o.Procs)
	}
	runner := []string{
		fmt.Sprintf("--procs=%d", o.Procs),
		"--timeout=" + o.Timeout.String(),
		"--no-color",
	}
	if o.FlakeAttempts > 1 {
		runner = append(runner, fmt.Sprintf("--flake-attempts=%d", o.FlakeAttempts))
	}
	runner = append(runner, s.E2ETest(), "--")
	return o.Ginkgo, append(runner, args...), nil
}

// dryRun runs e2e.test --ginkgo.dry-run with the plan's expressions and
// counts the tests it would run.
func (s Suite) dryRun(ctx context.Context, p *Plan) (int, error) {
	dir, err := os.MkdirTemp("", "conformance-dry-run-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	args := append([]string{"--ginkgo.dry-run", "--report-dir=" + dir, "--ginkgo.no-color", "--ginkgo.succinct"}, p.ginkgoArgs()...)
	cmd := exec.CommandContext(ctx, s.E2ETest(), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("e2e.test --ginkgo.dry-run: %w\n%s", err, tailString(string(out), 2000))
	}
	results, err := readJUnitFile(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range results {
		if r.Outcome == Passed && p.InFocus(r.Name) {
			n++
		}
	}
	return n, nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Part narrows p to part k of n of the tests it runs (Plan.Part) and
// returns that part's names.
func (s Suite) Part(ctx context.Context, p *Plan, k, n int) ([]string, error) {
	names, err := s.listTests(ctx)
	if err != nil {
		return nil, err
	}
	return p.Part(names, k, n)
}

// listTests is e2e.test's list of every test's full name.
func (s Suite) listTests(ctx context.Context) ([]string, error) {
	cmd := exec.CommandContext(ctx, s.E2ETest(), "--list-tests")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("e2e.test --list-tests: %w\n%s", err, stderr.String())
	}
	return parseTestList(string(out)), nil
}

// testListLine is a line of `e2e.test --list-tests`: "FILE.go:LINE: NAME".
var testListLine = regexp.MustCompile(`^\S+\.go:\d+: (.+)$`)

// parseTestList returns the full names in `e2e.test --list-tests` output.
func parseTestList(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if m := testListLine.FindStringSubmatch(l); m != nil {
			names = append(names, m[1])
		} else if l != "" {
			names = append(names, l)
		}
	}
	return names
}
