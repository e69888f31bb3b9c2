package ctwatch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the table's figures as the watcher last read them.
type Metrics struct {
	Entries, Max, Pressure prometheus.Gauge
	// Dropped counts, by reason (drop, early_drop, insert_failed), what
	// the kernel counted while the agent watched: it starts at 0 and
	// never goes back, whatever the kernel's counters do.
	Dropped *prometheus.CounterVec
}

// Reasons of Metrics.Dropped.
const (
	reasonDrop         = "drop"
	reasonEarlyDrop    = "early_drop"
	reasonInsertFailed = "insert_failed"
)

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, as in unit tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ipvs_proxy_conntrack_entries",
			Help: "Entries in the node's connection tracking table (nf_conntrack_count), read every few seconds."}),
		Max: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ipvs_proxy_conntrack_max",
			Help: "The connection tracking table's limit (nf_conntrack_max)."}),
		Pressure: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ipvs_proxy_conntrack_pressure",
			Help: "1 while the connection tracking table is at least 90% full or the kernel drops or evicts for room; 0 again below 80% with nothing dropped."}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ipvs_proxy_conntrack_dropped_total",
			Help: "The kernel's connection tracking counters while the agent watched, summed over CPUs: drop (new packets dropped: the table full, or with an insert_failed a lost insertion race), early_drop (entries evicted for room), insert_failed (entries not inserted)."},
			[]string{"reason"}),
	}
	for _, r := range []string{reasonDrop, reasonEarlyDrop, reasonInsertFailed} {
		m.Dropped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Entries, m.Max, m.Pressure, m.Dropped)
	}
	return m
}

func (m *Metrics) observe(s Sample, d Stats, pressure bool) {
	m.Entries.Set(float64(s.Entries))
	m.Max.Set(float64(s.Max))
	m.Dropped.WithLabelValues(reasonDrop).Add(float64(d.Drop))
	m.Dropped.WithLabelValues(reasonEarlyDrop).Add(float64(d.EarlyDrop))
	m.Dropped.WithLabelValues(reasonInsertFailed).Add(float64(d.InsertFailed))
	if pressure {
		m.Pressure.Set(1)
	} else {
		m.Pressure.Set(0)
	}
}
