package agent

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	discoveryv1 "k8s.io/api/discovery/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// BenchmarkBusyChange (`make bench-busy`): one EndpointSlice change's
// latency, from the tracker's event to the kernel's write of the new real
// server, at 10,000 Services × 2 endpoints with the iptables glue, on fake
// kernels that take time (busyLatency), through the sync loop as it runs.
// Idle: the loop has nothing else to do. Busy: the change comes while a
// periodic full resync (its read off the loop, then its slices) and the
// glue's check (every set and the rules read off the loop, then the
// repair) run; each busy change is made at another point of that work,
// spread over the whole of it. The ratio of the busy figures to the idle
// ones is measured in one run, an idle change and a busy one in turn, so
// that both meet the same load of the machine.
func BenchmarkBusyChange(b *testing.B) {
	const services, rounds = 10_000, 50
	for b.Loop() {
		bed := newBusyBed(b, services)
		bed.start()
		window := bed.busyWindow()
		var idle, busy []time.Duration
		for i := range rounds {
			idle = append(idle, bed.change())
			bed.startBusy()
			time.Sleep(window * time.Duration(i) / rounds)
			busy = append(busy, bed.change())
			bed.waitIdle()
		}
		bed.stop()
		reportLatencies(b, "idle", idle)
		reportLatencies(b, "busy", busy)
		b.ReportMetric(float64(quantile(busy, 0.5))/float64(quantile(idle, 0.5)), "busy/idle-p50")
		b.ReportMetric(float64(slices.Max(busy))/float64(slices.Max(idle)), "busy/idle-max")
		b.Logf("%d Services × 2: one change idle p50 %v p90 %v max %v; during a resync and a glue check (%v of work) p50 %v p90 %v max %v",
			services, quantile(idle, 0.5), quantile(idle, 0.9), slices.Max(idle), window,
			quantile(busy, 0.5), quantile(busy, 0.9), slices.Max(busy))
		b.Logf("the loop's longest syncs while busy: %s", bed.longestSyncs(5))
	}
}

// busyLatency is a kernel about ten times as fast as the bed's emulated
// one (e2e/README.md, docs/test-bed-facts): a dump of 10,000 virtual
// servers 30 ms, of 20,000 real servers 30 ms, of 10,000 addresses 20 ms,
// of a set of 10,000 entries 200 ms; a write batch 50 µs plus 2 µs a
// write.
func busyLatency(call string, n int) time.Duration {
	per := map[string]time.Duration{
		"ListVirtualServers": 3 * time.Microsecond, "ListAllRealServers": 1500 * time.Nanosecond,
		"NodeAddresses": 2 * time.Microsecond, "ListAddresses": 2 * time.Microsecond,
		"List": 20 * time.Microsecond,
	}
	if d, ok := per[call]; ok {
		return time.Duration(n) * d
	}
	return 50*time.Microsecond + time.Duration(n)*2*time.Microsecond
}

// busyBed is a Proxier with the glue on slow fake kernels, its loop run
// with a fake clock (whose step starts a periodic resync) and the bench's
// min period between syncs (busyMinPeriod), and the writes watched for
// one real server.
type busyBed struct {
	b       testing.TB
	clk     *busyClock
	p       *Proxier
	logs    *observer.ObservedLogs
	cancel  context.CancelFunc
	done    chan struct{}
	applied chan netip.Addr
	// The change: one slice's two versions, alternated, and the real
	// server each adds.
	versions []*discoveryv1.EndpointSlice
	adds     []netip.Addr
	n        int
	// resyncs counts the periodic resyncs started.
	resyncs int
}

// busyPeriod is the periodic sync's, stepped by hand; busyMinPeriod the
// bench's agent's (e2e/cmd/bench: --min-sync-period 100ms), waited in
// real time.
const busyPeriod, busyMinPeriod = time.Hour, 100 * time.Millisecond

