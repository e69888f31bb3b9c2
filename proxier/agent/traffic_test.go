package agent

import (
	"errors"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestServiceTraffic: the per-Service series sum IPVS's counters of every
// virtual server of a Service port (here its clusterIP and its node port),
// label them namespace/service/port/protocol, leave out virtual servers no
// Service wants, follow a Service's removal, and read the kernel once per
// scrape.
func TestServiceTraffic(t *testing.T) {
	p, ipvs := newTestProxier(t)
	reg := prometheus.NewRegistry()
	if err := p.EnableServiceTraffic(ipvs, reg); err != nil {
		t.Fatal(err)
	}
	web := clusterIPService("web", "10.96.0.10")
	web.Spec.Type = corev1.ServiceTypeNodePort
	web.Spec.Ports[0].NodePort = 30080
	p.tracker.onService(web, false)
	p.tracker.onService(clusterIPService("db", "10.96.0.11"), false)
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	vs := func(a string, port uint16) ktypes.VSKey {
		return ktypes.VSKey{Address: netip.MustParseAddr(a), Protocol: ktypes.TCP, Port: port}
	}
	ipvs.SetStats(vs("10.96.0.10", 80), ktypes.Stats{Connections: 3, PacketsIn: 30, PacketsOut: 20, BytesIn: 3000, BytesOut: 9000})
	ipvs.SetStats(vs(node.String(), 30080), ktypes.Stats{Connections: 2, PacketsIn: 10, PacketsOut: 5, BytesIn: 1000, BytesOut: 500})
	ipvs.SetStats(vs("10.96.0.11", 80), ktypes.Stats{Connections: 7})
	// Another proxy's virtual server: no Service of ours, no series.
	if err := ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: vs("10.200.0.1", 80), Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	ipvs.SetStats(vs("10.200.0.1", 80), ktypes.Stats{Connections: 99})

	ipvs.ResetCalls()
	want := `
# HELP ipvs_proxy_service_connections_total Connections IPVS scheduled to the Service port's endpoints on this node (all its virtual servers: clusterIPs, node ports, external and LoadBalancer IPs).
# TYPE ipvs_proxy_service_connections_total counter
ipvs_proxy_service_connections_total{namespace="default",port="http",protocol="tcp",service="db"} 7
ipvs_proxy_service_connections_total{namespace="default",port="http",protocol="tcp",service="web"} 5
# HELP ipvs_proxy_service_bytes_total Bytes IPVS forwarded for the Service port on this node; direction in: from clients, out: replies.
# TYPE ipvs_proxy_service_bytes_total counter
ipvs_proxy_service_bytes_total{direction="in",namespace="default",port="http",protocol="tcp",service="db"} 0
ipvs_proxy_service_bytes_total{direction="in",namespace="default",port="http",protocol="tcp",service="web"} 4000
ipvs_proxy_service_bytes_total{direction="out",namespace="default",port="http",protocol="tcp",service="db"} 0
ipvs_proxy_service_bytes_total{direction="out",namespace="default",port="http",protocol="tcp",service="web"} 9500
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ipvs_proxy_service_connections_total", "ipvs_proxy_service_bytes_total"); err != nil {
		t.Error(err)
	}
	if n := slices.Index(ipvs.Calls(), fake.Call("VirtualServerStats")); n != 0 || len(ipvs.Calls()) != 1 {
		t.Errorf("a scrape called %v, want one dump of the virtual servers", ipvs.Calls())
	}

	// web loses its node port: its series keeps what the node port
	// counted (a counter never goes back), and grows by what its
	// clusterIP counts from then on.
	p.tracker.onService(clusterIPService("web", "10.96.0.10"), false)
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	ipvs.SetStats(vs("10.96.0.10", 80), ktypes.Stats{Connections: 4})
	webConns := func() float64 {
		t.Helper()
		for _, mf := range families(t, reg) {
			if mf.GetName() != "ipvs_proxy_service_connections_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "service" && l.GetValue() == "web" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatal("no connections series of web")
		return 0
	}
	if got := webConns(); got != 6 {
		t.Errorf("web's connections after its node port went and its clusterIP counted one more: %v, want 6 (5 + 1)", got)
	}

	p.tracker.onService(clusterIPService("web", "10.96.0.10"), true) // deleted
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(newServiceTraffic(ipvs, p.traffic, p.log), "ipvs_proxy_service_connections_total"); n != 1 {
		t.Errorf("%d connection series after web went, want db's alone", n)
	}
}

// TestServiceTrafficReadError: a failed dump is a scrape error, not a
// crash or a series of zeros.
func TestServiceTrafficReadError(t *testing.T) {
	p, ipvs := newTestProxier(t)
	reg := prometheus.NewRegistry()
	if err := p.EnableServiceTraffic(ipvs, reg); err != nil {
		t.Fatal(err)
	}
	ipvs.InjectErrors(func(c fake.Call) error {
		if c == "VirtualServerStats" {
			return errors.New("injected")
		}
		return nil
	})
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Errorf("Gather() = %v, want the dump's error", err)
	}
}

// BenchmarkServiceTrafficScrape is the cost of one scrape of the
// per-Service series at 10,000 Services (one port each: 50,000 series):
// the agent's part, the kernel's dump aside (the fake kernel's is a map
// copy; the VM's dump of 10,000 virtual servers is measured in the bed).
// It reports the series and the text exposition's size per scrape, and
// the index's memory per Service (what enabling the series keeps).
func BenchmarkServiceTrafficScrape(b *testing.B) {
	const n = 10000
	svcs, slices := growthObjects(n)
	p, ipvs, _ := growthProxier(svcs, slices)
	reg := prometheus.NewRegistry()
	if err := p.EnableServiceTraffic(ipvs, reg); err != nil {
		b.Fatal(err)
	}
	mustSyncOnce(b, p, true)
	// The index alone, built again from the same plans.
	plans := map[types.NamespacedName]*model.ServicePlan{}
	for name := range p.traffic.bySvc {
		plans[name] = &model.ServicePlan{Service: name}
	}
	for k, owners := range p.traffic.byVS {
		pl := plans[owners[0].svc]
		pl.VirtualServers = append(pl.VirtualServers, model.VSPlan{VirtualServer: ktypes.VirtualServer{VSKey: k}, PortName: owners[0].port})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	x := newTrafficIndex()
	for name, pl := range plans {
		x.setPlan(name, pl)
	}
	runtime.ReadMemStats(&after)
	indexBytes := after.TotalAlloc - before.TotalAlloc // allocated while built: an upper bound of what it keeps
	runtime.KeepAlive(x)
	series := 0
	b.ResetTimer()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		series = 0
		for _, mf := range mfs {
			series += len(mf.GetMetric())
		}
	}
	b.StopTimer()
	var text strings.Builder
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		_, _ = expfmt.MetricFamilyToText(&text, mf)
	}
	b.ReportMetric(float64(series), "series")
	b.ReportMetric(float64(text.Len()), "exposition-bytes")
	b.ReportMetric(float64(indexBytes)/n, "index-alloc-bytes/Service")
}
