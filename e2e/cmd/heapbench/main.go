// Command heapbench measures where ipvs-proxy's memory goes (`make
// bench-heap`), on the host, without the VM: the bed's kube-apiserver and
// etcd run on 127.0.0.1, the command creates N Services with two endpoints
// each (-endpoints E: E each; the objects of `make bench`'s shapes N x E,
// e2e/framework/workload), and runs the agent's proxier in this process,
// with its informers (protobuf, the model.Compact transform) against that
// apiserver and the fake kernel in
// place of netlink. For each size it prints:
//
//   - when the initial lists were in (the proxier's Listed), with the
//     heap's and the RSS's peaks until then, and the first full sync's time
//     (start until every virtual server is in the fake kernel and nothing
//     is pending);
//   - the peak of the heap during it (live and not yet collected objects,
//     sampled every 5 ms) and the process's peak RSS (VmHWM, reset before
//     the start);
//   - the heap that stays once it is done (after a collection), in all and
//     per Service, split by who allocated it (informer caches, the
//     proxier's own state, the fake kernel, which is not the agent's);
//   - and writes the heap profile (bin/heapbench/heap-N.pb.gz, for `go tool
//     pprof`), and one taken just before the proxier starts
//     (heap-N-before.pb.gz): with it as the base, pprof's alloc_space is
//     what the informers' initial list and the first sync allocated, by
//     call site.
//
// The iptables glue is in it, on the fake ipsets (ipset/fake) and on
// iptables tools that save empty tables and take every restore, so that it
// builds its set entries and rules as on a node. Each size starts a new
// proxier; the Services of the smaller size stay.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/results"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/workload"
	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

func main() {
	sizes := flag.String("sizes", "1000,10000", "comma-separated numbers of Services, ascending")
	per := flag.Int("endpoints", 2, "endpoints per Service (one EndpointSlice each, as make bench's shapes N x E)")
	out := flag.String("out", "bin/heapbench", "directory for the heap profiles")
	rate := flag.Int("memprofilerate", 4096, "runtime.MemProfileRate: bytes between heap samples")
	gogc := flag.Int("gogc", 50, "the collector's percentage (debug.SetGCPercent): 50 is the agent's default")
	listGOGC := flag.Int("list-gogc", 200, "the collector's percentage while the initial lists stream in, as the agent sets it (cmd/ipvs-proxy listGCPercent; 0: -gogc throughout)")
	cpuProfile := flag.Bool("cpuprofile", false, "also write cpu-N.pb.gz (the proxier's start to its first sync) and the proxier's log, agent-N.log, into -out (the heap figures then include the log's cost)")
	flag.Parse()
	runtime.MemProfileRate = *rate
	debug.SetGCPercent(*gogc)
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || (len(ns) > 0 && n <= ns[len(ns)-1]) {
			fmt.Fprintf(os.Stderr, "heapbench: -sizes: %q is not an ascending list of positive numbers\n", *sizes)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, ns, *per, *out, *cpuProfile, gcPercents{list: *listGOGC, after: *gogc})
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintf(os.Stderr, "heapbench: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// result is one size's figures.
type result struct {
	services    int
	sync        time.Duration
	listed      time.Duration // until the initial lists were in
	listPeak    uint64        // heap objects' peak until then
	listRSS     uint64        // VmHWM then
	peakHeap    uint64        // heap objects, live or not yet collected
	peakRSS     uint64        // VmHWM
	retained    uint64        // live heap after the sync, above the baseline
	byOwner     map[string]uint64
	profile     string
	baseProfile string // the heap profile just before the proxier started
	allocated   uint64 // bytes allocated during the first sync
}

// gcPercents are the collector's percentages during the initial lists and
// after them.
type gcPercents struct{ list, after int }

func run(ctx context.Context, sizes []int, per int, outDir string, cpuProfile bool, gc gcPercents) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Log: logf, ServiceCIDR: "10.96.0.0/16"})
	if err != nil {
		return err
	}
	defer cp.Stop()
	// A client for bulk creation, not throttled; the proxier gets its own,
	// tuned like the agent's.
	bulk := rest.CopyConfig(cp.RESTConfig)
	bulk.QPS, bulk.Burst = 5000, 5000
	bulk.ContentType = "application/vnd.kubernetes.protobuf"
	creator, err := kubernetes.NewForConfig(bulk)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	if _, err := creator.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workload.Namespace}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", workload.Namespace, err)
	}
	var results []result
	have := 0
	for _, n := range sizes {
		t0 := time.Now()
		if err := workload.CreateServicesWith(ctx, creator, have, n, per); err != nil {
			return err
		}
		logf("created Services %d..%d and their EndpointSlices (%d endpoints each) in %v", have, n-1, per, time.Since(t0).Round(time.Millisecond))
		have = n
		r, err := measure(ctx, cp.RESTConfig, n, outDir, cpuProfile, gc)
		if err != nil {
			return fmt.Errorf("%d Services: %w", n, err)
		}
		results = append(results, r)
	}
	printResults(os.Stdout, results)
	return keepFigures(results, per)
}