// benchGlue is the benchmarks' iptables glue on cfg (its clock): IPv4,
// the pods' 10.244.0.0/16, its sets on sets and its rules on a fake
// iptables-restore (savedRules).
func benchGlue(b testing.TB, cfg glue.Config, sets *ipsetfake.Sets, links *fake.Links, log *zap.Logger) *glue.Glue {
	ipt, err := glue.NewIPTables(&savedRules{}, glue.NFT, ipset.IPv4)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Interface, cfg.ClusterCIDRs, cfg.IPv4 = testIface, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, true
	return glue.New(cfg, sets, map[ipset.Family]*glue.IPTables{ipset.IPv4: ipt}, links, log)
}

func newBusyBed(b testing.TB, n int) *busyBed {
	svcs, slcs := growthObjects(n)
	bed := &busyBed{b: b, clk: &busyClock{FakeClock: clocktesting.NewFakeClock(time.Now())},
		applied: make(chan netip.Addr, 16), done: make(chan struct{})}
	ipvs, links, sets := fake.NewIPVS(), fake.NewLinks(node), ipsetfake.New()
	ipvs.KeepCalls(false)
	links.KeepCalls(false)
	core, logs := observer.New(zapcore.DebugLevel)
	bed.logs = logs
	cfg := Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, IPv4: true, MinSyncPeriod: busyMinPeriod, SyncPeriod: busyPeriod,
		Clock: bed.clk}
	watched := &watchedIPVS{IPVS: ipvs, added: bed.applied}
	bed.p = New(cfg, kubetest.New(k8sfake.NewClientset()), watched, links, nil, nil, zap.New(core))
	bed.p.SetResyncReader(ipvs, links)
	bed.p.AddConsumer(benchGlue(b, glue.Config{Clock: bed.clk}, sets, links, zap.New(core)))
	for i := range svcs {
		bed.p.tracker.onService(svcs[i], false)
		bed.p.tracker.onSlice(slcs[i], false)
	}
	changed := slcs[n/2].DeepCopy()
	changed.Endpoints[0].Addresses = []string{"10.255.0.1"}
	bed.versions = []*discoveryv1.EndpointSlice{changed, slcs[n/2]}
	bed.adds = []netip.Addr{netip.MustParseAddr("10.255.0.1"), netip.MustParseAddr(slcs[n/2].Endpoints[0].Addresses[0])}
	watched.watch = bed.adds
	for _, f := range []interface{ SetLatency(fake.LatencyFunc) }{ipvs, links} {
		f.SetLatency(busyLatency)
	}
	sets.SetLatency(busyLatency)
	return bed
}

// start runs the loop and waits for the first sync.
func (bed *busyBed) start() {
	ctx, cancel := context.WithCancel(context.Background())
	bed.cancel = cancel
	go func() {
		defer close(bed.done)
		bed.p.runner.run(ctx, bed.p, bed.p.rec)
	}()
	bed.waitLog("synced", 1)
}

func (bed *busyBed) stop() {
	bed.cancel()
	<-bed.done
}

// change makes one change and returns the time it took to reach the
// kernel.
func (bed *busyBed) change() time.Duration {
	v := bed.n % 2
	bed.n++
	start := time.Now()
	bed.p.tracker.onSlice(bed.versions[v], false)
	for a := range bed.applied {
		if a == bed.adds[v] {
			break
		}
	}
	return time.Since(start)
}

// startBusy steps the clock to the periodic sync: the loop starts a full
// resync, whose adoption starts the glue's check.
func (bed *busyBed) startBusy() {
	for !bed.clk.HasWaiters() { // a timer made after the step would not fire
		time.Sleep(100 * time.Microsecond)
	}
	bed.resyncs++
	bed.clk.Step(busyPeriod)
}

// busyWindow times one resync and glue check, from the clock's step until
// both are done.
func (bed *busyBed) busyWindow() time.Duration {
	start := time.Now()
	bed.startBusy()
	bed.waitIdle()
	return time.Since(start)
}

// waitIdle waits until every resync started has completed and the glue has
// applied as many checks.
func (bed *busyBed) waitIdle() {
	bed.waitLog("full resync complete", bed.resyncs)
	bed.waitLog("iptables glue checked", bed.resyncs)
}

func (bed *busyBed) waitLog(msg string, n int) {
	deadline := time.Now().Add(time.Minute)
	for bed.logs.FilterMessage(msg).Len() < n {
		if time.Now().After(deadline) {
			bed.b.Fatalf("waited a minute for %d log lines %q", n, msg)
		}
		time.Sleep(time.Millisecond)
	}
}

