package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/background/backgroundtest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// loopBed runs a Proxier's Run against a fake clientset, a fake kernel and
// a fake clock.
type loopBed struct {
	t      *testing.T
	client *k8sfake.Clientset
	ipvs   *fake.IPVS
	links  *fake.Links
	clk    *clocktesting.FakeClock
	p      *Proxier
}

func newLoopBed(t *testing.T, objs ...*corev1.Service) *loopBed {
	t.Helper()
	return newLoopBedWith(t, nil, objs...)
}

// newLoopBedWith is newLoopBed with the Proxier's Config changed by tweak.
func newLoopBedWith(t *testing.T, tweak func(*Config), objs ...*corev1.Service) *loopBed {
	t.Helper()
	b := &loopBed{t: t, client: k8sfake.NewClientset(), ipvs: fake.NewIPVS(), links: fake.NewLinks(node),
		clk: clocktesting.NewFakeClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))}
	ctx := context.Background()
	for _, s := range objs {
		if _, err := b.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sl := testSlice(s.Name, "10.0.1."+s.Spec.ClusterIP[len("10.96.0."):])
		if _, err := b.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, IPv4: true,
		MinSyncPeriod: time.Second, SyncPeriod: time.Hour, RetryBase: 10 * time.Second, Clock: b.clk}
	if tweak != nil {
		tweak(&cfg)
	}
	b.p = New(cfg, kubetest.New(b.client), b.ipvs, b.links, nil, nil, zap.NewNop())
	return b
}

func (b *loopBed) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.p.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				b.t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			b.t.Errorf("Run did not return")
		}
	})
}

// eventually polls cond in real time (the informers' deliveries are real).
func (b *loopBed) eventually(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s; ipvs calls: %q", what, b.ipvs.Calls())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// idle waits until the loop waits on the clock and the kernel's calls
// have stopped changing.
func (b *loopBed) idle() {
	b.t.Helper()
	n := -1
	stable := 0
	b.eventually("the loop to wait", func() bool {
		c := len(b.ipvs.Calls())
		if c == n && b.clk.HasWaiters() {
			stable++
		} else {
			stable, n = 0, c
		}
		return stable >= 10
	})
}

// calls returns the kernel calls since the last reset, with a prefix.
func (b *loopBed) calls(prefix string) []string {
	var out []string
	for _, c := range b.ipvs.Calls() {
		if strings.HasPrefix(string(c), prefix) {
			out = append(out, string(c))
		}
	}
	return out
}

func (b *loopBed) setEndpoints(svc string, addrs ...string) {
	b.t.Helper()
	sl := testSlice(svc, addrs[0])
	for _, a := range addrs[1:] {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a},
			Conditions: discoveryv1.EndpointConditions{Ready: sl.Endpoints[0].Conditions.Ready}})
	}
	if _, err := b.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), sl, metav1.UpdateOptions{}); err != nil {
		b.t.Fatal(err)
	}
}

