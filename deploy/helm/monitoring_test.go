package helm

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// renderYAML renders the chart with values written as YAML.
func renderYAML(t *testing.T, vals string) map[string]object {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(vals), &v); err != nil {
		t.Fatal(err)
	}
	return render(t, v)
}

// selects tells whether a matchLabels selector selects labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPorts maps the agent container's port names to their numbers.
func containerPorts(t *testing.T, objs map[string]object) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	flat := flatten(objs)
	for i := 0; ; i++ {
		name, ok := flat[run+"ports["+strconv.Itoa(i)+"].name"].(string)
		if !ok {
			return out
		}
		out[name], _ = flat[run+"ports["+strconv.Itoa(i)+"].containerPort"].(float64)
	}
}

// scrapeConfig is what a monitor's endpoint says of the scrape.
type scrapeConfig struct {
	Port        string           `json:"port"`
	Path        string           `json:"path"`
	Interval    string           `json:"interval"`
	Relabelings []map[string]any `json:"relabelings"`
}

// TestMonitors: serviceMonitor or podMonitor scrapes every agent: the
// monitor selects (through a headless Service, or directly) the pods of
// the DaemonSet at the container's metrics port, in the release's
// namespace, gives the series the job monitoring.job and the node's name;
// the metrics address is opened to the pod network (0.0.0.0, same port)
// when it was loopback, and kept when it was not.
func TestMonitors(t *testing.T) {
	for _, tc := range []struct {
		name, vals, kind string
		addr             string
		port             float64
		job              string
	}{
		{"service monitor", `serviceMonitor: {enabled: true}`, "ServiceMonitor", "0.0.0.0:10249", 10249, "ipvs-proxy"},
		{"pod monitor", `podMonitor: {enabled: true}`, "PodMonitor", "0.0.0.0:10249", 10249, "ipvs-proxy"},
		{"loopback IPv6, other port, job kube-proxy", `{podMonitor: {enabled: true}, monitoring: {job: kube-proxy}, config: {metricsBindAddress: "[::1]:9100"}}`,
			"PodMonitor", "0.0.0.0:9100", 9100, "kube-proxy"},
		{"an address of the node's kept", `{serviceMonitor: {enabled: true}, config: {metricsBindAddress: "10.0.0.5:10249"}}`,
			"ServiceMonitor", "10.0.0.5:10249", 10249, "ipvs-proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderYAML(t, tc.vals)
			flat := flatten(objs)
			if got := flat[cm+"config.yaml.metricsBindAddress"]; got != tc.addr {
				t.Errorf("config.yaml metricsBindAddress %v, want %s", got, tc.addr)
			}
			if got := containerPorts(t, objs)["metrics"]; got != tc.port {
				t.Errorf("container port metrics %v, want %v", got, tc.port)
			}
			ds := objs["DaemonSet/kube-system/ipvs-proxy"]
			podLabels := labelsAt(ds, "spec", "template", "metadata", "labels")
			mon := objs[tc.kind+"/kube-system/ipvs-proxy"]
			if mon == nil {
				t.Fatalf("no %s rendered: %v", tc.kind, slices.Sorted(maps.Keys(objs)))
			}
			if got := flatten(map[string]object{"m": mon})["m spec.namespaceSelector.matchNames[0]"]; got != namespace {
				t.Errorf("%s namespaceSelector %v, want %s", tc.kind, got, namespace)
			}
			selector := labelsAt(mon, "spec", "selector", "matchLabels")
			endpointsKey := "podMetricsEndpoints"
			if tc.kind == "ServiceMonitor" {
				endpointsKey = "endpoints"
				svc := objs["Service/kube-system/ipvs-proxy-metrics"]
				if !selects(selector, labelsAt(svc, "metadata", "labels")) {
					t.Errorf("the ServiceMonitor's selector %v does not select the Service ipvs-proxy-metrics", selector)
				}
				if sel := labelsAt(svc, "spec", "selector"); !selects(sel, podLabels) {
					t.Errorf("the Service's selector %v does not select the pods %v", sel, podLabels)
				}
				sf := flatten(map[string]object{"s": svc})
				if sf["s spec.clusterIP"] != "None" || sf["s spec.ports[0].name"] != "metrics" ||
					sf["s spec.ports[0].targetPort"] != "metrics" || sf["s spec.ports[0].port"] != tc.port {
					t.Errorf("Service ipvs-proxy-metrics: %v; want headless, port metrics %v to the pods' metrics", sf, tc.port)
				}
			} else if !selects(selector, podLabels) {
				t.Errorf("the PodMonitor's selector %v does not select the pods %v", selector, podLabels)
			}
			spec, _ := mon["spec"].(map[string]any)
			b, err := yaml.Marshal(spec[endpointsKey])
			if err != nil {
				t.Fatal(err)
			}
			var eps []scrapeConfig
			if err := yaml.Unmarshal(b, &eps); err != nil {
				t.Fatal(err)
			}
			want := []scrapeConfig{{Port: "metrics", Path: "/metrics", Interval: "30s", Relabelings: []map[string]any{
				{"targetLabel": "job", "replacement": tc.job},
				{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"},
			}}}
			if diff := cmp.Diff(want, eps); diff != "" {
				t.Errorf("%s endpoints (-want +got):\n%s", tc.kind, diff)
			}
		})
	}
}