// sizeFigures is one size's figures as data (framework/results).
type sizeFigures struct {
	Services          int               `json:"services"`
	EndpointsEach     int               `json:"endpoints_each"`
	SyncSeconds       float64           `json:"first_sync_seconds"`
	ListedSeconds     float64           `json:"lists_seconds"`
	PeakHeapMiB       float64           `json:"peak_heap_mib"`
	PeakRSSMiB        float64           `json:"peak_rss_mib"`
	RetainedMiB       float64           `json:"retained_mib"`
	AllocatedMiB      float64           `json:"allocated_mib"`
	RetainedByOwnerKB map[string]uint64 `json:"retained_by_owner_kib,omitempty"`
}

// keepFigures writes the run's figures (framework/results).
func keepFigures(rs []result, per int) error {
	const mib = 1 << 20
	var figures []sizeFigures
	for _, r := range rs {
		f := sizeFigures{Services: r.services, EndpointsEach: per, SyncSeconds: r.sync.Seconds(), ListedSeconds: r.listed.Seconds(),
			PeakHeapMiB: float64(r.peakHeap) / mib, PeakRSSMiB: float64(r.peakRSS) / mib,
			RetainedMiB: float64(r.retained) / mib, AllocatedMiB: float64(r.allocated) / mib}
		if len(r.byOwner) > 0 {
			f.RetainedByOwnerKB = map[string]uint64{}
			for k, v := range r.byOwner {
				f.RetainedByOwnerKB[k] = v >> 10
			}
		}
		figures = append(figures, f)
	}
	path, err := results.Keep("heapbench", figures)
	if err != nil {
		return err
	}
	logf("figures in %s", path)
	return nil
}

