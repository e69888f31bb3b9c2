package prometheus

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// chartServiceMonitor is the chart's ServiceMonitor as rendered with
// monitoring.job kube-proxy and interval 5s.
const chartServiceMonitor = `
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: ipvs-proxy
  namespace: kube-system
  labels: {app.kubernetes.io/name: ipvs-proxy}
spec:
  namespaceSelector:
    matchNames: [kube-system]
  selector:
    matchLabels:
      app.kubernetes.io/name: ipvs-proxy
      app.kubernetes.io/component: metrics
  endpoints:
    - port: metrics
      path: /metrics
      interval: 5s
      relabelings:
        - targetLabel: job
          replacement: "kube-proxy"
        - sourceLabels: [__meta_kubernetes_pod_node_name]
          targetLabel: node
`

const podMonitor = `
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: ipvs-proxy, namespace: kube-system}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: ipvs-proxy}
  podMetricsEndpoints:
    - port: metrics
      scrapeTimeout: 3s
      metricRelabelings:
        - action: Drop
          sourceLabels: [__name__]
          regex: go_.*
`

func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &obj.Object); err != nil {
		t.Fatal(err)
	}
	return obj
}

func copyTo(src, dst string) Relabel { return Relabel{SourceLabels: []string{src}, TargetLabel: dst} }

// whereRuns are the Operator's labels of where a target runs, and the
// drop of finished pods.
func whereRuns(serviceMonitor bool) []Relabel {
	var out []Relabel
	if serviceMonitor {
		kind := []string{"__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"}
		out = append(out,
			Relabel{SourceLabels: kind, Separator: ptr(";"), Regex: "Node;(.*)", Replacement: ptr("${1}"), TargetLabel: "node"},
			Relabel{SourceLabels: kind, Separator: ptr(";"), Regex: "Pod;(.*)", Replacement: ptr("${1}"), TargetLabel: "pod"},
			copyTo("__meta_kubernetes_namespace", "namespace"), copyTo("__meta_kubernetes_service_name", "service"))
	} else {
		out = append(out, copyTo("__meta_kubernetes_namespace", "namespace"))
	}
	return append(out, copyTo("__meta_kubernetes_pod_name", "pod"), copyTo("__meta_kubernetes_pod_container_name", "container"),
		Relabel{Action: "drop", SourceLabels: []string{"__meta_kubernetes_pod_phase"}, Regex: "(Failed|Succeeded)"})
}

// TestScrapeConfigs: the jobs the Operator would generate for a
// ServiceMonitor and a PodMonitor; other objects are left alone.
func TestScrapeConfigs(t *testing.T) {
	sdOf := func(role string) []KubernetesSD {
		return []KubernetesSD{{Role: role, KubeconfigFile: "/kc", Namespaces: &Namespaces{Names: []string{"kube-system"}}}}
	}
	keep := func(obj, label, value string) Relabel {
		return Relabel{Action: "keep", SourceLabels: []string{"__meta_kubernetes_" + obj + "_label_" + label, "__meta_kubernetes_" + obj + "_labelpresent_" + label},
			Regex: "(" + value + ");true"}
	}
	svcRelabel := append([]Relabel{
		keep("service", "app_kubernetes_io_component", "metrics"), keep("service", "app_kubernetes_io_name", "ipvs-proxy"),
		{Action: "keep", SourceLabels: []string{"__meta_kubernetes_endpoint_port_name"}, Regex: "metrics"},
	}, whereRuns(true)...)
	svcRelabel = append(svcRelabel, copyTo("__meta_kubernetes_service_name", "job"), Relabel{TargetLabel: "endpoint", Replacement: ptr("metrics")},
		Relabel{TargetLabel: "job", Replacement: ptr("kube-proxy")}, copyTo("__meta_kubernetes_pod_node_name", "node"))
	podRelabel := append([]Relabel{keep("pod", "app_kubernetes_io_name", "ipvs-proxy"),
		{Action: "keep", SourceLabels: []string{"__meta_kubernetes_pod_container_port_name"}, Regex: "metrics"}}, whereRuns(false)...)
	podRelabel = append(podRelabel, Relabel{TargetLabel: "job", Replacement: ptr("kube-system/ipvs-proxy")}, Relabel{TargetLabel: "endpoint", Replacement: ptr("metrics")})
	for _, tc := range []struct {
		name string
		objs []string
		want []ScrapeConfig
	}{
		{"the chart's ServiceMonitor", []string{chartServiceMonitor}, []ScrapeConfig{{
			JobName: "serviceMonitor/kube-system/ipvs-proxy/0", ScrapeInterval: "5s", MetricsPath: "/metrics",
			KubernetesSDConfigs: sdOf("endpoints"), RelabelConfigs: svcRelabel}}},
		{"a PodMonitor, the namespace its own", []string{podMonitor, "apiVersion: v1\nkind: Service\nmetadata: {name: x}"}, []ScrapeConfig{{
			JobName: "podMonitor/kube-system/ipvs-proxy/0", ScrapeTimeout: "3s",
			KubernetesSDConfigs: sdOf("pod"), RelabelConfigs: podRelabel,
			MetricRelabelConfigs: []Relabel{{Action: "drop", SourceLabels: []string{"__name__"}, Regex: "go_.*"}}}}},
	} {
		var objs []*unstructured.Unstructured
		for _, y := range tc.objs {
			objs = append(objs, object(t, y))
		}
		got, err := ScrapeConfigs(objs, "/kc")
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestScrapeConfigsRefuse: what the translation does not know fails it
// rather than being left out of the job.
func TestScrapeConfigsRefuse(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"an endpoint field", "path: /metrics", "path: /metrics\n      scheme: https", `unknown field "scheme"`},
		{"a relabeling field", "targetLabel: node", "targetLabel: node\n          foo: bar", `unknown field "foo"`},
		{"matchExpressions", "matchLabels:", "matchExpressions: []\n    matchLabels:", `unknown field "matchExpressions"`},
		{"a relabeling without target", "- targetLabel: job\n", "- action: replace\n", "has no targetLabel"},
		{"no port name", "- port: metrics", "- targetPort: 10249", `unknown field "targetPort"`},
	} {
		y := strings.Replace(chartServiceMonitor, tc.old, tc.new, 1)
		if y == chartServiceMonitor {
			t.Fatalf("%s: %q is not in the ServiceMonitor", tc.name, tc.old)
		}
		_, err := ScrapeConfigs([]*unstructured.Unstructured{object(t, y)}, "/kc")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestRuleFile: the PrometheusRule's spec is the rule file, with its
// rules' names; without a PrometheusRule it is an error.
func TestRuleFile(t *testing.T) {
	rule := object(t, `
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: r}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: up == 0
        - record: job:up:sum
          expr: sum by (job) (up)
`)
	file, names, err := RuleFile([]*unstructured.Unstructured{object(t, chartServiceMonitor), rule})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"A", "job:up:sum"}, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	var got map[string]any
	if err := yaml.Unmarshal(file, &got); err != nil || len(got) != 1 || got["groups"] == nil {
		t.Errorf("rule file %s: %v; want the spec's groups alone", file, err)
	}
	if _, _, err := RuleFile([]*unstructured.Unstructured{object(t, chartServiceMonitor)}); err == nil {
		t.Error("no PrometheusRule, no error")
	}
}