// alertRule is one rule of the PrometheusRule.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// alerts renders the chart's PrometheusRule with vals (YAML) and returns
// its rules by alert name.
func alerts(t *testing.T, vals string) map[string]alertRule {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(vals), &v); err != nil {
		t.Fatal(err)
	}
	b, err := AlertRules(chartDir, "ipvs-proxy", namespace, v)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatalf("rule file: %v\n%s", err, b)
	}
	out := map[string]alertRule{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r
		}
	}
	return out
}

// TestPrometheusRule: prometheusRule.enabled renders the alerts an
// operator needs; each selects monitoring.job; the sync alert's limit is
// 2 × config.ipvs.syncPeriod; the alerts' own templates ($labels, $value)
// reach Prometheus unrendered; ruleLabels label every alert. (What they
// fire on: promtool, deploy/helm/promtool.)
func TestPrometheusRule(t *testing.T) {
	got := alerts(t, `{monitoring: {job: kube-proxy}, config: {ipvs: {syncPeriod: 1m30s}}, prometheusRule: {ruleLabels: {team: net}}}`)
	names := slices.Sorted(maps.Keys(got))
	want := []string{"IPVSProxyAbsent", "IPVSProxyAgentMissing", "IPVSProxyConntrackDropping", "IPVSProxyDown", "IPVSProxyHealthzFailing",
		"IPVSProxyRulesNotSynced", "IPVSProxyServicesFailing"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("alerts (-want +got):\n%s", diff)
	}
	for name, r := range got {
		if !strings.Contains(r.Expr, `job="kube-proxy"`) || strings.Contains(r.Expr, `job="ipvs-proxy"`) {
			t.Errorf("%s: expr %q does not select job kube-proxy alone", name, r.Expr)
		}
		if r.Labels["team"] != "net" || r.Labels["severity"] == "" {
			t.Errorf("%s: labels %v, want a severity and team: net", name, r.Labels)
		}
		if r.For == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: no for, summary or description: %+v", name, r)
		}
	}
	if e := got["IPVSProxyRulesNotSynced"].Expr; !strings.HasSuffix(strings.TrimSpace(e), "> 180") {
		t.Errorf("IPVSProxyRulesNotSynced: expr %q, want a limit of 180 s (2 × 1m30s)", e)
	}
	if s := got["IPVSProxyDown"].Annotations["summary"]; !strings.Contains(s, "{{ $labels.node }}") {
		t.Errorf("IPVSProxyDown: summary %q lost its {{ $labels.node }}", s)
	}
	if got := alerts(t, `config: {ipvs: {syncPeriod: 500ms}}`)["IPVSProxyRulesNotSynced"].Expr; !strings.HasSuffix(strings.TrimSpace(got), "> 1") {
		t.Errorf("syncPeriod 500ms: expr %q, want a limit of 1 s", got)
	}
}

