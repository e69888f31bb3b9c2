// Command bench compares ipvs-proxy with upstream kube-proxy v1.36.3 in
// IPVS mode and in nftables mode (the mode upstream tells IPVS users to
// move to) in the test bed (`make bench`). In one VM run, against the same
// apiserver and the same objects (N Services with M endpoints each, per
// shape), it runs each proxy in turn on a clean kernel and prints, per
// shape, a table with the proxies and each kube-proxy mode's ratio to
// ipvs-proxy:
//
//   - cold: the time from the proxy's start until every Service's VIP:port
//     is in the kernel, and until everything is (IPVS: virtual and real
//     servers, VIPs on its interface, clusterIPs in its ipset, its nat rule
//     on that set; nftables: each VIP:port in the map service-ips and its
//     chain's DNAT to exactly its endpoints) and its CPU, with that of the
//     processes it runs (iptables-restore, ipset, nft), is idle; and that
//     CPU time. A proxy not settled within -bound is reported as "> bound"
//     and not measured further at that shape;
//   - one EndpointSlice change through the apiserver to the kernel, timed in
//     the VM (median and max of several rounds);
//   - a burst of EndpointSlice changes, until the kernel has the last one;
//   - the same single change made while the proxy's periodic full sync runs;
//     with -busy-rounds, for ipvs-proxy, spread over its periodic resync and
//     glue check;
//   - peak RSS;
//   - a restart with nothing changed: time to idle, and the kernel's state
//     before and after (IPVS table, VIPs, ipset entries, iptables rules)
//     compared line by line; for ipvs-proxy also the writes it counts.
//
// For ipvs-proxy it also compares its cold sync with a floor: the same
// objects created with bare netlink calls one at a time (e2e/guest/ipvsbench).
//
// Absolute times are inflated by software emulation; compare ratios.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/workload"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// config is the command line.
type config struct {
	proxies      []string
	shapes       []shape
	rounds       int
	resyncRounds int
	busyRounds   int
	busyWindow   time.Duration
	busyDebug    bool
	burst        int
	quiet        time.Duration
	floor        bool
	bound        time.Duration
	cpuProfile   time.Duration
	// The data path (datapath.go): short connections per path, at a
	// time, and one stream's size; datapathOnly skips the control
	// plane's measures after the cold start.
	datapathConns     int
	datapathWorkers   int
	datapathStreamMiB int64
	datapathOnly      bool
	// gctrace: ipvs-proxy runs with GODEBUG=gctrace=1 (memtrace.go).
	gctrace bool
	// vmMemoryMB: the VM's memory, for shapes whose kube-proxy needs
	// more than the default.
	vmMemoryMB int
}

