// Command conformance runs Kubernetes' own end-to-end tests of Services
// (e2e.test v1.36.3, built from Go modules and cached) against a running
// cluster and writes a JUnit report and a summary table. It runs at the
// repository's root (it reads deploy/ and writes bin/), as the Makefile's
// E2E_CMD runs it: go -C e2e run -exec 'env -C ..' ./cmd/conformance ARGS.
//
//	conformance [--proxy ipvs-proxy] [--conformance-only]    # starts the bed's one-node cluster
//	conformance --kubeconfig KUBECONFIG [--proxy ipvs-proxy|kube-proxy] [--conformance-only]
//	conformance --list                # the focus, what is skipped and why
//	conformance --images              # build the test images (OCI archives)
//	conformance --bare-control-plane  # the host control plane, no node
//	conformance --nodes 2 --compare 'ipvs-proxy=DIR,DIR' --compare 'kube-proxy=DIR'  # a table of runs' reports
//
// The focus is the Services tests of sig-network plus EndpointSlice,
// Networking Granular Checks: Services, Conntrack and KubeProxy; the skip
// list (e2e/framework/upstream/skips.txt) leaves out, in groups with their
// reasons, what a one-node cluster without a cloud provider cannot run.
// Without --kubeconfig it starts the bed's one-node cluster
// (e2e/framework/cluster: the VM as the node, the control plane on the
// host, CoreDNS), the test images imported into the node, installs
// ipvs-proxy from deploy/ as its DaemonSet, runs the suite and stops the
// cluster (--proxy kube-proxy: upstream kube-proxy v1.36.3 --proxy-mode=ipvs
// runs in the VM instead). Reports go to bin/conformance/<proxy>/: junit_01.xml, e2e.log,
// summary.md and, for a cluster of its own, the nodes' logs and the proxy's (cluster/).
// Arguments after "--" are passed to e2e.test.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/upstream"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
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
	deployDir        string
	narrow           string
	part             string
	out              string
	timeout          time.Duration
	procs            int
	nodes            int
	flakeAttempts    int
	startupTimeout   time.Duration
	compare          []upstream.Column
	extra            []string
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the running cluster to test")
	flag.StringVar(&o.proxy, "proxy", "ipvs-proxy", "the cluster's Service proxy: "+strings.Join(proxies, " or ")+" (names the report)")
	flag.BoolVar(&o.conformanceOnly, "conformance-only", false, "run only the [Conformance] tests of the focus")
	flag.BoolVar(&o.list, "list", false, "list the tests of the focus and the skip list's reasons, run nothing")
	flag.BoolVar(&o.images, "images", false, "build the test images the focus needs (OCI archives, cached) and print their paths, run nothing (with --procs > 1, also Ginkgo's runner)")
	flag.BoolVar(&o.bareControlPlane, "bare-control-plane", false,
		"instead of --kubeconfig, start the bed's host control plane (no node): shows that e2e.test starts and connects, and fails for want of a node")
	flag.StringVar(&o.deployDir, "deploy", "deploy", "ipvs-proxy's manifests, for a cluster of its own")
	flag.StringVar(&o.narrow, "focus", "", "run only the tests of the focus that this regular expression matches")
	flag.StringVar(&o.part, "part", "", "K/N: run only part K of N of the tests (dealt out by name), reported in <out>/<proxy>/part-K-of-N")
	flag.StringVar(&o.out, "out", "bin/conformance", "report directory (a folder per proxy)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "time limit of the suite (Ginkgo's)")
	flag.DurationVar(&o.startupTimeout, "startup-timeout", 10*time.Minute, "how long the suite waits for schedulable nodes")
	flag.IntVar(&o.nodes, "nodes", 1, "nodes of the bed's cluster (with --kubeconfig: of that cluster); the tests that need more are skipped")
	flag.IntVar(&o.procs, "procs", 1, "parallel processes of the suite (Ginkgo's runner, built here); [Serial] tests run alone at the end")
	flag.IntVar(&o.flakeAttempts, "flake-attempts", 1, "attempts a failed test gets in all (Ginkgo's --flake-attempts); the summary names those that passed only on a later one")
	flag.Func("compare", "PROXY[ LABEL]=REPORT[,REPORT...]: print a table of the focus on --nodes nodes, a column per --compare (JUnit reports or report folders, e.g. every part of a run and a rerun after it), run nothing", func(v string) error {
		c, err := upstream.ParseColumn(v)
		o.compare = append(o.compare, c)
		return err
	})
	flag.Parse()
	o.extra = flag.Args()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
	if len(o.compare) > 0 {
		return upstream.Compare(os.Stdout, o.nodes, o.compare)
	}
	if !slices.Contains(proxies, o.proxy) {
		return fmt.Errorf("--proxy %q: want one of %s", o.proxy, strings.Join(proxies, ", "))
	}
	if o.kubeconfig != "" && o.bareControlPlane {
		return errors.New("--kubeconfig and --bare-control-plane exclude each other")
	}
	p, err := upstream.NewPlan(o.conformanceOnly)
	if err != nil {
		return err
	}
	if err := p.ForNodes(o.nodes); err != nil {
		return err
	}
	if err := p.ForProxy(o.proxy); err != nil {
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
	outDir := filepath.Join(o.out, o.proxy)
	if o.part != "" {
		var k, n int
		if _, err := fmt.Sscanf(o.part, "%d/%d", &k, &n); err != nil {
			return fmt.Errorf("--part %q: want K/N", o.part)
		}
		names, err := suite.Part(ctx, p, k, n)
		if err != nil {
			return fmt.Errorf("--part %s: %w", o.part, err)
		}
		logf("part %d of %d: %d tests", k, n, len(names))
		outDir = filepath.Join(outDir, fmt.Sprintf("part-%d-of-%d", k, n))
	}
	switch {
	case o.list:
		return suite.List(ctx, p, os.Stdout)
	case o.images:
		t0 := time.Now()
		archives, err := upstream.EnsureTestImages(ctx, controlplane.CacheDir(), suite, logf)
		if err != nil {
			return err
		}
		logf("images ready (%s)", time.Since(t0).Round(time.Second))
		if o.procs > 1 {
			// Ginkgo's runner too, for a later run on that many processes.
			if _, err := upstream.EnsureGinkgo(ctx, controlplane.CacheDir()); err != nil {
				return err
			}
		}
		for _, name := range slices.Sorted(maps.Keys(archives)) {
			fmt.Printf("%s\t%s\n", name, archives[name])
		}
		return nil
	case o.bareControlPlane:
		cp, err := controlplane.Start(ctx, controlplane.Options{WithControllerManager: true, Log: logf})
		if err != nil {
			return err
		}
		defer cp.Stop()
		o.kubeconfig = cp.Kubeconfig
	case o.kubeconfig == "":
		c, kubeProxies, err := startCluster(ctx, o, suite)
		if err != nil {
			return err
		}
		defer func() {
			saveClusterLogs(c, kubeProxies, filepath.Join(outDir, "cluster"))
			c.Close()
		}()
		o.kubeconfig = c.Kubeconfig
	}
	var ginkgo string
	if o.procs > 1 {
		if ginkgo, err = upstream.EnsureGinkgo(ctx, controlplane.CacheDir()); err != nil {
			return err
		}
	}
	s, err := suite.Run(ctx, p, upstream.RunOptions{
		Kubeconfig: o.kubeconfig, Proxy: o.proxy, OutDir: outDir, Nodes: o.nodes,
		Timeout: o.timeout, StartupTimeout: o.startupTimeout, Extra: o.extra,
		Procs: o.procs, Ginkgo: ginkgo, FlakeAttempts: o.flakeAttempts,
		Output: os.Stdout, Logf: logf,
	})
	if s.Proxy != "" {
		// The plain closing line.
		fmt.Println(s.Line())
		if path, kerr := upstream.Keep("conformance", s, o.nodes, selection(o)); kerr != nil {
			logf("keep the figures: %v", kerr)
		} else {
			logf("figures in %s", path)
		}
	}
	return err
}

// selection says which tests of the focus a run chose.
func selection(o options) string {
	sel := "the focus"
	if o.conformanceOnly {
		sel = "the [Conformance] tests of the focus"
	}
	if o.part != "" {
		sel += ", part " + o.part
	}
	if o.narrow != "" {
		sel += ", narrowed to " + o.narrow
	}
	return sel
}

// startCluster starts the bed's cluster with the suite's images and the
// proxy, and returns once the cluster's DNS is ready; with kube-proxy, also
// its process on each node (in the order of c.Nodes), whose logs
// saveClusterLogs keeps.
func startCluster(ctx context.Context, o options, suite upstream.Suite) (*cluster.Cluster, []*kubeproxy.KubeProxy, error) {
	t0 := time.Now()
	assets, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
	if err != nil {
		return nil, nil, err
	}
	images, err := upstream.EnsureTestImages(ctx, controlplane.CacheDir(), suite, logf)
	if err != nil {
		return nil, nil, err
	}
	c, err := cluster.Start(ctx, cluster.Options{Assets: assets, Log: logf, Nodes: o.nodes, Images: images})
	if err != nil {
		return nil, nil, err
	}
	var kubeProxies []*kubeproxy.KubeProxy
	switch o.proxy {
	case "kube-proxy":
		// A process in the VM: it ends with the VM.
		kubeProxies, err = c.StartKubeProxy(ctx)
	default:
		// Labelled as kube-proxy's pods are, so that the suite's test of a
		// proxy restart finds them (the skip list's [with kube-proxy]).
		err = c.DeployIPVSProxyLabelled(ctx, o.deployDir, map[string]string{"k8s-app": "kube-proxy"})
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	logf("%s ready after %s", o.proxy, time.Since(t0).Round(time.Second))
	if err := c.WaitDNS(ctx); err != nil {
		c.Close()
		return nil, nil, err
	}
	logf("cluster ready (node, %s, DNS) after %s", o.proxy, time.Since(t0).Round(time.Second))
	return c, kubeProxies, nil
}

// saveClusterLogs writes each node's kubelet and containerd logs, its
// serial console, the proxy's log (ipvs-proxy's pods, or kube-proxy's
// process on the node: the last few MiB of it), CoreDNS's pod logs and the
// IPVS table into dir, for reading failures after the cluster is gone.
func saveClusterLogs(c *cluster.Cluster, kubeProxies []*kubeproxy.KubeProxy, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		logf("save cluster logs: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files := map[string]string{}
	for i, n := range c.Nodes {
		prefix := "" // one node: kubelet.log, ...; several: node-1-kubelet.log, ...
		if len(c.Nodes) > 1 {
			prefix = n.Name + "-"
		}
		files[prefix+"kubelet.log"], files[prefix+"containerd.log"] = n.KubeletLog(), n.ContainerdLog()
		if i < len(kubeProxies) {
			files[prefix+"kube-proxy.log"] = kubeProxies[i].Output()
		}
		if n.VM == nil {
			continue
		}
		files[prefix+"console.log"] = n.VM.ConsoleLog()
		if out, err := n.VM.RunOK(ctx, "ipvsadm", "-Ln"); err == nil {
			files[prefix+"ipvsadm.txt"] = out
		}
	}
	for _, sel := range []string{cluster.IPVSProxyPods, "k8s-app=kube-dns"} {
		pl, err := c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			continue
		}
		for _, p := range pl.Items {
			for _, ct := range p.Spec.Containers {
				b, err := c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name}).DoRaw(ctx)
				if err != nil {
					b = []byte(err.Error())
				}
				files[p.Name+"-"+ct.Name+".log"] = string(b)
			}
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			logf("save cluster logs: %v", err)
		}
	}
}