// TestLoopRetriesAloneUnderEvents: one Service keeps failing while another
// changes all the time. Its retry comes on its own backoff (10s, 20s),
// which events never postpone; the other's changes are coalesced into
// partial syncs that go on during the backoff; and no sync after the first
// dumps the kernel. (Before the redesign, every sync after a failure was
// full, and an event dropped the retry timer.)
func TestLoopRetriesAloneUnderEvents(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"), testService("b", "10.96.0.11", "rr"))
	errBusy := errors.New("injected: busy")
	b.ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.0.10:80/TCP") {
			return errBusy
		}
		return nil
	})
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer 10.96.0.11:80/TCP")) == 1 })
	b.idle()
	start := b.clk.Now()
	sa, _ := b.p.rec.Status(types.NamespacedName{Namespace: "default", Name: "a"})
	if sa.Failures != 1 || !sa.NextRetry.Equal(start.Add(10*time.Second)) {
		t.Fatalf("status of a after the first sync: %+v", sa)
	}
	if got := b.calls("ListVirtualServers"); len(got) != 1 {
		t.Fatalf("dumps in the first sync: %v", got)
	}

	// Coalescing: three changes of b before MinSyncPeriod has passed make
	// one partial sync, with the last state.
	b.ipvs.ResetCalls()
	b.setEndpoints("b", "10.0.1.11", "10.0.2.11")
	b.setEndpoints("b", "10.0.1.11", "10.0.2.11", "10.0.3.11")
	b.setEndpoints("b", "10.0.1.11", "10.0.3.11")
	b.eventually("the informer's delivery of the last change", func() bool {
		b.p.tracker.mu.Lock()
		defer b.p.tracker.mu.Unlock()
		have := b.p.tracker.slices[types.NamespacedName{Namespace: "default", Name: "b"}]
		if len(have) != 1 || have[0].Name != "b-1" {
			return false
		}
		eps := have[0].Endpoints
		return len(eps) == 2 && eps[1].Address == netip.MustParseAddr("10.0.3.11")
	})
	b.clk.Step(time.Second)
	b.eventually("b's change", func() bool { return len(b.calls("AddRealServer 10.96.0.11:80/TCP 10.0.3.11")) == 1 })
	b.idle()
	if diff := slices.Compare(b.calls("List"), []string{"ListRealServers 10.96.0.11:80/TCP"}); diff != 0 {
		t.Errorf("reads of the coalesced partial sync: %q, want one read of b's virtual server", b.calls("List"))
	}
	if got := b.calls("AddRealServer 10.96.0.11:80/TCP 10.0.2.11"); len(got) != 0 {
		t.Errorf("an intermediate state reached the kernel: %v", got)
	}

	// Events every second; a's retries still come at 10s, then 30s.
	b.ipvs.ResetCalls()
	retries := map[time.Duration]int{}
	for i := 2; i <= 31; i++ {
		b.setEndpoints("b", "10.0.1.11", fmt.Sprintf("10.0.9.%d", i))
		b.eventually("b's change reaching the loop", func() bool {
			b.p.tracker.mu.Lock()
			defer b.p.tracker.mu.Unlock()
			return len(b.p.tracker.dirty) > 0
		})
		b.clk.Step(time.Second)
		b.eventually(fmt.Sprintf("b's change %d", i), func() bool {
			return len(b.calls(fmt.Sprintf("AddRealServer 10.96.0.11:80/TCP 10.0.9.%d", i))) == 1
		})
		b.idle()
		if n := len(b.calls("AddRealServer 10.96.0.10:80/TCP")); n > 0 {
			retries[b.clk.Since(start)] = n
			b.ipvs.ResetCalls()
		}
	}
	want := map[time.Duration]int{10 * time.Second: 1, 30 * time.Second: 1}
	if fmt.Sprint(retries) != fmt.Sprint(want) {
		t.Errorf("a's retries (time since its failure: writes) = %v, want %v", retries, want)
	}
	if got := b.calls("ListVirtualServers"); len(got) != 0 {
		t.Errorf("full dumps caused by a's failure: %v", got)
	}

	// a recovers at its next retry (70s after its first failure).
	b.ipvs.InjectErrors(nil)
	b.ipvs.ResetCalls()
	b.clk.SetTime(start.Add(70 * time.Second))
	b.eventually("a's successful retry", func() bool { return len(b.calls("AddRealServer 10.96.0.10:80/TCP")) == 1 })
	b.idle()
	if sa, _ := b.p.rec.Status(types.NamespacedName{Namespace: "default", Name: "a"}); !sa.Applied || sa.Failures != 0 {
		t.Errorf("status of a after its retry: %+v", sa)
	}
}

// TestLoopResyncInSlicesLetsChangesThrough: the periodic full resync reads
// one virtual server's real servers per sync here (ResyncSlice 1); its
// slices follow one another without waiting MinSyncPeriod, and a change
// that comes during the first slice is applied by the next sync, before
// the resync ends. (A resync in one piece applied it only after reading
// every virtual server.)
func TestLoopResyncInSlicesLetsChangesThrough(t *testing.T) {
	b := newLoopBedWith(t, func(c *Config) { c.ResyncSlice = 1 },
		testService("a", "10.96.0.10", "rr"), testService("b", "10.96.0.11", "rr"), testService("c", "10.96.0.12", "rr"))
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 3 })
	b.idle()
	b.clk.Step(time.Second) // a turn after the first sync, if one is due
	b.idle()
	b.ipvs.ResetCalls()

	// While the resync reads the kernel, c's endpoints change.
	var once sync.Once
	b.ipvs.InjectErrors(func(c fake.Call) error {
		if c == "ListAllRealServers" {
			once.Do(func() {
				b.setEndpoints("c", "10.0.1.12", "10.0.2.12")
				b.eventually("c's change reaching the loop", func() bool {
					b.p.tracker.mu.Lock()
					defer b.p.tracker.mu.Unlock()
					return len(b.p.tracker.dirty) > 0
				})
			})
		}
		return nil
	})
	b.clk.Step(time.Hour - time.Second) // the periodic resync is due; the clock stays there
	b.eventually("the resync's last slice", func() bool { return len(b.calls("ListRealServers 10.96.0.12:80/TCP")) == 1 })
	b.idle()
	got := b.calls("")
	want := []string{
		"ListVirtualServers", "ListAllRealServers", // the resync's read; slice 1 (a) is right
		"AddRealServer 10.96.0.12:80/TCP 10.0.2.12:8080 w=1", // with slice 2 (b): c's change
		"ListRealServers 10.96.0.12:80/TCP",                  // slice 3 (c), written since the read
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kernel calls of the resync (-want +got):\n%s", diff)
	}
}

