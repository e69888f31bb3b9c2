// Command bench measures ipvs-proxy in the test bed (`make bench`). For each
// size (Services with two endpoints each) it prints, from one VM run:
//
//   - cold sync: the agent's first full sync into an empty kernel;
//   - floor: the same objects (dummy, VIPs, virtual servers, real servers)
//     created with bare netlink calls one at a time, and the ratio;
//   - adoption: the writes of an agent started on the floor's kernel (0);
//   - change latency: an EndpointSlice update through the apiserver until
//     the kernel has it, timed in the VM (median and max of several rounds);
//   - writes per change, from the agent's sync log;
//   - the agent's peak RSS.
//
// Absolute times are inflated by software emulation; compare ratios.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

const (
	namespace = "bench"
	// Endpoints live in 10.176.0.0/12, routed in the VM by a dummy
	// interface: IPVS refuses a NAT real server it has no route to.
	endpointNet = "10.176.0.1/12"
)

func main() {
	sizes := flag.String("sizes", "1000,10000", "numbers of Services, ascending")
	rounds := flag.Int("rounds", 7, "EndpointSlice changes timed per size")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(ns) > 0 && n <= ns[len(ns)-1]) {
			fmt.Fprintf(os.Stderr, "bench: -sizes %q: want ascending positive numbers\n", *sizes)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if err := run(ctx, ns, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// result is one size's figures.
type result struct {
	services                           int
	cold, coldTotal, floor, floorAddrs time.Duration
	coldWrites, floorCalls             int
	startToSynced                      time.Duration
	adoptWrites                        int
	latencyMedian, latencyMax          time.Duration
	writesPerChange                    []int
	syncPerChange                      time.Duration // median of the agent's partial syncs
	peakRSSKiB                         int
}

func run(ctx context.Context, sizes []int, rounds int) error {
	assets, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
	if err != nil {
		return err
	}
	b, err := bed.Start(ctx, assets, bed.Options{Log: logf, NoAgent: true, MemoryMB: 3072,
		Packages:  []string{"github.com/ipvs-proxy/ipvs-proxy/e2e/ipvsbench"},
		AgentArgs: []string{"--min-sync-period", "0s", "--sync-period", "10m", "--nodeport-addresses", "10.0.2.0/24"}})
	if err != nil {
		return err
	}
	defer b.Close()
	for _, c := range [][]string{
		{"ip", "link", "add", "bench0", "type", "dummy"},
		{"ip", "addr", "add", endpointNet, "dev", "bench0"},
		{"ip", "link", "set", "bench0", "up"},
	} {
		if _, err := b.VM.RunOK(ctx, c...); err != nil {
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
	var results []result
	have := 0
	for _, n := range sizes {
		t0 := time.Now()
		if err := createServices(ctx, client, have, n); err != nil {
			return err
		}
		logf("created Services %d..%d and their EndpointSlices in %v", have, n-1, time.Since(t0).Round(time.Millisecond))
		have = n
		r, err := measure(ctx, b, n, rounds)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	printTable(results)
	return nil
}

type floorService struct {
	VIP  string   `json:"vip"`
	Port uint16   `json:"port"`
	RS   []string `json:"rs"`
}

func endpointAddr(i, k int) string {
	// Two endpoints per Service, 16 addresses apart so that the latency
	// rounds' moves (to the next address) never collide.
	j := (i*2+k)*16 + 16
	return fmt.Sprintf("10.%d.%d.%d", 176+j>>16, (j>>8)&255, j&255)
}

// createServices creates Services from..to-1, each with an EndpointSlice of
// two ready endpoints, with 16 workers.
func createServices(ctx context.Context, c kubernetes.Interface, from, to int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				err := createService(ctx, c, i)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for i := from; i < to; i++ {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	return firstErr
}

func createService(ctx context.Context, c kubernetes.Interface, i int) error {
	name := fmt.Sprintf("svc-%05d", i)
	_, err := c.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{bed.Port("http", corev1.ProtocolTCP, 80)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(bed.BackendPort))}},
	}
	for k := 0; k < 2; k++ {
		a := endpointAddr(i, k)
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(namespace).Create(ctx, eps, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s: %w", name, err)
	}
	return nil
}

var (
	tableVS = regexp.MustCompile(`^TCP\s+([0-9.]+):(\d+)\s`)
	tableRS = regexp.MustCompile(`^\s+->\s+([0-9.]+:\d+)\s`)
)

// parseTable reads `ipvsadm -Ln` (IPv4 TCP virtual servers) into the
// floor's input.
func parseTable(table string) ([]floorService, error) {
	var out []floorService
	for _, l := range strings.Split(table, "\n") {
		if m := tableVS.FindStringSubmatch(l); m != nil {
			port, _ := strconv.Atoi(m[2])
			out = append(out, floorService{VIP: m[1], Port: uint16(port)})
		} else if m := tableRS.FindStringSubmatch(l); m != nil && len(out) > 0 {
			out[len(out)-1].RS = append(out[len(out)-1].RS, m[1])
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no virtual servers in the table:\n%s", table)
	}
	// In the agent's order: it binds addresses in ascending order, which
	// the kernel's tables take faster than the table's hash order.
	slices.SortFunc(out, func(a, b floorService) int {
		return netip.MustParseAddr(a.VIP).Compare(netip.MustParseAddr(b.VIP))
	})
	return out, nil
}

var (
	syncLine  = regexp.MustCompile(`"msg":"synced".*"kind":"(full|partial)".*"writes":(\d+).*"ipvs":([0-9.e-]+).*"took":([0-9.e-]+)`)
	vmHWMLine = regexp.MustCompile(`VmHWM:\s+(\d+) kB`)
)

type syncRecord struct {
	full   bool
	writes int
	ipvs   time.Duration // the IPVS reconciler's part
	took   time.Duration // the whole sync: plans, IPVS, iptables glue
}

func syncs(log string) []syncRecord {
	var out []syncRecord
	for _, m := range syncLine.FindAllStringSubmatch(log, -1) {
		w, _ := strconv.Atoi(m[2])
		ipvs, _ := strconv.ParseFloat(m[3], 64)
		took, _ := strconv.ParseFloat(m[4], 64)
		out = append(out, syncRecord{full: m[1] == "full", writes: w,
			ipvs: time.Duration(ipvs * float64(time.Second)), took: time.Duration(took * float64(time.Second))})
	}
	return out
}

// flush empties IPVS and removes the proxy's interface; no agent may run.
func flush(ctx context.Context, b *bed.Bed) error {
	if res, err := b.VM.Run(ctx, "pidof", "ipvs-proxy"); err != nil || res.ExitCode == 0 {
		return fmt.Errorf("an agent still runs (pidof: %q, %v)", res.Stdout, err)
	}
	if _, err := b.VM.RunOK(ctx, "ipvsadm", "-C"); err != nil {
		return err
	}
	if _, err := b.VM.RunOK(ctx, "sh", "-c", "if ip link show "+bed.Interface+" >/dev/null 2>&1; then ip link delete "+bed.Interface+"; fi"); err != nil {
		return err
	}
	if out, _ := b.VM.RunOK(ctx, "ipvsadm", "-Ln"); strings.Contains(out, "\nTCP ") {
		return fmt.Errorf("IPVS not empty after a flush:\n%s", out)
	}
	// Deleting thousands of addresses leaves the kernel work to finish in
	// the background; let it, so that what comes next is timed alone.
	time.Sleep(5 * time.Second)
	return nil
}

func peakRSS(ctx context.Context, b *bed.Bed) (int, error) {
	out, err := b.VM.RunOK(ctx, "sh", "-c", "cat /proc/$(pidof ipvs-proxy)/status")
	if err != nil {
		return 0, err
	}
	m := vmHWMLine.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no VmHWM in %q", out)
	}
	return strconv.Atoi(m[1])
}

func measure(ctx context.Context, b *bed.Bed, n, rounds int) (result, error) {
	r := result{services: n}
	// 1. Cold sync into an empty kernel.
	if err := flush(ctx, b); err != nil {
		return r, err
	}
	t0 := time.Now()
	if err := b.StartAgent(ctx, "--log-level", "info"); err != nil {
		return r, err
	}
	r.startToSynced = time.Since(t0)
	first := syncs(b.AgentOutput())
	if len(first) == 0 || !first[0].full {
		return r, fmt.Errorf("no first full sync in the agent's log")
	}
	r.cold, r.coldTotal, r.coldWrites = first[0].ipvs, first[0].took, first[0].writes
	logf("%d Services: cold sync %v (with plans and iptables glue: %v), %d writes", n, r.cold, r.coldTotal, r.coldWrites)
	if err := b.StopAgent(); err != nil {
		return r, err
	}
	// The floor creates exactly what the agent made.
	table, err := b.IPVSTable(ctx)
	if err != nil {
		return r, err
	}
	spec, err := parseTable(table)
	if err != nil {
		return r, err
	}

	// 2. The floor: the same objects with bare netlink calls.
	if err := flush(ctx, b); err != nil {
		return r, err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return r, err
	}
	if err := b.VM.WriteFile(ctx, "/tmp/floor.json", data, 0o644); err != nil {
		return r, err
	}
	out, err := b.VM.RunOK(ctx, "/usr/local/bin/ipvsbench", "floor", "/tmp/floor.json")
	if err != nil {
		return r, err
	}
	var fl struct {
		Seconds        float64 `json:"seconds"`
		AddressSeconds float64 `json:"addressSeconds"`
		Calls          int     `json:"calls"`
	}
	if err := json.Unmarshal([]byte(out), &fl); err != nil {
		return r, fmt.Errorf("floor output %q: %w", out, err)
	}
	r.floor, r.floorCalls = time.Duration(fl.Seconds*float64(time.Second)), fl.Calls
	r.floorAddrs = time.Duration(fl.AddressSeconds * float64(time.Second))
	logf("%d Services: floor %v (binding the VIPs: %v), %d calls", n, r.floor, r.floorAddrs, r.floorCalls)

	// 3. Adoption of the floor's kernel, then single changes.
	if err := b.StartAgent(ctx, "--log-level", "debug"); err != nil {
		return r, err
	}
	defer func() {
		if err := b.StopAgent(); err != nil {
			logf("stop the agent: %v", err)
		}
	}()
	adopt := syncs(b.AgentOutput())
	r.adoptWrites = adopt[0].writes
	before := len(adopt)
	name := fmt.Sprintf("svc-%05d", n/2)
	svc, err := b.Client.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return r, err
	}
	out, err = b.VM.RunOK(ctx, "/usr/local/bin/ipvsbench", "latency", bed.GuestKubecfg, namespace, name,
		svc.Spec.ClusterIP+":80", strconv.Itoa(rounds))
	if err != nil {
		return r, err
	}
	var lat struct {
		Seconds []float64 `json:"seconds"`
	}
	if err := json.Unmarshal([]byte(out), &lat); err != nil {
		return r, fmt.Errorf("latency output %q: %w", out, err)
	}
	slices.Sort(lat.Seconds)
	r.latencyMedian = time.Duration(lat.Seconds[len(lat.Seconds)/2] * float64(time.Second))
	r.latencyMax = time.Duration(lat.Seconds[len(lat.Seconds)-1] * float64(time.Second))
	time.Sleep(500 * time.Millisecond)
	var took []time.Duration
	for _, s := range syncs(b.AgentOutput())[before:] {
		if !s.full && s.writes > 0 {
			r.writesPerChange = append(r.writesPerChange, s.writes)
			took = append(took, s.took)
		}
	}
	if len(took) > 0 {
		slices.Sort(took)
		r.syncPerChange = took[len(took)/2]
	}
	if r.peakRSSKiB, err = peakRSS(ctx, b); err != nil {
		return r, err
	}
	logf("%d Services: change latency median %v max %v (the agent's sync: %v), writes per change %v, peak RSS %d KiB",
		n, r.latencyMedian, r.latencyMax, r.syncPerChange, r.writesPerChange, r.peakRSSKiB)
	return r, nil
}

func printTable(rs []result) {
	fmt.Println()
	fmt.Printf("%-9s %-11s %-11s %-6s %-11s %-12s %-13s %-19s %-12s %-16s %-9s\n", "services", "cold sync", "floor", "ratio", "whole sync",
		"cold writes", "adopt writes", "change p50 / max", "agent sync", "writes/change", "peak RSS")
	for _, r := range rs {
		fmt.Printf("%-9d %-11s %-11s %-6.2f %-11s %-12d %-13d %-19s %-12s %-16s %-9s\n", r.services,
			r.cold.Round(time.Millisecond), r.floor.Round(time.Millisecond), float64(r.cold)/float64(r.floor),
			r.coldTotal.Round(time.Millisecond),
			r.coldWrites, r.adoptWrites,
			r.latencyMedian.Round(time.Millisecond).String()+" / "+r.latencyMax.Round(time.Millisecond).String(),
			r.syncPerChange.Round(10*time.Microsecond),
			fmt.Sprint(r.writesPerChange), fmt.Sprintf("%d MiB", r.peakRSSKiB/1024))
	}
	fmt.Println("\ncold sync: the IPVS part of the agent's first full sync into an empty kernel (reads + writes);")
	fmt.Println("whole sync: the same sync with building the plans and the first iptables glue sync (ipsets, rules);")
	fmt.Println("floor: the same dummy, VIPs, virtual and real servers created with bare netlink calls, same VM run;")
	fmt.Println("change: EndpointSlice update through the apiserver until the kernel has it, timed in the VM;")
	fmt.Println("agent sync: the median of the agent's own partial syncs for those changes (its part of the latency).")
}
