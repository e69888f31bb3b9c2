package agent

import (
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// The growth benchmarks (`make bench-go`) show how the agent's own work —
// building plans and reconciling them with a kernel (the fake: no netlink
// cost) — grows with the number of Services, each a ClusterIP Service with
// one port and two endpoints: per Service for a cold sync and a full
// resync that finds nothing to do, and per change for one EndpointSlice
// change, which must stay flat whatever the number of Services.

var growthSizes = []int{1_000, 10_000, 100_000}

// growthObjects makes n Services with a slice of two endpoints each.
func growthObjects(n int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	vip := netip.MustParseAddr("10.96.0.0")
	ep := netip.MustParseAddr("10.128.0.0")
	created := metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	for i := range n {
		vip = vip.Next()
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: "u", CreationTimestamp: created},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
		}
		var eps []discoveryv1.Endpoint
		for range 2 {
			ep = ep.Next()
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{ep.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		slices[i] = &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "bench", Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		}
	}
	return svcs, slices
}

// growthProxier is a Proxier on fake kernels that keep no call log, fed
// the objects through its event handlers as the informers would. The
// clock times the fakes' own work (fakeClock), which is not the agent's.
func growthProxier(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) (*Proxier, *fake.IPVS, *fakeClock) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	ipvs.KeepCalls(false)
	links.KeepCalls(false)
	clk := &fakeClock{}
	cfg := Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, IPv4: true, MinSyncPeriod: time.Second, SyncPeriod: time.Hour}
	p := New(cfg, kubetest.New(k8sfake.NewClientset()), timedIPVS{ipvs, clk}, timedLinks{links, clk}, nil, nil, zap.NewNop())
	for i := range svcs {
		p.tracker.onService(svcs[i], false)
		p.tracker.onSlice(slices[i], false)
	}
	return p, ipvs, clk
}

// fakeClock sums the time spent inside the fake kernels: their tables
// grow with the Services (at 100,000, about 2 µs per Service more than at
// 1,000, 2026-12-07), a cost of the fake, not of the agent, which a real
// kernel replaces with its own.
type fakeClock struct{ spent time.Duration }

func (c *fakeClock) since(start time.Time) { c.spent += time.Since(start) }

// timedIPVS and timedLinks time the fakes' calls a sync makes many of or
// that grow with the Services (the writes, in batches, and the reads).
type timedIPVS struct {
	*fake.IPVS
	clk *fakeClock
}

func (t timedIPVS) Apply(writes []netlinkutil.Write) []error {
	defer t.clk.since(time.Now())
	return t.IPVS.Apply(writes)
}

func (t timedIPVS) ListVirtualServers() ([]ktypes.VirtualServer, error) {
	defer t.clk.since(time.Now())
	return t.IPVS.ListVirtualServers()
}

func (t timedIPVS) ListAllRealServers() (map[ktypes.VSKey][]ktypes.RealServer, error) {
	defer t.clk.since(time.Now())
	return t.IPVS.ListAllRealServers()
}

type timedLinks struct {
	*fake.Links
	clk *fakeClock
}

func (t timedLinks) AddAddress(link string, addr netip.Addr) error {
	defer t.clk.since(time.Now())
	return t.Links.AddAddress(link, addr)
}

func (t timedLinks) ListAddresses(link string) ([]netip.Addr, error) {
	defer t.clk.since(time.Now())
	return t.Links.ListAddresses(link)
}

func mustSyncOnce(b *testing.B, p *Proxier, full bool) {
	if err := p.SyncOnce(full); err != nil {
		b.Fatal(err)
	}
}

// reportPerService reports the time per Service of b's syncs of n
// Services: in all (ns/service), without the part spent inside the fake
// kernels (agent-ns/service), the agent's own, and the process's CPU time
// (cpu-ns/service: the sync's and the collector's threads, the fakes'
// too), which a busy machine inflates less than the others.
func reportPerService(b *testing.B, n int, inFakes, cpu time.Duration) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / float64(n) }
	b.ReportMetric(per(b.Elapsed()), "ns/service")
	b.ReportMetric(per(b.Elapsed()-inFakes), "agent-ns/service")
	b.ReportMetric(per(cpu), "cpu-ns/service")
}

// processCPU is the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkGrowthColdSync: the first sync of n Services into an empty
// kernel (plans built, every virtual server, real server and address
// written). Also reports the heap the agent keeps per Service afterwards
// (plans, the reconciler's indexes; not the objects, which the informers'
// caches would hold).
func BenchmarkGrowthColdSync(b *testing.B) {
	for _, n := range growthSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := growthObjects(n)
			var kept uint64
			var inFakes, cpu time.Duration
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				base := heapInUse()
				p, ipvs, clk := growthProxier(svcs, slices)
				b.StartTimer()
				cpu0 := processCPU(b)
				mustSyncOnce(b, p, true)
				cpu += processCPU(b) - cpu0
				b.StopTimer()
				if _, writes := ipvs.Counts(); writes != 3*n {
					b.Fatalf("cold sync made %d IPVS writes, want %d", writes, 3*n)
				}
				kept = heapInUse() - base
				inFakes += clk.spent
				runtime.KeepAlive(p)
				b.StartTimer()
			}
			reportPerService(b, n, inFakes, cpu)
			b.ReportMetric(float64(kept)/float64(n), "kept-B/service")
		})
	}
}