// bgConsumer is a BackgroundConsumer whose periodic full sync's read is
// held until release is closed; it records its syncs.
type bgConsumer struct {
	mu      sync.Mutex
	wake    func()
	release chan struct{}
	synced  bool // its first full sync is done
	reading bool
	read    bool // a read is done and waits for a sync
	syncs   []string
}

func (c *bgConsumer) Name() string                                     { return "background" }
func (c *bgConsumer) SetPlan(types.NamespacedName, *model.ServicePlan) {}
func (c *bgConsumer) SetWake(wake func())                              { c.wake = wake }

func (c *bgConsumer) Pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read
}

func (c *bgConsumer) Sync(full bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.read:
		c.read = false
		c.syncs = append(c.syncs, "applied")
	case full && c.synced && !c.reading:
		c.reading = true
		c.syncs = append(c.syncs, "read started")
		go func() {
			<-c.release
			c.mu.Lock()
			c.reading, c.read = false, true
			c.mu.Unlock()
			c.wake()
		}()
	case full:
		c.synced = true
		c.syncs = append(c.syncs, "full")
	default:
		c.syncs = append(c.syncs, "partial")
	}
	return nil
}

func (c *bgConsumer) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.syncs)
}

// TestLoopBackgroundConsumerHoldsNoChange: a consumer's periodic full sync
// reads off the loop. While its read is held, a change goes through the
// loop to the kernel; when the read is done, the consumer's wake brings a
// sync at once (no event, no clock step) in which it applies the read.
func TestLoopBackgroundConsumerHoldsNoChange(t *testing.T) {
	b := newLoopBedWith(t, func(c *Config) { c.MinSyncPeriod = 0 },
		testService("a", "10.96.0.10", "rr"), testService("c", "10.96.0.12", "rr"))
	bg := &bgConsumer{release: make(chan struct{})}
	b.p.AddConsumer(bg)
	if bg.wake == nil {
		t.Fatal("AddConsumer gave the background consumer no wake function")
	}
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 2 })
	b.idle()
	b.clk.Step(time.Hour) // the periodic full sync
	b.eventually("the consumer's read to start", func() bool { return slices.Contains(bg.got(), "read started") })
	b.idle()
	b.ipvs.ResetCalls()

	b.setEndpoints("c", "10.0.1.12", "10.0.2.12")
	// The consumer syncs beside the reconciler: the change's sync is
	// over when both have seen it.
	b.eventually("c's change in the kernel and the consumer's sync while the read is held", func() bool {
		return len(b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.2.12:8080")) == 1 && slices.Contains(bg.got(), "partial")
	})
	close(bg.release)
	b.eventually("the read applied", func() bool { return slices.Contains(bg.got(), "applied") })
	want := []string{"full", "read started", "partial", "applied"}
	if diff := cmp.Diff(want, bg.got()); diff != "" {
		t.Errorf("the consumer's syncs (-want +got):\n%s", diff)
	}
}

