// Command bench compares ipvs-proxy with upstream kube-proxy v1.36.3 in
// IPVS mode in the test bed (`make bench`). In one VM run, against the same
// apiserver and the same objects (N Services with two endpoints each), it
// runs each proxy in turn on a clean kernel and prints, per size, a table
// with both proxies and the ratio kube-proxy / ipvs-proxy:
//
//   - cold: the time from the proxy's start until every virtual server is in
//     the kernel, and until everything is (virtual and real servers, VIPs on
//     its interface, clusterIPs in its ipset, its nat rule on that set) and
//     its CPU, with that of the processes it runs (iptables-restore, ipset),
//     is idle; and that CPU time;
//   - one EndpointSlice change through the apiserver to the kernel, timed in
//     the VM (median and max of several rounds);
//   - a burst of EndpointSlice changes, until the kernel has the last one;
//   - the same single change made while the proxy's periodic full sync runs;
//   - peak RSS;
//   - a restart with nothing changed: time to idle, and the kernel's state
//     before and after (IPVS table, VIPs, ipset entries, iptables rules)
//     compared line by line; for ipvs-proxy also the writes it counts.
//
// For ipvs-proxy it also compares its cold sync with a floor: the same
// objects created with bare netlink calls one at a time (e2e/ipvsbench).
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
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/workload"
)

// config is the command line.
type config struct {
	proxies      []string
	sizes        []int
	rounds       int
	resyncRounds int
	burst        int
	quiet        time.Duration
	floor        bool
}

func main() {
	var c config
	proxies := flag.String("proxies", "ipvs-proxy,kube-proxy", "proxies to run, in this order: ipvs-proxy, kube-proxy")
	sizes := flag.String("sizes", "1000,10000", "numbers of Services, ascending")
	flag.IntVar(&c.rounds, "rounds", 5, "single EndpointSlice changes timed per proxy and size")
	flag.IntVar(&c.resyncRounds, "resync-rounds", 3, "changes timed during a periodic full sync per proxy and size (0: none)")
	flag.IntVar(&c.burst, "burst", 100, "EndpointSlices changed at once in the burst")
	flag.DurationVar(&c.quiet, "quiet", 5*time.Second, "how long a proxy's CPU must not grow for it to be idle")
	flag.BoolVar(&c.floor, "floor", true, "also compare ipvs-proxy's cold sync with the bare-netlink floor")
	flag.Parse()
	for _, p := range strings.Split(*proxies, ",") {
		p = strings.TrimSpace(p)
		if _, ok := proxyKinds[p]; !ok || slices.Contains(c.proxies, p) {
			usage("-proxies %q: want ipvs-proxy and/or kube-proxy", *proxies)
		}
		c.proxies = append(c.proxies, p)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(c.sizes) > 0 && n <= c.sizes[len(c.sizes)-1]) {
			usage("-sizes %q: want ascending positive numbers", *sizes)
		}
		c.sizes = append(c.sizes, n)
	}
	if c.rounds < 1 || c.resyncRounds < 0 || c.burst < 1 || c.burst*2 > c.sizes[0] {
		usage("-rounds must be positive, -resync-rounds not negative, -burst positive and at most half the smallest size")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, c config) error {
	assets, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
	if err != nil {
		return err
	}
	b, err := bed.Start(ctx, assets, bed.Options{Log: logf, NoAgent: true, MemoryMB: 3072,
		Packages:  []string{"github.com/ipvs-proxy/ipvs-proxy/e2e/ipvsbench"},
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
	var tables []sizeResult
	have := 0
	for _, n := range c.sizes {
		t0 := time.Now()
		if err := workload.CreateServices(ctx, client, have, n); err != nil {
			return err
		}
		logf("created Services %d..%d and their EndpointSlices in %v", have, n-1, time.Since(t0).Round(time.Millisecond))
		have = n
		sr := sizeResult{services: n}
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
				return fmt.Errorf("%s at %d Services: %w", p, n, err)
			}
		}
		if c.floor && slices.Contains(c.proxies, "ipvs-proxy") {
			if sr.floor, err = bn.floor(ctx, n); err != nil {
				return fmt.Errorf("floor at %d Services: %w", n, err)
			}
		}
		tables = append(tables, sr)
		// Each size's table as soon as it is there: a long run shows
		// its first figures early.
		printSize(os.Stderr, sr)
	}
	fmt.Println()
	for _, sr := range tables {
		printSize(os.Stdout, sr)
	}
	printNotes(os.Stdout, c)
	return nil
}
