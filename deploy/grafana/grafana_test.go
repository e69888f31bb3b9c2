package grafana

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
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
// the proxier's metrics (agent.NewMetrics, as run registers them; a
// histogram as _bucket with le, _sum and _count) and the Go and process
// collectors the operations server registers. proxierNames are the
// proxier's metric (family) names.
func series(t *testing.T) (names map[string][]string, proxierNames []string) {
	t.Helper()
	names = map[string][]string{}
	rec := &recorder{}
	agent.NewMetrics(rec)
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

// TestDashboardNamesOnlyAgentMetrics: every query of the dashboard parses,
// selects only series the agent exports and names only their labels (or
// Prometheus' target labels); and every metric of the proxier has a panel.
func TestDashboardNamesOnlyAgentMetrics(t *testing.T) {
	names, proxierNames := series(t)
	problems, used := Check(Dashboard, names)
	for _, p := range problems {
		t.Error(p)
	}
	if len(used) < 10 {
		t.Fatalf("the dashboard names %d metrics: %v; it looks empty", len(used), used)
	}
	for _, n := range proxierNames {
		if !slices.ContainsFunc([]string{n, n + "_bucket", n + "_sum", n + "_count"}, func(s string) bool { return slices.Contains(used, s) }) {
			t.Errorf("no panel shows the proxier's metric %s", n)
		}
	}
}

// TestCheck: what Check reports of a dashboard against series.
func TestCheck(t *testing.T) {
	d := []byte(`{"panels": [{"title": "P", "targets": [
		{"refId": "A", "expr": "sum by (kind) (rate(a_count{job=~\"$job\"}[$__rate_interval]))"},
		{"refId": "B", "expr": "b{node=\"n\"}"},
		{"refId": "C", "expr": "c"},
		{"refId": "D", "expr": "sum(d"}]}]}`)
	problems, used := Check(d, map[string][]string{"a_count": {"kind"}, "b": nil})
	want := []string{
		`panel "P" B: b has no label "node" (it has [])`,
		`panel "P" C: metric "c" is not exported`,
	}
	if len(problems) != 3 || !strings.HasPrefix(problems[2], `panel "P" D: parse "sum(d"`) {
		t.Errorf("problems %q, want %q and D's parse error", problems, want)
	} else if diff := cmp.Diff(want, problems[:2]); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a_count", "b"}, used); diff != "" {
		t.Errorf("used (-want +got):\n%s", diff)
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

// TestExpand: Grafana's variables in every form take their values; one
// without a value is an error, not an empty string.
func TestExpand(t *testing.T) {
	vars := map[string]string{"job": "kube-proxy", "instance": ".*", "__rate_interval": "1m", "cluster": ""}
	for _, tc := range []struct {
		expr, want string
	}{
		{`rate(a{job=~"$job", instance=~"${instance}"}[$__rate_interval])`, `rate(a{job=~"kube-proxy", instance=~".*"}[1m])`},
		{`up{cluster="$cluster", job=~"${job:regex}"}`, `up{cluster="", job=~"kube-proxy"}`},
		{`count(up)`, `count(up)`},
	} {
		got, err := Expand(tc.expr, vars)
		if err != nil || got != tc.want {
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
	if got, err := Expand(`a{node=~"$node"}`, vars); err == nil {
		t.Errorf("a variable without a value expanded to %q", got)
	}
}

// TestPanels: panels under their rows, collapsed rows' too, with the
// metric families their queries read, each once.
func TestPanels(t *testing.T) {
	d := []byte(`{"panels": [
		{"type": "row", "title": "R1"},
		{"type": "stat", "title": "A", "targets": [{"refId": "A", "expr": "sum(rate(h_bucket[5m])) / sum(rate(h_count[5m]))"}, {"refId": "B", "expr": "g"}]},
		{"type": "row", "title": "R2", "collapsed": true, "panels": [{"type": "timeseries", "title": "B", "targets": [{"refId": "A", "expr": "c_total"}]}]}]}`)
	got, err := Panels(d)
	if err != nil {
		t.Fatal(err)
	}
	want := []Panel{{Row: "R1", Title: "A", Metrics: []string{"h", "g"}}, {Row: "R2", Title: "B", Metrics: []string{"c_total"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestREADMEListsPanels: deploy/README.md's table of the dashboard's
// panels is the one the dashboard gives (a panel or a metric added to the
// JSON changes it).
func TestREADMEListsPanels(t *testing.T) {
	ps, err := Panels(Dashboard)
	if err != nil {
		t.Fatal(err)
	}
	want := PanelTable(ps)
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(b), "| row | panel | metrics |\n")
	if start < 0 {
		t.Fatalf("deploy/README.md has no table of the dashboard's panels; want:\n%s", want)
	}
	got, _, _ := strings.Cut(string(b[start:]), "\n\n")
	if diff := cmp.Diff(strings.Split(strings.TrimSpace(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("deploy/README.md's panels (-want +got):\n%s\nthe table:\n%s", diff, want)
	}
}