// TestLoopChangeWaitsForNoHousekeepingSync: MinSyncPeriod (1s here)
// coalesces changes; a sync that carried none (here a background
// consumer's repair of its read, which comes when the read is done) does
// not hold a change up for it. The change made right after that sync is in
// the kernel at once, without the clock moving; a second change within the
// period of the first waits for it, and is coalesced with a third.
func TestLoopChangeWaitsForNoHousekeepingSync(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"), testService("c", "10.96.0.12", "rr"))
	bg := &bgConsumer{release: make(chan struct{})}
	b.p.AddConsumer(bg)
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 2 })
	b.idle()
	b.clk.Step(time.Second) // a turn after the first sync, if one is due
	b.idle()
	b.clk.Step(time.Hour - time.Second) // the periodic full sync starts the consumer's read
	b.eventually("the consumer's read to start", func() bool { return slices.Contains(bg.got(), "read started") })
	b.idle()
	b.clk.Step(2 * time.Second)
	close(bg.release) // the read is done: a sync applies it, carrying no change
	b.eventually("the read applied", func() bool { return slices.Contains(bg.got(), "applied") })
	b.idle()
	b.ipvs.ResetCalls()

	b.setEndpoints("c", "10.0.1.12", "10.0.2.12")
	b.eventually("c's change in the kernel, the clock still", func() bool {
		return len(b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.2.12:8080")) == 1
	})
	b.idle()

	// Within the period of that change's sync, two more changes: they
	// wait for it, and go in one sync.
	b.setEndpoints("c", "10.0.1.12", "10.0.3.12")
	b.setEndpoints("c", "10.0.1.12", "10.0.4.12")
	b.eventually("the last change reaching the loop", func() bool {
		b.p.tracker.mu.Lock()
		defer b.p.tracker.mu.Unlock()
		have := b.p.tracker.slices[types.NamespacedName{Namespace: "default", Name: "c"}]
		return len(have) == 1 && len(have[0].Endpoints) == 2 && have[0].Endpoints[1].Address == netip.MustParseAddr("10.0.4.12")
	})
	b.idle()
	if got := b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.4.12"); len(got) != 0 {
		t.Fatalf("a change within MinSyncPeriod of the last change's sync went at once: %q", got)
	}
	b.clk.Step(time.Second)
	b.eventually("the coalesced changes", func() bool { return len(b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.4.12")) == 1 })
	b.idle()
	if got := b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.3.12"); len(got) != 0 {
		t.Errorf("an intermediate state reached the kernel: %q", got)
	}
}

// TestLoopRepairsWhatTheKernelReportsRemoved: the full resync is an hour
// away, yet an address someone removed from the interface is bound again
// by the next partial sync (one write, no kernel read), the removal of the
// agent's own unbinding is ignored, and a removed interface is created
// again with its addresses by a full sync at once.
func TestLoopRepairsWhatTheKernelReportsRemoved(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"), testService("b", "10.96.0.11", "rr"))
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 2 })
	b.idle()
	bound := func(a string) bool { return slices.Contains(b.links.Addresses(testIface), netip.MustParseAddr(a)) }
	linkCalls := func() []string {
		var out []string
		for _, c := range b.links.Writes() {
			out = append(out, string(c))
		}
		return out
	}
	// settle lets the loop's next sync run (it waits MinSyncPeriod on the
	// fake clock) and waits for it.
	settle := func() {
		b.clk.Step(time.Second)
		b.idle()
	}

	// Someone else's `ip addr del` (linkCalls are the writes).
	if err := b.links.DeleteAddress(testIface, netip.MustParseAddr("10.96.0.10")); err != nil {
		t.Fatal(err)
	}
	b.links.ResetCalls()
	b.ipvs.ResetCalls()
	if n := b.links.Deliver(); n != 1 {
		t.Fatalf("delivered %d removals, want 1", n)
	}
	b.eventually("the removal reaching the loop", func() bool {
		b.clk.Step(time.Second)
		return bound("10.96.0.10")
	})
	b.idle()
	if diff := cmp.Diff([]string{"AddAddress ipvs-proxy0 10.96.0.10"}, linkCalls()); diff != "" {
		t.Errorf("links calls of the repair (-want +got):\n%s", diff)
	}
	if c := b.calls(""); len(c) != 0 {
		t.Errorf("IPVS calls of the repair: %q (no kernel read wanted)", c)
	}

	// The agent's own unbinding (b deleted) is announced too: ignored.
	if err := b.client.CoreV1().Services("default").Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.eventually("b's unbinding", func() bool {
		b.clk.Step(time.Second)
		return !bound("10.96.0.11")
	})
	b.idle()
	b.links.ResetCalls()
	if n := b.links.Deliver(); n != 1 {
		t.Fatalf("delivered %d removals, want 1", n)
	}
	settle()
	if c := linkCalls(); len(c) != 0 {
		t.Errorf("links calls after the agent's own removal was announced: %q", c)
	}

	// Someone's `ip link del`: the interface and its address come back.
	if err := b.links.DeleteLink(testIface); err != nil {
		t.Fatal(err)
	}
	b.links.ResetCalls()
	if n := b.links.Deliver(); n != 2 {
		t.Fatalf("delivered %d removals, want 2 (the address, the link)", n)
	}
	b.eventually("the interface created again", func() bool {
		b.clk.Step(time.Second)
		return b.links.HasLink(testIface) && bound("10.96.0.10")
	})
	b.idle()
	if c := linkCalls(); !slices.Contains(c, "EnsureDummy ipvs-proxy0") || !slices.Contains(c, "AddAddress ipvs-proxy0 10.96.0.10") {
		t.Errorf("links calls of the interface's repair: %q", c)
	}
}