// measure runs a new proxier until its first full sync is done and takes
// the figures.
func measure(ctx context.Context, base *rest.Config, n int, outDir string, cpuProfile bool, gc gcPercents) (result, error) {
	r := result{services: n}
	log := zap.NewNop()
	if cpuProfile {
		zc := zap.NewProductionConfig()
		zc.OutputPaths = []string{filepath.Join(outDir, fmt.Sprintf("agent-%d.log", n))}
		l, err := zc.Build()
		if err != nil {
			return r, fmt.Errorf("the proxier's log: %w", err)
		}
		defer func() { _ = l.Sync() }()
		log = l
	}
	rc := rest.CopyConfig(base)
	agent.TuneClientConfig(rc, "ipvs-proxy-heapbench")
	client, err := kube.NewForConfig(rc) // the agent's own client, as run makes it
	if err != nil {
		return r, fmt.Errorf("create client: %w", err)
	}
	ipvs, links := fake.NewIPVS(), fake.NewLinks(netip.MustParseAddr("192.0.2.10"))
	ipvs.KeepCalls(false)
	links.KeepCalls(false)
	cfg := agent.Config{NodeName: "heapbench-node", Interface: "ipvs-proxy0", Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, IPv4: true,
		MinSyncPeriod: time.Second, SyncPeriod: time.Hour}
	p := agent.New(cfg, client, ipvs, links, &record.FakeRecorder{}, agent.NewMetrics(prometheus.NewRegistry()), log)
	ipt, err := glue.NewIPTables(emptyTables{}, glue.NFT, ipset.IPv4)
	if err != nil {
		return r, err
	}
	p.AddConsumer(glue.New(glue.Config{Interface: cfg.Interface, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, IPv4: true},
		ipsetfake.New(), map[ipset.Family]*glue.IPTables{ipset.IPv4: ipt}, links, log))

	runtime.GC()
	runtime.GC()
	r.profile = filepath.Join(outDir, fmt.Sprintf("heap-%d.pb.gz", n))
	r.baseProfile = filepath.Join(outDir, fmt.Sprintf("heap-%d-before.pb.gz", n))
	if err := writeHeapProfile(r.baseProfile); err != nil {
		return r, err
	}
	// The profile's writing is not the proxier's: before it is counted.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := resetPeakRSS(); err != nil {
		return r, err
	}
	sampler := startSampler()
	t0 := time.Now()
	if cpuProfile {
		f, err := os.Create(filepath.Join(outDir, fmt.Sprintf("cpu-%d.pb.gz", n)))
		if err != nil {
			return r, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return r, err
		}
		defer pprof.StopCPUProfile() // on the paths that end early
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	runErr := make(chan error, 1)
	wg.Add(1)
	if gc.list > 0 {
		// As the agent does (cmd/ipvs-proxy gcDuringLists).
		debug.SetGCPercent(gc.list)
	}
	// The peaks split at the end of the initial lists: which phase sets
	// the process's peak.
	type listFigures struct {
		at        time.Duration
		peak, rss uint64
	}
	listed := make(chan listFigures, 1)
	go func() {
		select {
		case <-p.Listed():
		case <-runCtx.Done():
			return
		}
		f := listFigures{at: time.Since(t0), peak: sampler.peakSoFar()}
		f.rss, _ = peakRSS()
		if gc.list > 0 {
			debug.SetGCPercent(gc.after)
		}
		listed <- f
	}()
	go func() {
		defer wg.Done()
		runErr <- p.Run(runCtx)
	}()
	stopRun := func() {
		cancel()
		wg.Wait()
	}
	// n bench Services and the default namespace's `kubernetes`.
	for {
		st := p.Status()
		if !st.LastSuccessfulSync.IsZero() && st.Pending == 0 {
			if vss, _ := ipvs.ListVirtualServers(); len(vss) >= n+1 {
				break
			}
		}
		select {
		case err := <-runErr:
			stopRun()
			return r, fmt.Errorf("proxier stopped before its first sync: %w", err)
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			stopRun()
			return r, ctx.Err()
		}
		if time.Since(t0) > 10*time.Minute {
			stopRun()
			return r, errors.New("no complete first sync within 10 minutes")
		}
	}
	r.sync = time.Since(t0)
	lf := <-listed
	r.listed, r.listPeak, r.listRSS = lf.at, lf.peak, lf.rss
	if cpuProfile {
		pprof.StopCPUProfile()
	}
	r.peakHeap = sampler.stop()
	var err2 error
	if r.peakRSS, err2 = peakRSS(); err2 != nil {
		stopRun()
		return r, err2
	}
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	r.allocated = after.TotalAlloc - before.TotalAlloc
	if after.HeapAlloc > before.HeapAlloc {
		r.retained = after.HeapAlloc - before.HeapAlloc
	}
	r.byOwner = heapByOwner()
	if err := writeHeapProfile(r.profile); err != nil {
		stopRun()
		return r, err
	}
	stopRun()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		return r, fmt.Errorf("proxier: %w", err)
	}
	runtime.KeepAlive(ipvs)
	logf("%d Services: listed after %v (peak heap %s, peak RSS %s), first sync done after %v, peak heap %s, peak RSS %s, kept %s",
		n, r.listed.Round(time.Millisecond), mib(r.listPeak), mib(r.listRSS), r.sync.Round(time.Millisecond),
		mib(r.peakHeap), mib(r.peakRSS), mib(r.retained))
	return r, nil
}

// sampler records the peak of the heap's objects (live and not yet
// collected) every 5 ms.
type sampler struct {
	done chan struct{}
	peak chan uint64
	now  atomic.Uint64 // the peak so far
}

