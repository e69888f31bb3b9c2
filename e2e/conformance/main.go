// Command conformance runs Kubernetes' own end-to-end tests of Services
// (e2e.test v1.36.3, built from Go modules and cached) against a running
// cluster and writes a JUnit report and a summary table:
//
//	go run ./e2e/conformance --kubeconfig KUBECONFIG [--proxy ipvs-proxy|kube-proxy] [--conformance-only]
//	go run ./e2e/conformance --list      # the tests of the focus, what is skipped and why
//
// The focus is the Services tests of sig-network plus EndpointSlice,
// Networking Granular Checks: Services, Conntrack and KubeProxy; the skip
// list (skips.txt) leaves out, in groups with their reasons, what a
// one-node cluster without a cloud provider cannot run. Reports go to
// bin/conformance/<proxy>/: junit_01.xml, e2e.log and summary.md.
// Arguments after "--" are passed to e2e.test.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/upstream"
)

// proxies are the proxies a run can be made with.
var proxies = []string{"ipvs-proxy", "kube-proxy"}

type options struct {
	kubeconfig       string
	proxy            string
	conformanceOnly  bool
	list             bool
	images           bool
	out              string
	timeout          time.Duration
	startupTimeout   time.Duration
	bareControlPlane bool
	extra            []string
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the running cluster to test")
	flag.StringVar(&o.proxy, "proxy", "ipvs-proxy", "the cluster's Service proxy: "+strings.Join(proxies, " or ")+" (names the report)")
	flag.BoolVar(&o.conformanceOnly, "conformance-only", false, "run only the [Conformance] tests of the focus")
	flag.BoolVar(&o.list, "list", false, "list the tests of the focus and the skip list's reasons, run nothing")
	flag.BoolVar(&o.images, "images", false, "build the test images the focus needs (OCI archives, cached) and print their paths, run nothing")
	flag.StringVar(&o.out, "out", "bin/conformance", "report directory (a folder per proxy)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "time limit of the suite (Ginkgo's)")
	flag.DurationVar(&o.startupTimeout, "startup-timeout", 10*time.Minute, "how long the suite waits for schedulable nodes")
	flag.BoolVar(&o.bareControlPlane, "bare-control-plane", false,
		"instead of --kubeconfig, start the bed's host control plane (no node): shows that e2e.test starts and connects, and fails for want of a node")
	flag.Parse()
	o.extra = flag.Args()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
	if !slices.Contains(proxies, o.proxy) {
		return fmt.Errorf("--proxy %q: want one of %s", o.proxy, strings.Join(proxies, ", "))
	}
	if !o.list && !o.images && (o.kubeconfig == "") == !o.bareControlPlane {
		return errors.New("want one of --kubeconfig (the cluster fixture is not wired in yet), --bare-control-plane, --list or --images")
	}
	p, err := newPlan(o.conformanceOnly)
	if err != nil {
		return err
	}
	t0 := time.Now()
	suite, err := upstream.EnsureSuite(ctx, controlplane.CacheDir())
	if err != nil {
		return err
	}
	logf("e2e.test, kubectl and agnhost in %s (%s)", suite.Dir, time.Since(t0).Round(time.Second))
	if o.list {
		return list(ctx, suite, p, os.Stdout)
	}
	if o.images {
		t0 := time.Now()
		archive, err := upstream.EnsureAgnhostImage(ctx, controlplane.CacheDir(), suite.Agnhost(), logf)
		if err != nil {
			return err
		}
		logf("images ready (%s)", time.Since(t0).Round(time.Second))
		fmt.Printf("%s\t%s\n", upstream.AgnhostImage, archive)
		return nil
	}
	if o.bareControlPlane {
		cp, err := controlplane.Start(ctx, controlplane.Options{WithControllerManager: true, Log: logf})
		if err != nil {
			return err
		}
		defer cp.Stop()
		o.kubeconfig = cp.Kubeconfig
	}
	return runSuite(ctx, suite, p, o)
}

// runSuite runs e2e.test against the cluster and writes the reports.
func runSuite(ctx context.Context, suite upstream.Suite, p *plan, o options) error {
	out, err := filepath.Abs(filepath.Join(o.out, o.proxy))
	if err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	kubeconfig, err := filepath.Abs(o.kubeconfig)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		// skeleton: no cloud provider and no SSH to nodes; the tests
		// that need either skip themselves.
		"--provider=skeleton",
		"--kubectl-path=" + suite.Kubectl(),
		"--report-dir=" + out,
		"--e2e-output-dir=" + out,
		"--disable-log-dump",
		"--node-schedulable-timeout=" + o.startupTimeout.String(),
		"--ginkgo.timeout=" + o.timeout.String(),
		"--ginkgo.no-color",
	}
	args = append(args, p.ginkgoArgs()...)
	args = append(args, o.extra...)
	logPath := filepath.Join(out, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, suite.E2ETest(), args...)
	cmd.Dir = out
	cmd.Stdout = io.MultiWriter(os.Stdout, logFile)
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	logf("running %s %s", suite.E2ETest(), strings.Join(args, " "))
	start := time.Now()
	runErr := cmd.Run()
	wall := time.Since(start)

	junit := filepath.Join(out, "junit_01.xml")
	results, err := readJUnitFile(junit)
	if err != nil {
		return errors.Join(fmt.Errorf("e2e.test: %w (log: %s)", runErr, logPath), err)
	}
	all, err := listTests(ctx, suite)
	if err != nil {
		return err
	}
	s := summarize(results, all, p, o.proxy, wall)
	summaryPath := filepath.Join(out, "summary.md")
	f, err := os.Create(summaryPath)
	if err != nil {
		return err
	}
	err = errors.Join(s.writeMarkdown(f), f.Close())
	if err != nil {
		return fmt.Errorf("write %s: %w", summaryPath, err)
	}
	logf("%s: wall time %s; report %s, summary %s", o.proxy, wall.Round(time.Second), junit, summaryPath)
	// The plain closing line.
	fmt.Printf("%d passed, %d failed, %d skipped\n", s.Passed, s.Failed, s.Skipped)
	if s.Failed > 0 || s.NotRun > 0 || s.Passed == 0 {
		return fmt.Errorf("%d failed, %d not run, %d passed (e2e.test: %v)", s.Failed, s.NotRun, s.Passed, runErr)
	}
	return nil
}

// list prints every test of the focus: whether it is [Conformance], and
// the reason of the skip list's group that leaves it out.
func list(ctx context.Context, suite upstream.Suite, p *plan, w io.Writer) error {
	names, err := listTests(ctx, suite)
	if err != nil {
		return err
	}
	var run, conf, skipped int
	byGroup := map[string]int{}
	var lines []string
	for _, n := range names {
		if !p.inFocus(n) {
			continue
		}
		mark := "run "
		if g := p.skipGroup(n); g != nil {
			mark = "skip"
			skipped++
			byGroup[g.Reason]++
		} else if p.selected(n) {
			run++
		}
		if isConformance(n) {
			conf++
		}
		lines = append(lines, mark+" "+n)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "\n%d tests in the focus, %d [Conformance]; %d run, %d skipped:\n", len(lines), conf, run, skipped)
	for _, g := range p.groups {
		fmt.Fprintf(w, "  %3d  %s\n", byGroup[g.Reason], g.Reason)
	}
	// Ginkgo's own dry run with the expressions a run passes must select
	// the same tests.
	dry, err := dryRun(ctx, suite, p)
	if err != nil {
		return err
	}
	if dry != run {
		return fmt.Errorf("e2e.test's dry run with the focus and skip expressions selects %d tests, the list %d", dry, run)
	}
	fmt.Fprintf(w, "e2e.test --ginkgo.dry-run with the same focus and skip selects the same %d tests.\n", dry)
	return nil
}

// dryRun runs e2e.test --ginkgo.dry-run with the plan's expressions and
// counts the tests it would run.
func dryRun(ctx context.Context, suite upstream.Suite, p *plan) (int, error) {
	dir, err := os.MkdirTemp("", "conformance-dry-run-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	args := append([]string{"--ginkgo.dry-run", "--report-dir=" + dir, "--ginkgo.no-color", "--ginkgo.succinct"}, p.ginkgoArgs()...)
	cmd := exec.CommandContext(ctx, suite.E2ETest(), args...)
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
		if r.Outcome == Passed && p.inFocus(r.Name) {
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

// listTests is e2e.test's list of every test's full name.
func listTests(ctx context.Context, suite upstream.Suite) ([]string, error) {
	cmd := exec.CommandContext(ctx, suite.E2ETest(), "--list-tests")
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