// gatedIPVS is a resync reader on the fake kernel whose bulk read of real
// servers, once made, signals read and returns only when gate is closed.
type gatedIPVS struct {
	*fake.IPVS
	read chan struct{}
	gate chan struct{}
}

func (g *gatedIPVS) ListAllRealServers() (map[ktypes.VSKey][]ktypes.RealServer, error) {
	rss, err := g.IPVS.ListAllRealServers()
	g.read <- struct{}{}
	<-g.gate
	return rss, err
}

// TestLoopResyncReadOffTheLoop: with a resync reader, the periodic
// resync's kernel read runs off the loop. While it is held, an endpoint
// change and a new Service reach the kernel; once it is in, the resync
// makes no kernel call at all (what the loop wrote meanwhile keeps the
// loop's view, its real servers as its writes left them) and the loop
// never read the kernel whole itself.
func TestLoopResyncReadOffTheLoop(t *testing.T) {
	b := newLoopBedWith(t, func(c *Config) { c.MinSyncPeriod = 0 },
		testService("a", "10.96.0.10", "rr"), testService("c", "10.96.0.12", "rr"))
	g := &gatedIPVS{IPVS: b.ipvs, read: make(chan struct{}, 1), gate: make(chan struct{})}
	b.p.SetResyncReader(g, b.links)
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 2 })
	b.idle()

	b.clk.Step(time.Hour) // the periodic resync
	select {
	case <-g.read:
	case <-time.After(10 * time.Second):
		t.Fatal("the resync's read off the loop did not start")
	}
	b.ipvs.ResetCalls()
	b.setEndpoints("c", "10.0.1.12", "10.0.2.12")
	d := testService("d", "10.96.0.13", "rr")
	ctx := context.Background()
	if _, err := b.client.CoreV1().Services("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.DiscoveryV1().EndpointSlices("default").Create(ctx, testSlice("d", "10.0.1.13"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.eventually("the changes in the kernel while the read is held", func() bool {
		return len(b.calls("AddRealServer 10.96.0.12:80/TCP 10.0.2.12:8080")) == 1 &&
			len(b.calls("AddRealServer 10.96.0.13:80/TCP 10.0.1.13:8080")) == 1
	})
	b.idle()
	b.ipvs.ResetCalls()
	b.links.ResetCalls()

	close(g.gate)
	b.eventually("the resync's end", func() bool {
		var m dto.Metric
		return b.p.reporter.metrics.ResyncDuration.Write(&m) == nil && m.GetHistogram().GetSampleCount() == 1
	})
	b.idle()
	if diff := cmp.Diff([]string(nil), b.calls("")); diff != "" {
		t.Errorf("kernel calls of the resync once its read is in (-want +got):\n%s", diff)
	}
	if w := b.links.Writes(); len(w) != 0 {
		t.Errorf("address writes of the resync: %q", w)
	}
}

// TestLoopResyncReadStartsThroughBackground: the periodic resync's read
// off the loop is started by Config.Background (the agent's lower
// priority), once per resync; the first sync, in the loop, starts none.
func TestLoopResyncReadStartsThroughBackground(t *testing.T) {
	var bg backgroundtest.Counting
	b := newLoopBedWith(t, func(c *Config) { c.MinSyncPeriod, c.Background = 0, bg.Start },
		testService("a", "10.96.0.10", "rr"))
	b.p.SetResyncReader(b.ipvs, b.links)
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 1 })
	b.idle()
	if n := bg.Count(); n != 0 {
		t.Fatalf("%d reads started before the periodic resync", n)
	}
	b.clk.Step(time.Hour) // the periodic resync
	b.eventually("the resync's end", func() bool {
		var m dto.Metric
		return b.p.reporter.metrics.ResyncDuration.Write(&m) == nil && m.GetHistogram().GetSampleCount() == 1
	})
	if n := bg.Count(); n != 1 {
		t.Errorf("the resync's read started %d times through Config.Background; want 1", n)
	}
}