// longestSyncs lists the loop's n longest syncs as their log lines give
// them.
func (bed *busyBed) longestSyncs(n int) string {
	type sync struct {
		took   time.Duration
		fields map[string]any
	}
	var all []sync
	for _, e := range bed.logs.FilterMessage("synced").All() {
		m := e.ContextMap()
		if d, ok := m["took"].(time.Duration); ok {
			all = append(all, sync{d, m})
		}
	}
	slices.SortFunc(all, func(a, b sync) int { return int(b.took - a.took) })
	var parts []string
	for _, s := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%v (%s, ipvs %v, consumers %v, services %v)", s.took, s.fields["kind"],
			s.fields["ipvs"], s.fields["consumers"], s.fields["services"]))
	}
	return strings.Join(parts, "; ")
}

// busyClock reads the real time, so that the agent's logs time its syncs
// truly, and steps it by hand to fire the periodic sync's timer, which is
// the fake clock's; shorter timers (the min period) are real.
type busyClock struct {
	*clocktesting.FakeClock
	mu   sync.Mutex
	skew time.Duration
}

func (c *busyClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.skew)
}

func (c *busyClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// NewTimer is a real timer for waits shorter than the periodic sync's.
func (c *busyClock) NewTimer(d time.Duration) clock.Timer {
	if d < busyPeriod/2 {
		return clock.RealClock{}.NewTimer(d)
	}
	return c.FakeClock.NewTimer(d)
}

// Step moves the time on by d and fires the timers due by then.
func (c *busyClock) Step(d time.Duration) {
	c.mu.Lock()
	c.skew += d
	c.mu.Unlock()
	c.FakeClock.Step(d)
}

// watchedIPVS tells of each watched real server that a write added.
type watchedIPVS struct {
	netlinkutil.IPVS
	watch []netip.Addr
	added chan<- netip.Addr
}

func (w *watchedIPVS) Apply(writes []netlinkutil.Write) []error {
	errs := w.IPVS.Apply(writes)
	for i, wr := range writes {
		if wr.Kind == ktypes.OpAddRealServer && errs[i] == nil && slices.Contains(w.watch, wr.RealServer.Address) {
			w.added <- wr.RealServer.Address
		}
	}
	return errs
}

// savedRules stands in for iptables-nft-save and -restore: a save shows
// the glue's own rules and nothing else, 10 ms each; a restore takes
// 20 ms and changes nothing (the glue finds its rules in place and runs
// none after its first sync).
type savedRules struct {
	mu    sync.Mutex
	saved string
}

func (*savedRules) LookPath(string) error { return nil }

func (s *savedRules) Run(_ context.Context, name string, _ []string, _ []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case strings.HasSuffix(name, "-save"):
		time.Sleep(10 * time.Millisecond)
		if s.saved == "" {
			s.saved = savedText(glue.Rules(glue.RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}))
		}
		return []byte(s.saved), nil
	case strings.HasSuffix(name, "-restore"):
		time.Sleep(20 * time.Millisecond)
		return nil, nil
	}
	return nil, fmt.Errorf("no tool %s", name)
}

// savedText renders tables as iptables-save prints them on a node with
// nothing else: the rule dump with its inserts appended, after the
// built-in chains.
func savedText(tables []glue.Table) string {
	builtins := map[string]string{"nat": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
		"filter": ":INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"}
	out := glue.Dump(tables)
	for name, chains := range builtins {
		out = strings.Replace(out, "*"+name+"\n", "*"+name+"\n"+chains, 1)
	}
	return regexp.MustCompile(`(?m)^-I (\S+) 1 `).ReplaceAllString(out, "-A $1 ")
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func reportLatencies(b *testing.B, name string, ds []time.Duration) {
	b.ReportMetric(float64(quantile(ds, 0.5).Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(quantile(ds, 0.9).Microseconds())/1000, name+"-p90-ms")
	b.ReportMetric(float64(slices.Max(ds).Microseconds())/1000, name+"-max-ms")
}
