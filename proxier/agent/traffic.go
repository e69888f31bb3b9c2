package agent

// Per-Service traffic (--service-traffic-metrics): IPVS's own counters of
// each virtual server, summed per Service port, read in one dump per
// scrape. Off by default: the series grow with the Services (five per
// Service port), and each scrape dumps every virtual server.

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// trafficPort is one Service port of one protocol: a series' labels.
type trafficPort struct {
	svc   types.NamespacedName
	port  string // the Service port's name ("" for a single unnamed port)
	proto ktypes.Protocol
}

// trafficOwner is a Service port that wants a virtual server, and when its
// Service was made (the oldest holds a virtual server two want).
type trafficOwner struct {
	trafficPort
	created time.Time
}

// trafficIndex maps each virtual server to the Service ports that want it,
// and keeps each Service port's counts. The sync loop writes the map
// (setPlan), scrapes read it and the counts (sum).
type trafficIndex struct {
	mu    sync.Mutex
	byVS  map[ktypes.VSKey][]trafficOwner
	bySvc map[types.NamespacedName][]ktypes.VSKey
	// last is each virtual server's counters at the last scrape, and
	// totals each Service port's counts: a port's series grows by what its
	// virtual servers counted since, so it never goes back when one of
	// them leaves it (an address removed, a conflict's holder changed) or
	// is re-created (its counters start from 0).
	last   map[ktypes.VSKey]ktypes.Stats
	totals map[trafficPort]ktypes.Stats
}

func newTrafficIndex() *trafficIndex {
	return &trafficIndex{byVS: map[ktypes.VSKey][]trafficOwner{}, bySvc: map[types.NamespacedName][]ktypes.VSKey{},
		last: map[ktypes.VSKey]ktypes.Stats{}, totals: map[trafficPort]ktypes.Stats{}}
}

// setPlan records a Service's virtual servers (nil: it is gone, and so are
// its ports' counts).
func (x *trafficIndex) setPlan(name types.NamespacedName, plan *model.ServicePlan) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, k := range x.bySvc[name] {
		owners := slices.DeleteFunc(x.byVS[k], func(o trafficOwner) bool { return o.svc == name })
		if len(owners) == 0 {
			delete(x.byVS, k)
		} else {
			x.byVS[k] = owners
		}
	}
	delete(x.bySvc, name)
	if plan == nil {
		maps.DeleteFunc(x.totals, func(p trafficPort, _ ktypes.Stats) bool { return p.svc == name })
		return
	}
	keys := make([]ktypes.VSKey, 0, len(plan.VirtualServers))
	for _, vs := range plan.VirtualServers {
		keys = append(keys, vs.VSKey)
		x.byVS[vs.VSKey] = append(x.byVS[vs.VSKey], trafficOwner{trafficPort{name, vs.PortName, vs.Protocol}, plan.Created})
	}
	if len(keys) > 0 {
		x.bySvc[name] = keys
	}
}

// holder is the Service port whose traffic a virtual server carries: the
// one whose Service holds it (model.Precedes' order).
func (x *trafficIndex) holder(k ktypes.VSKey) (trafficPort, bool) {
	owners := x.byVS[k]
	if len(owners) == 0 {
		return trafficPort{}, false
	}
	best := owners[0]
	for _, o := range owners[1:] {
		a := model.ServicePlan{Service: o.svc, Created: o.created}
		b := model.ServicePlan{Service: best.svc, Created: best.created}
		if model.Precedes(&a, &b) {
			best = o
		}
	}
	return best.trafficPort, true
}

// sum takes a scrape's counters: each virtual server's growth since the
// last scrape (all of it when it is new or was re-created) is added to the
// Service port that holds it now; virtual servers no Service wants
// (another proxy's, one being removed) count for none. It returns the
// ports' totals.
func (x *trafficIndex) sum(stats map[ktypes.VSKey]ktypes.Stats) map[trafficPort]ktypes.Stats {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, st := range stats {
		p, ok := x.holder(k)
		if !ok {
			continue
		}
		x.totals[p] = x.totals[p].Add(st.Since(x.last[k]))
	}
	clear(x.last)
	maps.Copy(x.last, stats)
	return maps.Clone(x.totals)
}

// serviceTraffic is the collector of the per-Service series.
type serviceTraffic struct {
	stats netlinkutil.StatsReader
	index *trafficIndex
	log   *zap.Logger

	conns, packets, bytes *prometheus.Desc
}

func newServiceTraffic(stats netlinkutil.StatsReader, index *trafficIndex, log *zap.Logger) *serviceTraffic {
	labels := []string{"namespace", "service", "port", "protocol"}
	dir := append(slices.Clone(labels), "direction")
	return &serviceTraffic{stats: stats, index: index, log: log,
		conns: prometheus.NewDesc("ipvs_proxy_service_connections_total",
			"Connections IPVS scheduled to the Service port's endpoints on this node (all its virtual servers: clusterIPs, node ports, external and LoadBalancer IPs).", labels, nil),
		packets: prometheus.NewDesc("ipvs_proxy_service_packets_total",
			"Packets IPVS forwarded for the Service port on this node; direction in: from clients, out: replies.", dir, nil),
		bytes: prometheus.NewDesc("ipvs_proxy_service_bytes_total",
			"Bytes IPVS forwarded for the Service port on this node; direction in: from clients, out: replies.", dir, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *serviceTraffic) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.packets
	ch <- c.bytes
}

// Collect implements prometheus.Collector: one dump of the kernel's
// virtual servers per scrape.
func (c *serviceTraffic) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.stats.VirtualServerStats()
	if err != nil {
		c.log.Warn("per-Service traffic: cannot read IPVS counters", zap.Error(err))
		ch <- prometheus.NewInvalidMetric(c.conns, err)
		return
	}
	// In no order: the registry sorts what it gathers.
	for p, st := range c.index.sum(stats) {
		ns, name, port, proto := p.svc.Namespace, p.svc.Name, p.port, protoLabel(p.proto)
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(st.Connections), ns, name, port, proto)
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(st.PacketsIn), ns, name, port, proto, "in")
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(st.PacketsOut), ns, name, port, proto, "out")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.BytesIn), ns, name, port, proto, "in")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(st.BytesOut), ns, name, port, proto, "out")
	}
}

// protoLabel is a protocol as a label value.
func protoLabel(p ktypes.Protocol) string {
	switch p {
	case ktypes.TCP:
		return "tcp"
	case ktypes.UDP:
		return "udp"
	case ktypes.SCTP:
		return "sctp"
	}
	return strings.ToLower(p.String())
}

// EnableServiceTraffic registers the per-Service traffic series on reg,
// read through stats (a handle of their own: scrapes run beside the sync
// loop). Call it before Run.
func (p *Proxier) EnableServiceTraffic(stats netlinkutil.StatsReader, reg prometheus.Registerer) error {
	p.traffic = newTrafficIndex()
	return reg.Register(newServiceTraffic(stats, p.traffic, p.log))
}
