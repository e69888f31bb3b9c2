package agent

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// newMetricsProxier is a Proxier on a fake kernel and a fake clock whose
// metrics are registered with the registry it returns.
func newMetricsProxier(t *testing.T, resyncSlice int) (*Proxier, *prometheus.Registry, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	cfg := Config{NodeName: "n1", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"}, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		IPv4: true, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute, Clock: clk, ResyncSlice: resyncSlice}
	return New(cfg, nil, fake.NewIPVS(), fake.NewLinks(node), nil, NewMetrics(reg), zap.NewNop()), reg, clk
}

// families gathers reg's metric families by name.
func families(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// histogramOf is the sample count and sum of the unlabelled histogram name.
func histogramOf(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mf, ok := families(t, reg)[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	h := mf.GetMetric()[0].GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// kubeProxySyncBuckets and kubeProxyProgrammingBuckets are kube-proxy's
// buckets, written out as k8s.io/kubernetes/pkg/proxy/metrics (v1.36)
// defines them: ExponentialBuckets(0.001, 2, 15) for the sync durations;
// MergeBuckets of LinearBuckets(0.25, 0.25, 2), (1, 1, 59), (60, 5, 12)
// and (120, 30, 7) for the network programming latency.
func kubeProxySyncBuckets() []float64 {
	var b []float64
	for i := range 15 {
		b = append(b, 0.001*math.Pow(2, float64(i)))
	}
	return b
}

func kubeProxyProgrammingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	for s := 1; s <= 59; s++ {
		b = append(b, float64(s))
	}
	for s := 60; s <= 115; s += 5 {
		b = append(b, float64(s))
	}
	for s := 120; s <= 300; s += 30 {
		b = append(b, float64(s))
	}
	return b
}

// TestMetricsKubeProxyHistograms: the histograms under kube-proxy's names
// have kube-proxy's buckets and no label (kube-proxy's ip_family has no
// counterpart: one sync programs both families), and every one is
// exported before its first observation.
func TestMetricsKubeProxyHistograms(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	fams := families(t, reg)
	for name, want := range map[string][]float64{
		"kubeproxy_sync_proxy_rules_duration_seconds":         kubeProxySyncBuckets(),
		"kubeproxy_sync_full_proxy_rules_duration_seconds":    kubeProxySyncBuckets(),
		"kubeproxy_sync_partial_proxy_rules_duration_seconds": kubeProxySyncBuckets(),
		"kubeproxy_network_programming_duration_seconds":      kubeProxyProgrammingBuckets(),
	} {
		mf, ok := fams[name]
		if !ok {
			t.Errorf("no metric %s", name)
			continue
		}
		if mf.GetType() != dto.MetricType_HISTOGRAM || len(mf.GetMetric()) != 1 {
			t.Errorf("%s: %v with %d series, want one histogram", name, mf.GetType(), len(mf.GetMetric()))
			continue
		}
		m := mf.GetMetric()[0]
		if len(m.GetLabel()) != 0 {
			t.Errorf("%s has labels %v", name, m.GetLabel())
		}
		var got []float64
		for _, b := range m.GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s buckets (-kube-proxy's +got):\n%s", name, diff)
		}
	}
	if got := kubeProxyProgrammingBuckets(); got[len(got)-1] != 300 || len(got) != 80 {
		t.Errorf("kube-proxy's programming buckets: %d up to %v, want 80 up to 5 minutes", len(got), got[len(got)-1])
	}
	if _, ok := fams["ipvs_proxy_resync_duration_seconds"]; !ok {
		t.Error("no metric ipvs_proxy_resync_duration_seconds")
	}
}

// TestMetricsSyncDurations: every sync goes into
// kubeproxy_sync_proxy_rules_duration_seconds and into the full or the
// partial one by its kind; a whole sliced periodic resync, which spans
// several syncs, goes only into ipvs_proxy_resync_duration_seconds.
func TestMetricsSyncDurations(t *testing.T) {
	p, reg, clk := newMetricsProxier(t, 1)
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	p.tracker.onService(clusterIPService("b", "10.96.0.11"), false)
	if err := p.SyncOnce(true); err != nil { // cold: full, read in the loop
		t.Fatal(err)
	}
	p.tracker.onService(clusterIPService("c", "10.96.0.12"), false)
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	counts := func() []uint64 {
		var out []uint64
		for _, n := range []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_full_proxy_rules_duration_seconds",
			"kubeproxy_sync_partial_proxy_rules_duration_seconds", "ipvs_proxy_resync_duration_seconds"} {
			c, _ := histogramOf(t, reg, n)
			out = append(out, c)
		}
		return out
	}
	if diff := cmp.Diff([]uint64{2, 1, 1, 0}, counts()); diff != "" {
		t.Fatalf("samples of all, full, partial syncs and resyncs after a cold sync and a change (-want +got):\n%s", diff)
	}

	// The periodic resync: its first sync reads the kernel (full), then one
	// virtual server per sync (partial), a second apart.
	syncs := 0
	for full := true; ; full = false {
		if err := p.SyncOnce(full); err != nil {
			t.Fatal(err)
		}
		syncs++
		if n, _ := histogramOf(t, reg, "ipvs_proxy_resync_duration_seconds"); n > 0 || syncs == 10 {
			break
		}
		clk.Step(time.Second)
	}
	if syncs != 3 {
		t.Fatalf("the resync of 3 virtual servers, one a sync, took %d syncs", syncs)
	}
	if diff := cmp.Diff([]uint64{2 + 3, 1 + 1, 1 + 2, 1}, counts()); diff != "" {
		t.Errorf("samples of all, full, partial syncs and resyncs after a resync (-want +got):\n%s", diff)
	}
	if _, sum := histogramOf(t, reg, "ipvs_proxy_resync_duration_seconds"); sum != 2 {
		t.Errorf("the resync took %vs, want 2s (three syncs a second apart)", sum)
	}
	if _, sum := histogramOf(t, reg, "kubeproxy_sync_proxy_rules_duration_seconds"); sum != 0 {
		t.Errorf("the syncs took %vs in all, want 0 (the fake clock stands still during each)", sum)
	}
}

// value is the value of the unlabelled counter or gauge name, which must
// be of that type.
func value(t *testing.T, reg *prometheus.Registry, name string, typ dto.MetricType) float64 {
	t.Helper()
	mf, ok := families(t, reg)[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	if mf.GetType() != typ || len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 0 {
		t.Fatalf("%s: %v with %d series, want one unlabelled %v", name, mf.GetType(), len(mf.GetMetric()), typ)
	}
	if typ == dto.MetricType_COUNTER {
		return mf.GetMetric()[0].GetCounter().GetValue()
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

// changeFigures are kube-proxy's change metrics as the tracker sets them.
type changeFigures struct {
	ServiceTotal, ServicePending, EndpointTotal, EndpointPending float64
}

func changesOf(t *testing.T, reg *prometheus.Registry) changeFigures {
	t.Helper()
	return changeFigures{
		ServiceTotal:    value(t, reg, "kubeproxy_sync_proxy_rules_service_changes_total", dto.MetricType_COUNTER),
		ServicePending:  value(t, reg, "kubeproxy_sync_proxy_rules_service_changes_pending", dto.MetricType_GAUGE),
		EndpointTotal:   value(t, reg, "kubeproxy_sync_proxy_rules_endpoint_changes_total", dto.MetricType_COUNTER),
		EndpointPending: value(t, reg, "kubeproxy_sync_proxy_rules_endpoint_changes_pending", dto.MetricType_GAUGE),
	}
}

// TestMetricsChanges: every Service and EndpointSlice change received
// counts in kube-proxy's change totals; the pending figures count the
// Services changed and the EndpointSlice changes since the last sync took
// them, and drop to 0 when one does; each change sets
// kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds, which stays
// above kubeproxy_sync_proxy_rules_last_timestamp_seconds until a sync
// applies it.
func TestMetricsChanges(t *testing.T) {
	p, reg, clk := newMetricsProxier(t, 0)
	const queued, synced = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	if got := changesOf(t, reg); got != (changeFigures{}) {
		t.Fatalf("fresh proxier: %+v", got)
	}
	if v := value(t, reg, queued, dto.MetricType_GAUGE); v != 0 {
		t.Fatalf("%s = %v before any change", queued, v)
	}

	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false)
	p.tracker.onService(clusterIPService("a", "10.96.0.10"), false) // an update of the same Service
	p.tracker.onService(clusterIPService("b", "10.96.0.11"), false)
	p.tracker.onSlice(testSlice("a", "10.0.1.1"), false)
	clk.Step(1500 * time.Millisecond)
	p.tracker.onSlice(testSlice("a", "10.0.1.2"), false)
	want := changeFigures{ServiceTotal: 3, ServicePending: 2, EndpointTotal: 2, EndpointPending: 2}
	if diff := cmp.Diff(want, changesOf(t, reg)); diff != "" {
		t.Errorf("after 3 Service changes (2 Services) and 2 slice changes (-want +got):\n%s", diff)
	}
	last := unixSeconds(clk.Now())
	if v := value(t, reg, queued, dto.MetricType_GAUGE); v != last || v != 1795428001.5 {
		t.Errorf("%s = %v, want the last change's time %v", queued, v, last)
	}

	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	want.ServicePending, want.EndpointPending = 0, 0
	if diff := cmp.Diff(want, changesOf(t, reg)); diff != "" {
		t.Errorf("after the sync took the changes (-want +got):\n%s", diff)
	}
	if q, s := value(t, reg, queued, dto.MetricType_GAUGE), value(t, reg, synced, dto.MetricType_GAUGE); q != last || s < q {
		t.Errorf("after the sync: queued %v, synced %v; want queued %v, synced no earlier", q, s, last)
	}

	// A deletion is a change too; until a sync takes it, last queued is
	// later than the last sync.
	clk.Step(time.Second)
	del := testSlice("a", "10.0.1.2")
	p.tracker.onSlice(del, true)
	p.tracker.onService(clusterIPService("b", "10.96.0.11"), true)
	want = changeFigures{ServiceTotal: 4, ServicePending: 1, EndpointTotal: 3, EndpointPending: 1}
	if diff := cmp.Diff(want, changesOf(t, reg)); diff != "" {
		t.Errorf("after deleting a slice and a Service (-want +got):\n%s", diff)
	}
	if q, s := value(t, reg, queued, dto.MetricType_GAUGE), value(t, reg, synced, dto.MetricType_GAUGE); q <= s {
		t.Errorf("a change waits: queued %v, synced %v; want queued later", q, s)
	}
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	want.ServicePending, want.EndpointPending = 0, 0
	if diff := cmp.Diff(want, changesOf(t, reg)); diff != "" {
		t.Errorf("after the second sync (-want +got):\n%s", diff)
	}
	if q, s := value(t, reg, queued, dto.MetricType_GAUGE), value(t, reg, synced, dto.MetricType_GAUGE); s < q {
		t.Errorf("after the second sync: queued %v, synced %v; want synced no earlier", q, s)
	}
}

// TestBuildInfo: ipvs_proxy_build_info is 1, labelled by the version and
// revision given and the Go release that built the test.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg, "v1.2.3", "0123abc")
	ms := families(t, reg)["ipvs_proxy_build_info"].GetMetric()
	if len(ms) != 1 {
		t.Fatalf("ipvs_proxy_build_info: %d series, want 1", len(ms))
	}
	if got, want := labelsOf(ms[0]), "goversion="+runtime.Version()+",revision=0123abc,version=v1.2.3"; got != want {
		t.Errorf("ipvs_proxy_build_info labels %s, want %s", got, want)
	}
	if v := ms[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("ipvs_proxy_build_info = %v, want 1", v)
	}
}