func main() {
	var c config
	all := ipvsProxy + "," + ipvsProxyBound + "," + kubeProxyIPVS + "," + kubeProxyNFTables
	proxies := flag.String("proxies", all, "proxies to run, in this order, among "+all)
	shapes := flag.String("shapes", "1000x2,10000x2,2000x50,5000x50",
		"Services × endpoints each (N alone: N×2), in order; runs of the same endpoints ascending")
	flag.IntVar(&c.rounds, "rounds", 5, "single EndpointSlice changes timed per proxy and size")
	flag.IntVar(&c.resyncRounds, "resync-rounds", 3, "changes timed during a periodic full sync per proxy and size (0: none)")
	flag.IntVar(&c.busyRounds, "busy-rounds", 0, "ipvs-proxy only: changes timed while its periodic resync and glue check run, spread over them (0: none)")
	flag.DurationVar(&c.busyWindow, "busy-window", 0, "the span the busy changes are spread over (0: what ipvs-proxy's last resync and glue check took, by its log)")
	flag.BoolVar(&c.busyDebug, "busy-debug", false, "with -busy-rounds: ipvs-proxy's restart, whose process takes the busy rounds, logs at debug level; each busy change is listed with the syncs it met, and the log kept in bin/bench")
	flag.IntVar(&c.burst, "burst", 100, "EndpointSlices changed at once in the burst (a shape below twice it measures the data path only)")
	flag.DurationVar(&c.quiet, "quiet", 5*time.Second, "how long a proxy's CPU must not grow for it to be idle")
	flag.BoolVar(&c.floor, "floor", true, "also compare ipvs-proxy's cold sync with the bare-netlink floor")
	flag.DurationVar(&c.bound, "bound", 30*time.Minute, "how long a proxy may take to settle, or a change to land, before it is reported as more")
	flag.DurationVar(&c.cpuProfile, "cpu-profile", 0, "save a CPU profile of this long of ipvs-proxy's cold start (bin/bench/cpu-<proxy>-<n>.pb.gz; 0: none)")
	flag.IntVar(&c.datapathConns, "datapath", 1000, "short connections through each data path per proxy and shape (0: the data path is not measured)")
	flag.IntVar(&c.datapathWorkers, "datapath-workers", 4, "the data path's connections at a time")
	flag.Int64Var(&c.datapathStreamMiB, "datapath-stream", 64, "MiB of the data path's one stream")
	flag.BoolVar(&c.datapathOnly, "datapath-only", false, "after each cold start measure the data path only (no changes, burst, restart)")
	flag.BoolVar(&c.gctrace, "gctrace", false, "run ipvs-proxy with GODEBUG=gctrace=1 and log its collections' largest heap beside its RSS by kind of page")
	flag.IntVar(&c.vmMemoryMB, "vm-memory", 3072, "the VM's memory in MiB (the largest shapes' kube-proxy needs more)")
	flag.Parse()
	for _, p := range strings.Split(*proxies, ",") {
		p = strings.TrimSpace(p)
		if _, ok := proxyKinds[p]; !ok || slices.Contains(c.proxies, p) {
			usage("-proxies %q: want some of %s, each once", *proxies, all)
		}
		c.proxies = append(c.proxies, p)
	}
	var err error
	if c.shapes, err = parseShapes(*shapes); err != nil {
		usage("-shapes %q: %v", *shapes, err)
	}
	if c.bound <= 0 || c.bound > helperTimeout-time.Minute {
		usage("-bound must be positive and below %v", helperTimeout-time.Minute)
	}
	if c.rounds < 1 || c.resyncRounds < 0 || c.busyRounds < 0 || c.burst < 1 {
		usage("-rounds and -burst must be positive, -resync-rounds and -busy-rounds not negative")
	}
	for _, sh := range c.shapes {
		if !c.controlPlaneAt(sh.services) && c.datapathConns == 0 {
			usage("%d Services: below twice -burst (or with -datapath-only) only the data path is measured after the cold start, and -datapath is 0", sh.services)
		}
	}
	if c.datapathConns < 0 || c.datapathWorkers < 1 || c.datapathStreamMiB < 1 || c.datapathStreamMiB<<20 > nettest.MaxDownload ||
		c.datapathOnly && c.datapathConns == 0 {
		usage("-datapath must not be negative (nor 0 with -datapath-only), -datapath-workers positive, -datapath-stream 1..%d", nettest.MaxDownload>>20)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, c)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// shape is one size of the bench: Services, each with endpoints.
type shape struct{ services, endpoints int }

func (s shape) String() string {
	return fmt.Sprintf("%d Services × %d endpoints", s.services, s.endpoints)
}

// parseShapes reads -shapes: "N" or "NxM", comma-separated; consecutive
// shapes of the same endpoints must grow (the Services of the smaller
// stay), a change of endpoints starts again from none.
func parseShapes(arg string) ([]shape, error) {
	var out []shape
	for _, f := range strings.Split(arg, ",") {
		ns, ms, found := strings.Cut(strings.TrimSpace(f), "x")
		n, err := strconv.Atoi(ns)
		m := 2
		if found && err == nil {
			m, err = strconv.Atoi(ms)
		}
		if err != nil || n <= 0 || m <= 0 || m > min(1000, workload.MaxEndpoints(n)) {
			return nil, fmt.Errorf("%q: want N or NxM, N Services of M endpoints (M at most 1,000, N×M at most %d)", f, workload.MaxEndpoints(1))
		}
		if len(out) > 0 && out[len(out)-1].endpoints == m && n <= out[len(out)-1].services {
			return nil, fmt.Errorf("%q after %v: sizes of the same endpoints must grow", f, out[len(out)-1])
		}
		out = append(out, shape{n, m})
	}
	return out, nil
}

// controlPlaneAt tells whether the control plane's measures (changes,
// burst, restart) are taken at n Services after the cold start: not with
// -datapath-only, nor at a shape below twice the burst (the data path's
// baseline of 10 Services, measured in the run of its 10,000).
func (c config) controlPlaneAt(n int) bool { return !c.datapathOnly && 2*c.burst <= n }

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, c config) error {
	// The commit whose agent the bed builds now; the figures come an
	// hour later, when the tree may be elsewhere.
	commit := results.Commit()
	assets, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
	if err != nil {
		return err
	}
	b, err := bed.Start(ctx, assets, bed.Options{Log: logf, NoAgent: true, MemoryMB: c.vmMemoryMB,
		Packages:  []string{"github.com/ipvs-proxy/ipvs-proxy/e2e/guest/ipvsbench"},
		AgentArgs: ipvsProxyArgs})
	if err != nil {
		return err
	}
	defer b.Close()
	for _, cmd := range [][]string{
		{"ip", "link", "add", "bench0", "type", "dummy"},
		{"ip", "addr", "add", endpointNet, "dev", "bench0"},
		{"ip", "link", "set", "bench0", "up"},
	} {
		if _, err := b.VM.RunOK(ctx, cmd...); err != nil {
			return err
		}
	}
	// A client for bulk creation, not throttled.
	rc := rest.CopyConfig(b.CP.RESTConfig)
	rc.QPS, rc.Burst = 5000, 5000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	bn := &bench{bed: b, client: client, cfg: c}
	if c.gctrace {
		if err := installGCTrace(ctx, b.VM); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(c.proxies, func(p string) bool { return proxyKinds[p].kubeProxy }) {
		// Before any settle starts its clock (it waits a minute for the
		// process, which a build on a loaded machine can take).
		if err := kubeproxy.Install(ctx, b.VM, logf); err != nil {
			return err
		}
	}
	if c.datapathConns > 0 {
		if bn.dp, err = setupDataPath(ctx, b); err != nil {
			return err
		}
	}
	var tables []sizeResult
	have, per := 0, 0
	for _, sh := range c.shapes {
		n := sh.services
		t0 := time.Now()
		if per != sh.endpoints && have > 0 {
			if err := workload.DeleteServices(ctx, client); err != nil {
				return err
			}
			logf("deleted the %d Services of %d endpoints in %v", have, per, time.Since(t0).Round(time.Millisecond))
			have, t0 = 0, time.Now()
		}
		per = sh.endpoints
		if err := workload.CreateServicesWith(ctx, client, have, n, per); err != nil {
			return err
		}
		logf("created Services %d..%d and their EndpointSlices (%d endpoints each) in %v", have, n-1, per, time.Since(t0).Round(time.Millisecond))
		have = n
		sr := sizeResult{shape: sh}
		for _, p := range c.proxies {
			r, err := bn.measure(ctx, proxyKinds[p], n)
			sr.proxies = append(sr.proxies, r)
			if err != nil {
				// What was measured before the failure or interrupt
				// ("-": not measured).
				fmt.Println()
				for _, t := range append(tables, sr) {
					printSize(os.Stdout, t)
				}
				return fmt.Errorf("%s at %v: %w", p, sh, err)
			}
		}
		if c.floor && slices.Contains(c.proxies, ipvsProxy) {
			if sr.floor, err = bn.floor(ctx, n); err != nil {
				return fmt.Errorf("floor at %v: %w", sh, err)
			}
		}
		tables = append(tables, sr)
		// Each size's table as soon as it is there: a long run shows
		// its first figures early.
		printSize(os.Stderr, sr)
	}
	fmt.Println()
	var figures []sizeFigures
	for _, sr := range tables {
		printSize(os.Stdout, sr)
		figures = append(figures, figuresOf(sr))
	}
	if sc, ok := scaleOf(tables); ok {
		printFigures(os.Stdout, sc)
		figures = append(figures, sc)
	}
	printNotes(os.Stdout, c)
	return keepFigures("bench", commit, figures)
}

// keepFigures writes the run's figures, of the code at commit, as data
// (framework/results).
func keepFigures(suite, commit string, figures any) error {
	p, err := results.KeepAt(suite, commit, figures)
	if err != nil {
		return err
	}
	logf("figures in %s", p)
	return nil
}