// BenchmarkGrowthResync: a full resync of n programmed Services that finds
// nothing to change (every plan rebuilt, the kernel read and compared).
func BenchmarkGrowthResync(b *testing.B) {
	for _, n := range growthSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := growthObjects(n)
			p, ipvs, clk := growthProxier(svcs, slices)
			mustSyncOnce(b, p, true)
			_, before := ipvs.Counts()
			clk.spent = 0
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				mustSyncOnce(b, p, true)
			}
			cpu := processCPU(b) - cpu0
			if _, after := ipvs.Counts(); after != before {
				b.Fatalf("resyncs made %d IPVS writes, want 0", after-before)
			}
			reportPerService(b, n, clk.spent, cpu)
		})
	}
}

// BenchmarkGrowthChange: one EndpointSlice change (an endpoint replaced)
// among n programmed Services, synced partially: its cost should not
// depend on n.
func BenchmarkGrowthChange(b *testing.B) {
	for _, n := range growthSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := growthObjects(n)
			p, ipvs, _ := growthProxier(svcs, slices)
			mustSyncOnce(b, p, true)
			// Two versions of one slice, alternated: each sync replaces
			// one real server.
			changed := slices[n/2].DeepCopy()
			changed.Endpoints[0].Addresses = []string{"10.255.0.1"}
			versions := []*discoveryv1.EndpointSlice{changed, slices[n/2]}
			_, before := ipvs.Counts()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p.tracker.onSlice(versions[i%2], false)
				mustSyncOnce(b, p, false)
				i++
			}
			if _, after := ipvs.Counts(); after-before != 2*i {
				b.Fatalf("%d changes made %d IPVS writes, want %d (one add and one delete each)", i, after-before, 2*i)
			}
		})
	}
}

// maxNodePorted is the NodePort Services of BenchmarkGrowthAddressChange
// at most: one TCP node port each, within 30000-32767.
const maxNodePorted = 2700

// BenchmarkGrowthAddressChange: a node address added, then removed (each
// an iteration), among n programmed Services of which two in three are
// NodePort Services (maxNodePorted at most: from 10,000 Services on, the
// same rebuild among more Services), synced partially with the iptables
// glue (benchGlue) as the agent runs them: each change rebuilds every
// Service with a node port (their virtual servers on the address come or
// go), the costliest partial sync a node sees (issue 45's case 4). Per
// rebuilt Service: the same measures as the cold sync.
func BenchmarkGrowthAddressChange(b *testing.B) {
	for _, n := range growthSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := growthObjects(n)
			nodePorted := 0
			for i, s := range svcs {
				if i%3 != 0 && nodePorted < maxNodePorted {
					s.Spec.Type = corev1.ServiceTypeNodePort
					s.Spec.Ports[0].NodePort = int32(30000 + nodePorted)
					nodePorted++
				}
			}
			p, ipvs, clk := growthProxier(svcs, slices)
			links := p.links.(timedLinks).Links
			p.AddConsumer(benchGlue(b, glue.Config{}, ipsetfake.New(), links, zap.NewNop()))
			mustSyncOnce(b, p, true)
			extra := netip.MustParseAddr("192.168.0.241")
			clk.spent = 0
			var cpu time.Duration
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				addrs, want := []netip.Addr{node, extra}, 3*nodePorted // a virtual server and its two real servers each
				if i%2 == 1 {
					addrs, want = []netip.Addr{node}, nodePorted // the virtual servers go with their real servers
				}
				_, before := ipvs.Counts()
				links.SetNodeAddresses(addrs...)
				p.tracker.nodeAddressesChanged()
				cpu0 := processCPU(b)
				syncUntilWritten(b, p, ipvs, before+want)
				cpu += processCPU(b) - cpu0
				i++
			}
			reportPerService(b, nodePorted, clk.spent, cpu)
		})
	}
}

// syncUntilWritten syncs p partially until ipvs has made want writes in
// all (a backlog goes in bounded syncs), and fails past it or after 1,000
// syncs.
func syncUntilWritten(b *testing.B, p *Proxier, ipvs *fake.IPVS, want int) {
	for range 1000 {
		mustSyncOnce(b, p, false)
		if _, writes := ipvs.Counts(); writes >= want {
			if writes > want {
				b.Fatalf("%d IPVS writes in all, want %d", writes, want)
			}
			return
		}
	}
	_, writes := ipvs.Counts()
	b.Fatalf("%d IPVS writes in all after 1,000 syncs, want %d", writes, want)
}
