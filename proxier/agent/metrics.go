package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the proxier's Prometheus metrics. Names follow kube-proxy's
// where one means the same thing (kubeproxy_*); the rest are ipvs_proxy_*.
type Metrics struct {
	SyncDuration        *prometheus.HistogramVec // label "kind": full, partial, or resync (a whole sliced resync)
	ProgrammingLatency  prometheus.Histogram
	SyncErrors          prometheus.Counter
	LastSuccessfulSync  prometheus.Gauge
	VirtualServers      prometheus.Gauge
	RealServers         prometheus.Gauge
	WritesPerSync       prometheus.Histogram
	ServicesWithWarning prometheus.Gauge
	ServicesFailing     prometheus.Gauge
	ServicesInConflict  prometheus.Gauge
	ServiceFailures     prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, as in unit tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 16) // 1ms .. ~33s
	m := &Metrics{
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_proxy_rules_duration_seconds", Help: "Duration of syncs, by kind: full or partial, and resync for a periodic full resync from its kernel read to its last slice.",
			Buckets: buckets,
		}, []string{"kind"}),
		ProgrammingLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_network_programming_duration_seconds", Help: "Time from a Service or EndpointSlice change to its programming in the kernel.",
			Buckets: buckets,
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ipvs_proxy_sync_errors_total", Help: "Syncs with a failure: a kernel read, a Service's write, or a consumer (iptables glue, health checks).",
		}),
		LastSuccessfulSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Help: "Unix time of the last successful sync.",
		}),
		VirtualServers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ipvs_proxy_virtual_servers", Help: "IPVS virtual servers that ipvs-proxy wants.",
		}),
		RealServers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ipvs_proxy_real_servers", Help: "IPVS real servers that ipvs-proxy wants.",
		}),
		WritesPerSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ipvs_proxy_sync_netlink_writes", Help: "Netlink writes made by one sync.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		ServicesWithWarning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ipvs_proxy_services_with_warnings", Help: "Services whose data has problems (see their Events).",
		}),
		ServicesFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ipvs_proxy_services_failing", Help: "Services whose last sync failed; each is retried alone with its own backoff (see ipvs-proxy status).",
		}),
		ServicesInConflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ipvs_proxy_services_in_conflict", Help: "Services that want a virtual server an older Service holds (see their Events).",
		}),
		ServiceFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ipvs_proxy_service_sync_failures_total", Help: "Failed attempts to program a Service.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.ProgrammingLatency, m.SyncErrors, m.LastSuccessfulSync,
			m.VirtualServers, m.RealServers, m.WritesPerSync, m.ServicesWithWarning, m.ServicesFailing,
			m.ServicesInConflict, m.ServiceFailures)
	}
	return m
}