// TestLoopServiceWithSeveralSlices: a Service's endpoints come in two
// EndpointSlices. Both are served; a change to one keeps the other's
// endpoints; deleting one drops only its endpoints; deleting the last
// leaves the virtual server with no real servers.
func TestLoopServiceWithSeveralSlices(t *testing.T) {
	b := newLoopBed(t, testService("b", "10.96.0.11", "rr")) // slice b-1: 10.0.1.11
	ctx := context.Background()
	second := testSlice("b", "10.0.2.11")
	second.Name = "b-2"
	slicesAPI := b.client.DiscoveryV1().EndpointSlices("default")
	if _, err := slicesAPI.Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.run()
	vs := ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.11"), Protocol: ktypes.TCP, Port: 80}
	realServers := func() []string {
		rss, err := b.ipvs.ListRealServers(vs)
		if err != nil {
			return []string{err.Error()}
		}
		out := []string{}
		for _, rs := range rss {
			out = append(out, rs.RSKey.String())
		}
		slices.Sort(out)
		return out
	}
	// held waits until the Proxier holds these slices of b (by name, with
	// their first address), then lets MinSyncPeriod pass.
	held := func(want ...string) {
		t.Helper()
		b.eventually(fmt.Sprintf("the informer's delivery of %v", want), func() bool {
			b.p.tracker.mu.Lock()
			defer b.p.tracker.mu.Unlock()
			var got []string
			for _, s := range b.p.tracker.slices[types.NamespacedName{Namespace: "default", Name: "b"}] {
				got = append(got, s.Name+"="+s.Endpoints[0].Address.String())
			}
			slices.Sort(got)
			return slices.Equal(got, want)
		})
		b.clk.Step(time.Second)
	}
	expect := func(what string, want ...string) {
		t.Helper()
		b.eventually(what, func() bool { return slices.Equal(realServers(), want) })
		b.idle()
		if got := realServers(); !slices.Equal(got, want) {
			t.Fatalf("%s: real servers %v, want %v", what, got, want)
		}
	}
	expect("both slices' endpoints", "10.0.1.11:8080", "10.0.2.11:8080")

	second.Endpoints[0].Addresses = []string{"10.0.3.11"}
	if _, err := slicesAPI.Update(ctx, second, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	held("b-1=10.0.1.11", "b-2=10.0.3.11")
	expect("b-2 changed", "10.0.1.11:8080", "10.0.3.11:8080")

	// A slice relabelled to another Service leaves b, and comes back.
	moved := second.DeepCopy()
	moved.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := slicesAPI.Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	held("b-1=10.0.1.11")
	expect("b-2 relabelled to another Service", "10.0.1.11:8080")
	if _, err := slicesAPI.Update(ctx, second, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	held("b-1=10.0.1.11", "b-2=10.0.3.11")
	expect("b-2 relabelled back", "10.0.1.11:8080", "10.0.3.11:8080")

	if err := slicesAPI.Delete(ctx, "b-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	held("b-2=10.0.3.11")
	expect("b-1 deleted", "10.0.3.11:8080")

	if err := slicesAPI.Delete(ctx, "b-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	held()
	expect("both deleted")
	if vss, _ := b.ipvs.ListVirtualServers(); !slices.ContainsFunc(vss, func(v ktypes.VirtualServer) bool { return v.VSKey == vs }) {
		t.Errorf("virtual server %s gone with its last slice; want it kept with no real servers (connections refused)", vs)
	}
}

// TestLoopServiceCIDRRanges: with --route-service-cidrs and no ranges
// given, the cluster's ServiceCIDR objects are routed as local (IPv4
// only), the clusterIPs inside them are programmed without being bound,
// and a new ServiceCIDR is routed at once.
func TestLoopServiceCIDRRanges(t *testing.T) {
	b := newLoopBedWith(t, func(c *Config) { c.RouteServiceRanges = true }, testService("a", "10.96.0.10", "rr"))
	ctx := context.Background()
	scAPI := b.client.NetworkingV1().ServiceCIDRs()
	if _, err := scAPI.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:10:96::/112"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.run()
	routes := func() string {
		var out []string
		for _, r := range b.links.Routes(testIface) {
			out = append(out, r.String())
		}
		return strings.Join(out, " ")
	}
	b.eventually("the ServiceCIDR routed", func() bool { return routes() == "10.96.0.0/16" })
	b.eventually("the Service programmed", func() bool { return len(b.calls("AddRealServer 10.96.0.10:80/TCP")) > 0 })
	if got := b.links.Addresses(testIface); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.96.0.0")}) {
		t.Errorf("addresses bound under a routed range: %v, want its anchor alone", got)
	}
	if _, err := scAPI.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "more"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.eventually("the informer's delivery of the new ServiceCIDR", func() bool {
		b.p.tracker.mu.Lock()
		defer b.p.tracker.mu.Unlock()
		return len(b.p.tracker.ranges.prefixes) == 2
	})
	b.clk.Step(time.Second)
	b.eventually("the new ServiceCIDR routed", func() bool { return routes() == "10.96.0.0/16 10.97.0.0/16" })
}

// TestLoopServiceCIDRProbe: the ServiceCIDR API decides routing once it
// answers. An error of the apiserver not reachable yet is retried, and the
// range is then routed; an API not allowed (Forbidden) means binding, at
// once.
func TestLoopServiceCIDRProbe(t *testing.T) {
	for _, tc := range []struct {
		name   string
		errs   []error
		routed bool
	}{
		{"unreachable twice, then served", []error{errors.New("connection refused"), apierrors.NewServiceUnavailable("starting")}, true},
		{"forbidden", []error{apierrors.NewForbidden(networkingv1.Resource("servicecidrs"), "", errors.New("no rule"))}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newLoopBedWith(t, func(c *Config) { c.RouteServiceRanges = true }, testService("a", "10.96.0.10", "rr"))
			if _, err := b.client.NetworkingV1().ServiceCIDRs().Create(context.Background(), &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
				Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			errs, probes := slices.Clone(tc.errs), 0
			b.client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				probes++
				if len(errs) == 0 {
					return false, nil, nil
				}
				err := errs[0]
				errs = errs[1:]
				return true, nil, err
			})
			b.run()
			b.eventually("the Service programmed", func() bool { return len(b.calls("AddRealServer 10.96.0.10:80/TCP")) > 0 })
			routed := len(b.links.Routes(testIface)) > 0
			bound := slices.Contains(b.links.Addresses(testIface), netip.MustParseAddr("10.96.0.10"))
			mu.Lock()
			defer mu.Unlock()
			if routed != tc.routed || bound == tc.routed {
				t.Errorf("routed %v, clusterIP bound %v after %d lists; want routed %v", routed, bound, probes, tc.routed)
			}
			if tc.routed && probes < len(tc.errs)+1 {
				t.Errorf("%d lists, want the %d failures retried", probes, len(tc.errs))
			}
		})
	}
}

// startedConsumer tells when its first Sync begins.
type startedConsumer struct {
	once    sync.Once
	started chan struct{}
}

func (c *startedConsumer) Name() string                                     { return "started" }
func (c *startedConsumer) SetPlan(types.NamespacedName, *model.ServicePlan) {}
func (c *startedConsumer) Sync(bool) error {
	c.once.Do(func() { close(c.started) })
	return nil
}

// TestLoopConsumersSyncBesideTheReconciler: a sync's consumers run while
// the reconciler writes to the kernel, not after it. The fake kernel holds
// the reconciler's first write until a consumer's sync has begun; run one
// after the other, the write would wait in vain.
func TestLoopConsumersSyncBesideTheReconciler(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"))
	c := &startedConsumer{started: make(chan struct{})}
	b.p.AddConsumer(c)
	var mu sync.Mutex
	var waitedInVain bool
	b.ipvs.InjectErrors(func(call fake.Call) error {
		if !strings.HasPrefix(string(call), "AddVirtualServer") {
			return nil
		}
		select {
		case <-c.started:
			return nil
		case <-time.After(5 * time.Second):
			mu.Lock()
			waitedInVain = true
			mu.Unlock()
			return errors.New("no consumer's sync began while the reconciler wrote")
		}
	})
	b.run()
	b.eventually("the first sync", func() bool { return len(b.calls("AddRealServer")) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if waitedInVain {
		t.Errorf("the reconciler's write waited 5 s for a consumer's sync: they ran one after the other")
	}
}

// afterConsumer records, at each Sync, the real servers the fake kernel
// has by then.
type afterConsumer struct {
	b    *loopBed
	mu   sync.Mutex
	seen []int
}

func (c *afterConsumer) Name() string                                     { return "after" }
func (c *afterConsumer) SetPlan(types.NamespacedName, *model.ServicePlan) {}
func (c *afterConsumer) AfterReconciler()                                 {}
func (c *afterConsumer) Sync(bool) error {
	n := len(c.b.calls("AddRealServer"))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, n)
	return nil
}

// TestLoopAfterReconcilerConsumerFollowsIPVS: a consumer marked
// AfterReconciler (the health-check server) syncs once the reconciler's
// writes are done, so it never counts an endpoint IPVS does not have yet.
func TestLoopAfterReconcilerConsumerFollowsIPVS(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"))
	c := &afterConsumer{b: b}
	b.p.AddConsumer(c)
	// Hold the reconciler's real-server write a while: a consumer run
	// beside it would sync meanwhile and see none.
	b.ipvs.InjectErrors(func(call fake.Call) error {
		if strings.HasPrefix(string(call), "AddRealServer") {
			time.Sleep(200 * time.Millisecond)
		}
		return nil
	})
	b.run()
	b.eventually("the consumer's first sync", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.seen) > 0
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[0] != 1 {
		t.Errorf("the consumer's first sync saw %d real servers written, want 1: it did not follow the reconciler", c.seen[0])
	}
}

// planConsumer records the plans it was given and its syncs.
type planConsumer struct {
	mu    sync.Mutex
	plans map[types.NamespacedName]bool
	syncs int
}

func (c *planConsumer) Name() string { return "plans" }
func (c *planConsumer) SetPlan(n types.NamespacedName, p *model.ServicePlan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.plans[n] = p != nil
}
func (c *planConsumer) Sync(bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.syncs++
	return nil
}

// TestLoopPreparesBesideTheLists: the preparation (SetPrepare) runs while
// the initial lists stream in, not after them: the fake apiserver holds
// the list of Services until the preparation has begun. The first sync
// waits for it, and a consumer it adds gets every plan in that sync.
func TestLoopPreparesBesideTheLists(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"))
	began, release := make(chan struct{}), make(chan struct{})
	var waitedInVain atomic.Bool
	b.client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case <-began:
		case <-time.After(5 * time.Second):
			waitedInVain.Store(true)
		}
		return false, nil, nil
	})
	c := &planConsumer{plans: map[types.NamespacedName]bool{}}
	b.p.SetPrepare(func(context.Context) error {
		close(began)
		<-release // the lists are done by now, or soon: the sync must still wait
		b.p.AddConsumer(c)
		return nil
	})
	b.run()
	select {
	case <-b.p.Listed():
		t.Fatal("the lists were declared done before the preparation ended")
	case <-time.After(200 * time.Millisecond):
	}
	if n := len(b.ipvs.Calls()); n != 0 {
		t.Errorf("%d kernel calls before the preparation ended", n)
	}
	close(release)
	b.eventually("the Service programmed", func() bool { return len(b.calls("AddRealServer 10.96.0.10:80/TCP")) > 0 })
	b.eventually("the consumer's sync", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.syncs > 0 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.plans[types.NamespacedName{Namespace: "default", Name: "a"}] {
		t.Errorf("the consumer added by the preparation got plans %v, want default/a's", c.plans)
	}
	if waitedInVain.Load() {
		t.Error("the list of Services waited 5 s for a preparation that never began: the preparation ran after the lists")
	}
}

// TestLoopPreparationFailureEndsRun: a preparation that fails ends Run with
// its error at once, before any sync, even while the lists are not in. (The
// list of slices fails rather than blocks: the fake clientset runs its
// reactors under one lock, so a blocked list would hold every other call,
// the Node's watch too, and with it the informers' stop.)
func TestLoopPreparationFailureEndsRun(t *testing.T) {
	b := newLoopBed(t, testService("a", "10.96.0.10", "rr"))
	b.client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the apiserver is slow")
	})
	b.p.SetPrepare(func(context.Context) error { return errors.New("no ip_vs module") })
	done := make(chan error, 1)
	go func() { done <- b.p.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no ip_vs module") {
			t.Errorf("Run returned %v, want the preparation's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end after the preparation failed")
	}
	if n := len(b.ipvs.Calls()); n != 0 {
		t.Errorf("%d kernel calls after a failed preparation: %q", n, b.ipvs.Calls())
	}
}