func startSampler() *sampler {
	s := &sampler{done: make(chan struct{}), peak: make(chan uint64, 1)}
	go func() {
		samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(samples)
			peak = max(peak, samples[0].Value.Uint64())
			s.now.Store(peak)
			select {
			case <-s.done:
				s.peak <- peak
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// peakSoFar is the peak as of the last sample.
func (s *sampler) peakSoFar() uint64 { return s.now.Load() }

func (s *sampler) stop() uint64 {
	close(s.done)
	return <-s.peak
}

// resetPeakRSS resets the process's VmHWM to its current RSS.
func resetPeakRSS() error {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset the peak RSS: %w", err)
	}
	return nil
}

var vmHWM = regexp.MustCompile(`VmHWM:\s+(\d+) kB`)

func peakRSS() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read the peak RSS: %w", err)
	}
	m := vmHWM.FindSubmatch(b)
	if m == nil {
		return 0, errors.New("read the peak RSS: no VmHWM in /proc/self/status")
	}
	kb, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return kb << 10, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// owners attribute a heap sample to the first owner that one of its frames
// names. Objects decoded from the watch stream (client-go streams the
// initial list as watch events: WatchListClient) belong to the informers.
var owners = []struct {
	name   string
	frames []string
}{
	{"fake kernel (not the agent's)", []string{"netlinkutil/fake.", "ipset/fake."}},
	{"informer caches (objects, indexes)", []string{"k8s.io/client-go/tools/cache.", "k8s.io/apimachinery/pkg/watch.",
		"k8s.io/client-go/rest/watch.", "k8s.io/api/"}},
	{"iptables glue: set entries, rules", []string{"ipvs-proxy/proxier/glue.", "ipvs-proxy/ipset."}},
	{"proxier: plans, reconciler, indexes", []string{"ipvs-proxy/proxier"}},
}

const otherOwner = "other (runtime, clients, metrics)"

// heapByOwner splits the live heap (as of the last collection, in the
// profile's samples scaled to bytes) by owner.
func heapByOwner() map[string]uint64 {
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	by := map[string]uint64{}
	rate := float64(runtime.MemProfileRate)
	for _, rec := range recs {
		inuse := rec.InUseBytes()
		if inuse <= 0 {
			continue
		}
		// Unsample as pprof does: each sample stands for 1/(1-e^(-size/rate)).
		count := rec.InUseObjects()
		size := float64(inuse) / float64(count)
		scaled := float64(inuse) / (1 - math.Exp(-size/rate))
		by[ownerOf(rec.Stack())] += uint64(scaled)
	}
	return by
}

func ownerOf(stack []uintptr) string {
	frames := runtime.CallersFrames(stack)
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !more {
			break
		}
	}
	for _, o := range owners {
		for _, n := range names {
			for _, f := range o.frames {
				if strings.Contains(n, f) {
					return o.name
				}
			}
		}
	}
	return otherOwner
}

func printResults(w *os.File, rs []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICES\tLISTED\tLISTS' PEAK HEAP\tLISTS' PEAK RSS\tFIRST SYNC\tALLOCATED\tPEAK HEAP\tPEAK RSS\tKEPT\tKEPT/SERVICE")
	for _, r := range rs {
		fmt.Fprintf(tw, "%d\t%v\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%d B\n", r.services, r.listed.Round(time.Millisecond), mib(r.listPeak),
			mib(r.listRSS), r.sync.Round(time.Millisecond), mib(r.allocated), mib(r.peakHeap), mib(r.peakRSS), mib(r.retained),
			r.retained/uint64(r.services))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	names := []string{}
	for _, o := range owners {
		names = append(names, o.name)
	}
	names = append(names, otherOwner)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "LIVE HEAP BY OWNER")
	for _, r := range rs {
		fmt.Fprintf(tw, "\t%d SERVICES\tPER SERVICE", r.services)
	}
	fmt.Fprintln(tw)
	for _, name := range names {
		fmt.Fprint(tw, name)
		for _, r := range rs {
			fmt.Fprintf(tw, "\t%s\t%d B", mib(r.byOwner[name]), r.byOwner[name]/uint64(r.services))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, r := range rs {
		fmt.Fprintf(w, "heap profile at %d Services: go tool pprof -sample_index=inuse_space %s\n", r.services, r.profile)
		fmt.Fprintf(w, "what its start and first sync allocated: go tool pprof -sample_index=alloc_space -base %s %s\n",
			r.baseProfile, r.profile)
	}
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// emptyTables stands in for iptables-nft-save and -restore: every save
// shows the built-in chains of an empty nat and filter table, every restore
// is taken. The glue writes its whole rule set on each full sync.
type emptyTables struct{}

const emptySave = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
COMMIT
`

func (emptyTables) LookPath(string) error { return nil }

func (emptyTables) Run(_ context.Context, name string, _ []string, _ []byte) ([]byte, error) {
	switch {
	case strings.HasSuffix(name, "-save"):
		return []byte(emptySave), nil
	case strings.HasSuffix(name, "-restore"):
		return nil, nil
	}
	return nil, fmt.Errorf("heapbench: no tool %s", name)
}
