// Command conformance runs Kubernetes' own end-to-end tests of Services
// (e2e.test v1.36.3, built from Go modules and cached) against a running
// cluster and writes a JUnit report and a summary table:
//
//	go run ./e2e/conformance --kubeconfig KUBECONFIG [--proxy ipvs-proxy|kube-proxy] [--conformance-only]
//	go run ./e2e/conformance --list                # the focus, what is skipped and why
//	go run ./e2e/conformance --images              # build the test images (OCI archives)
//	go run ./e2e/conformance --bare-control-plane  # the host control plane, no node
//
// The focus is the Services tests of sig-network plus EndpointSlice,
// Networking Granular Checks: Services, Conntrack and KubeProxy; the skip
// list (e2e/framework/upstream/skips.txt) leaves out, in groups with their
// reasons, what a one-node cluster without a cloud provider cannot run.
// Reports go to bin/conformance/<proxy>/: junit_01.xml, e2e.log and
// summary.md. Arguments after "--" are passed to e2e.test.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
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
	bareControlPlane bool
	narrow           string
	out              string
	timeout          time.Duration
	startupTimeout   time.Duration
	extra            []string
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the running cluster to test")
	flag.StringVar(&o.proxy, "proxy", "ipvs-proxy", "the cluster's Service proxy: "+strings.Join(proxies, " or ")+" (names the report)")
	flag.BoolVar(&o.conformanceOnly, "conformance-only", false, "run only the [Conformance] tests of the focus")
	flag.BoolVar(&o.list, "list", false, "list the tests of the focus and the skip list's reasons, run nothing")
	flag.BoolVar(&o.images, "images", false, "build the test images the focus needs (OCI archives, cached) and print their paths, run nothing")
	flag.BoolVar(&o.bareControlPlane, "bare-control-plane", false,
		"instead of --kubeconfig, start the bed's host control plane (no node): shows that e2e.test starts and connects, and fails for want of a node")
	flag.StringVar(&o.narrow, "focus", "", "run only the tests of the focus that this regular expression matches")
	flag.StringVar(&o.out, "out", "bin/conformance", "report directory (a folder per proxy)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "time limit of the suite (Ginkgo's)")
	flag.DurationVar(&o.startupTimeout, "startup-timeout", 10*time.Minute, "how long the suite waits for schedulable nodes")
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
	p, err := upstream.NewPlan(o.conformanceOnly)
	if err != nil {
		return err
	}
	if o.narrow != "" {
		if err := p.Narrow(o.narrow); err != nil {
			return err
		}
	}
	t0 := time.Now()
	suite, err := upstream.EnsureSuite(ctx, controlplane.CacheDir())
	if err != nil {
		return err
	}
	logf("e2e.test, kubectl and agnhost in %s (%s)", suite.Dir, time.Since(t0).Round(time.Second))
	switch {
	case o.list:
		return suite.List(ctx, p, os.Stdout)
	case o.images:
		t0 := time.Now()
		archive, err := upstream.EnsureAgnhostImage(ctx, controlplane.CacheDir(), suite.Agnhost(), logf)
		if err != nil {
			return err
		}
		logf("images ready (%s)", time.Since(t0).Round(time.Second))
		fmt.Printf("%s\t%s\n", upstream.AgnhostImage, archive)
		return nil
	case o.bareControlPlane:
		cp, err := controlplane.Start(ctx, controlplane.Options{WithControllerManager: true, Log: logf})
		if err != nil {
			return err
		}
		defer cp.Stop()
		o.kubeconfig = cp.Kubeconfig
	}
	s, err := suite.Run(ctx, p, upstream.RunOptions{
		Kubeconfig: o.kubeconfig, Proxy: o.proxy, OutDir: filepath.Join(o.out, o.proxy),
		Timeout: o.timeout, StartupTimeout: o.startupTimeout, Extra: o.extra,
		Output: os.Stdout, Logf: logf,
	})
	if s.Proxy != "" {
		// The plain closing line.
		fmt.Printf("%d passed, %d failed, %d skipped\n", s.Passed, s.Failed, s.Skipped)
	}
	return err
}