// TestMonitoringOffByDefault: the default rendering has no monitoring
// object (deploy/ needs no Prometheus Operator), and each switch adds its
// own objects only.
func TestMonitoringOffByDefault(t *testing.T) {
	base := slices.Sorted(maps.Keys(render(t, nil)))
	for vals, want := range map[string][]string{
		`serviceMonitor: {enabled: true}`: {"Service/kube-system/ipvs-proxy-metrics", "ServiceMonitor/kube-system/ipvs-proxy"},
		`podMonitor: {enabled: true}`:     {"PodMonitor/kube-system/ipvs-proxy"},
		`prometheusRule: {enabled: true}`: {"PrometheusRule/kube-system/ipvs-proxy"},
		`dashboards: {enabled: true}`:     {"ConfigMap/kube-system/ipvs-proxy-dashboards"},
	} {
		got := slices.Sorted(maps.Keys(renderYAML(t, vals)))
		added := slices.DeleteFunc(got, func(k string) bool { return slices.Contains(base, k) })
		if diff := cmp.Diff(want, added); diff != "" {
			t.Errorf("values %s: objects added (-want +got):\n%s", vals, diff)
		}
	}
}

// TestDashboards: dashboards.enabled ships deploy/grafana/ipvs-proxy.json
// (the chart's copy, dashboards/ipvs-proxy.json: a chart holds only its
// own files) byte for byte in a ConfigMap that Grafana's sidecar loads (its label),
// in the release's namespace or dashboards.namespace.
func TestDashboards(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(deployDir, "grafana", "ipvs-proxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ vals, key string }{
		{`dashboards: {enabled: true}`, "ConfigMap/kube-system/ipvs-proxy-dashboards"},
		{`dashboards: {enabled: true, namespace: monitoring, annotations: {grafana_folder: Networking}}`, "ConfigMap/monitoring/ipvs-proxy-dashboards"},
	} {
		cm := renderYAML(t, tc.vals)[tc.key]
		if cm == nil {
			t.Errorf("values %s: no %s", tc.vals, tc.key)
			continue
		}
		if got := labelsAt(cm, "metadata", "labels")["grafana_dashboard"]; got != "1" {
			t.Errorf("values %s: label grafana_dashboard %q, want \"1\"", tc.vals, got)
		}
		data, _ := cm["data"].(map[string]any)
		got, _ := data["ipvs-proxy.json"].(string)
		if !bytes.Equal(bytes.TrimSpace(want), []byte(got)) {
			t.Errorf("values %s: the ConfigMap's ipvs-proxy.json (%d bytes) is not deploy/grafana/ipvs-proxy.json (%d bytes): cp deploy/grafana/ipvs-proxy.json deploy/helm/ipvs-proxy/dashboards/", tc.vals, len(got), len(want))
		}
	}
}

// TestMonitoringObjectsAreOperators: the ServiceMonitor, PodMonitor and
// PrometheusRule decode strictly into the Prometheus Operator's own types
// (monitoring.coreos.com/v1, its Go API at the version go.mod pins): no
// field the operator does not know, none of the wrong type, as its CRDs
// would refuse them at install.
func TestMonitoringObjectsAreOperators(t *testing.T) {
	for _, tc := range []struct {
		vals, key string
		into      any
	}{
		{`serviceMonitor: {enabled: true, scrapeTimeout: 10s, relabelings: [{action: labeldrop, regex: pod}], metricRelabelings: [{action: drop, sourceLabels: [__name__], regex: go_gc_.*}]}`,
			"ServiceMonitor/kube-system/ipvs-proxy", &monitoringv1.ServiceMonitor{}},
		{`podMonitor: {enabled: true, scrapeTimeout: 10s, relabelings: [{action: labeldrop, regex: pod}]}`,
			"PodMonitor/kube-system/ipvs-proxy", &monitoringv1.PodMonitor{}},
		{`prometheusRule: {enabled: true, ruleLabels: {team: net}}`,
			"PrometheusRule/kube-system/ipvs-proxy", &monitoringv1.PrometheusRule{}},
	} {
		o := renderYAML(t, tc.vals)[tc.key]
		if o == nil {
			t.Fatalf("values %s: no %s", tc.vals, tc.key)
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, tc.into); err != nil {
			t.Errorf("values %s: %s is not the operator's: %v", tc.vals, tc.key, err)
		}
	}
}
