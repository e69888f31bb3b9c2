package grafana

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/ipvs-proxy/ipvs-proxy/proxier"
)

// recorder is a Registerer that keeps what is registered with it.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

// descFields reads a Desc's name and variable labels from its String (the
// only way client_golang shows them); a Desc it cannot read fails the test.
var descFields = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

// series are the series names the agent exports, with their label names:
// the proxier's metrics (proxier.NewMetrics, as run registers them; a
// histogram as _bucket with le, _sum and _count) and the Go and process
// collectors the operations server registers. proxierNames are the
// proxier's metric (family) names.
func series(t *testing.T) (names map[string][]string, proxierNames []string) {
	t.Helper()
	names = map[string][]string{}
	rec := &recorder{}
	proxier.NewMetrics(rec)
	for _, c := range rec.cs {
		_, histogram := c.(prometheus.Histogram)
		if _, ok := c.(*prometheus.HistogramVec); ok {
			histogram = true
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descFields.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read %s", d)
			}
			name, labels := m[1], []string{}
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			proxierNames = append(proxierNames, name)
			if histogram {
				names[name+"_bucket"] = append(slices.Clone(labels), "le")
				names[name+"_sum"], names[name+"_count"] = labels, labels
			} else {
				names[name] = labels
			}
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[f.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			names[f.GetName()+"_sum"], names[f.GetName()+"_count"] = labels, labels
		case dto.MetricType_SUMMARY:
			names[f.GetName()] = append(slices.Clone(labels), "quantile")
			names[f.GetName()+"_sum"], names[f.GetName()+"_count"] = labels, labels
		default:
			names[f.GetName()] = labels
		}
	}
	if _, ok := names["process_resident_memory_bytes"]; len(proxierNames) < 10 || !ok {
		t.Fatalf("the registry's series look incomplete: %v", slices.Sorted(maps.Keys(names)))
	}
	return names, proxierNames
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// TestDashboardNamesOnlyAgentMetrics: every query of the dashboard parses,
// selects only series the agent exports and names only their labels (or
// Prometheus' target labels); and every metric of the proxier has a panel.
func TestDashboardNamesOnlyAgentMetrics(t *testing.T) {
	names, proxierNames := series(t)
	qs, err := Queries(Dashboard)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 10 {
		t.Fatalf("%d queries; the dashboard looks empty", len(qs))
	}
	used := map[string]bool{}
	for _, q := range qs {
		sels, err := Selectors(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s: %q selects no metric", q.Where, q.Expr)
		}
		for _, s := range sels {
			labels, ok := names[s.Metric]
			if !ok {
				t.Errorf("%s: metric %q is not one the agent exports", q.Where, s.Metric)
				continue
			}
			used[s.Metric] = true
			for _, l := range s.Labels {
				if !slices.Contains(labels, l) && !slices.Contains(targetLabels, l) {
					t.Errorf("%s: %s has no label %q (it has %v)", q.Where, s.Metric, l, labels)
				}
			}
		}
	}
	for _, n := range proxierNames {
		if !used[n] && !used[n+"_bucket"] && !used[n+"_sum"] && !used[n+"_count"] {
			t.Errorf("no panel shows the proxier's metric %s", n)
		}
	}
}

// TestSelectors: what the reader of a query takes for metrics and labels,
// and what it refuses.
func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []Selector
	}{
		{`ipvs_proxy_virtual_servers{job=~"$job", instance=~"${instance}"}`,
			[]Selector{{"ipvs_proxy_virtual_servers", []string{"instance", "job"}}}},
		{`histogram_quantile(0.99, sum by (kind, le) (rate(x_bucket{kind!="resync"}[$__rate_interval])))`,
			[]Selector{{"x_bucket", []string{"kind", "le"}}}},
		{`time() - a{instance="n"} + on (instance) b`,
			[]Selector{{"a", []string{"instance"}}, {"b", nil}}},
		{`count(up)`, []Selector{{"up", nil}}},
		{`{job="x"}`, []Selector{{"", []string{"job"}}}},
	} {
		got, err := Selectors(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.expr, diff)
		}
	}
	if _, err := Selectors(`sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced expression parsed")
	}
}

// TestQueries: panels' targets and label_values variables are read; a
// target without an expression is an error.
func TestQueries(t *testing.T) {
	qs, err := Queries([]byte(`{"panels": [{"title": "A", "targets": [{"refId": "A", "expr": "a"}]}],
		"templating": {"list": [{"name": "ds", "type": "datasource", "query": "prometheus"},
		{"name": "node", "type": "query", "query": {"query": "label_values(b{job=\"j\"}, instance)"}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Query{{`panel "A" A`, "a"}, {"variable node", `b{job="j"}`}}
	if diff := cmp.Diff(want, qs); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := Queries([]byte(`{"panels": [{"title": "A", "targets": [{"refId": "A"}]}]}`)); err == nil {
		t.Error("a target without expr was accepted")
	}
}
