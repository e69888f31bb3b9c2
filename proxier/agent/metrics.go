package agent

import (
	"runtime"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the proxier's Prometheus metrics. Names follow kube-proxy's
// (k8s.io/kubernetes/pkg/proxy/metrics) where one means the same thing,
// with kube-proxy's buckets (kubeproxy_*); the rest are ipvs-proxy's own
// (ipvs_proxy_*). kube-proxy labels its metrics by ip_family, one proxier
// per family; ipvs-proxy syncs both families at once and has no such label.
type Metrics struct {
	// SyncDuration is every sync that applied something, full or partial;
	// FullSyncDuration and PartialSyncDuration split it.
	SyncDuration        prometheus.Histogram
	FullSyncDuration    prometheus.Histogram
	PartialSyncDuration prometheus.Histogram
	// ResyncDuration is a whole periodic resync, from its kernel read to
	// the sync that checked its last slice (several syncs).
	ResyncDuration     prometheus.Histogram
	ProgrammingLatency prometheus.Histogram
	// LastQueued is when the last Service or EndpointSlice change asked
	// for a sync; LastSuccessfulSync, when a sync last succeeded.
	LastQueued         prometheus.Gauge
	LastSuccessfulSync prometheus.Gauge
	// The changes received, and those received since the last sync took
	// the changes: Services (each changed Service once) and EndpointSlice
	// events.
	ServiceChanges, EndpointChanges               prometheus.Counter
	ServiceChangesPending, EndpointChangesPending prometheus.Gauge
	SyncErrors                                    prometheus.Counter
	VirtualServers                                prometheus.Gauge
	RealServers                                   prometheus.Gauge
	WritesPerSync                                 prometheus.Histogram
	ServicesWithWarning                           prometheus.Gauge
	ServicesFailing                               prometheus.Gauge
	ServicesInConflict                            prometheus.Gauge
	ServiceFailures                               prometheus.Counter
	// NodeSyncFailing is 1 for each node-wide part whose last sync failed
	// (Status.Failing).
	NodeSyncFailing *prometheus.GaugeVec
}

// syncBuckets are kube-proxy's buckets of its sync durations: 1 ms to
// 16.4 s, doubling.
func syncBuckets() []float64 { return prometheus.ExponentialBuckets(0.001, 2, 15) }

// programmingBuckets are kube-proxy's buckets of the network programming
// latency: 0.25 s, 0.5 s, every second to 59 s, every 5 s to 115 s, every
// 30 s to 5 minutes.
func programmingBuckets() []float64 {
	return slices.Concat(
		prometheus.LinearBuckets(0.25, 0.25, 2),
		prometheus.LinearBuckets(1, 1, 59),
		prometheus.LinearBuckets(60, 5, 12),
		prometheus.LinearBuckets(120, 30, 7),
	)
}

// resyncBuckets: a resync is several syncs back to back, with a kernel
// read of every virtual server; 1 ms to 4.4 minutes, doubling.
func resyncBuckets() []float64 { return prometheus.ExponentialBuckets(0.001, 2, 19) }

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, as in unit tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		SyncDuration: histogram("kubeproxy_sync_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds: every sync that applied something, full or partial.", syncBuckets()),
		FullSyncDuration: histogram("kubeproxy_sync_full_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for full resyncs: syncs that read the kernel whole, or begin a periodic resync.", syncBuckets()),
		PartialSyncDuration: histogram("kubeproxy_sync_partial_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for partial resyncs: syncs of what changed (and of a periodic resync's slice).", syncBuckets()),
		ResyncDuration: histogram("ipvs_proxy_resync_duration_seconds",
			"Duration of a periodic full resync, from its kernel read to the sync that checked its last slice.", resyncBuckets()),
		ProgrammingLatency: histogram("kubeproxy_network_programming_duration_seconds",
			"In Cluster Network Programming Latency in seconds: from a Service or EndpointSlice change to its programming in the kernel.", programmingBuckets()),
		LastQueued: gauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			"The last time a sync of proxy rules was queued: Unix time of the last Service or EndpointSlice change received."),
		LastSuccessfulSync: gauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			"The last time proxy rules were successfully synced (Unix time)."),
		ServiceChanges: counter("kubeproxy_sync_proxy_rules_service_changes_total",
			"Cumulative proxy rules Service changes: Service adds, updates and deletes received."),
		ServiceChangesPending: gauge("kubeproxy_sync_proxy_rules_service_changes_pending",
			"Pending proxy rules Service changes: Services changed since the last sync took the changes."),
		EndpointChanges: counter("kubeproxy_sync_proxy_rules_endpoint_changes_total",
			"Cumulative proxy rules Endpoint changes: EndpointSlice adds, updates and deletes received."),
		EndpointChangesPending: gauge("kubeproxy_sync_proxy_rules_endpoint_changes_pending",
			"Pending proxy rules Endpoint changes: EndpointSlice changes received since the last sync took the changes."),
		SyncErrors: counter("ipvs_proxy_sync_errors_total",
			"Syncs with a failure: a kernel read, a Service's write, or a consumer (iptables glue, health checks)."),
		VirtualServers: gauge("ipvs_proxy_virtual_servers", "IPVS virtual servers that ipvs-proxy wants."),
		RealServers:    gauge("ipvs_proxy_real_servers", "IPVS real servers that ipvs-proxy wants."),
		WritesPerSync: histogram("ipvs_proxy_sync_netlink_writes", "Netlink writes made by one sync.",
			prometheus.ExponentialBuckets(1, 4, 10)),
		ServicesWithWarning: gauge("ipvs_proxy_services_with_warnings", "Services whose data has problems (see their Events)."),
		ServicesFailing: gauge("ipvs_proxy_services_failing",
			"Services whose last sync failed; each is retried alone with its own backoff (see ipvs-proxy status)."),
		ServicesInConflict: gauge("ipvs_proxy_services_in_conflict",
			"Services that want a virtual server an older Service holds (see their Events)."),
		ServiceFailures: counter("ipvs_proxy_service_sync_failures_total", "Failed attempts to program a Service."),
		NodeSyncFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ipvs_proxy_node_sync_failing",
			Help: "1 for each node-wide part of the sync whose last attempt failed (kernel read, node addresses, iptables glue, a finisher); retried with backoff."},
			[]string{"part"}),
	}
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.FullSyncDuration, m.PartialSyncDuration, m.ResyncDuration,
			m.ProgrammingLatency, m.LastQueued, m.LastSuccessfulSync, m.ServiceChanges, m.ServiceChangesPending,
			m.EndpointChanges, m.EndpointChangesPending, m.SyncErrors, m.VirtualServers, m.RealServers,
			m.WritesPerSync, m.ServicesWithWarning, m.ServicesFailing, m.ServicesInConflict, m.ServiceFailures, m.NodeSyncFailing)
	}
	return m
}

// RegisterBuildInfo registers ipvs_proxy_build_info{version,revision,goversion},
// always 1, with reg: the build's version and revision (as `ipvs-proxy
// --version` prints them) and the Go release that built it.
func RegisterBuildInfo(reg prometheus.Registerer, version, revision string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ipvs_proxy_build_info",
		Help:        "A metric with a constant '1' value labeled by the version and revision of ipvs-proxy, and the Go release that built it.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()}})
	g.Set(1)
	reg.MustRegister(g)
}

// unixSeconds is t as the timestamp gauges hold it: Unix time in seconds,
// with its fraction (as kube-proxy's SetToCurrentTime).
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
