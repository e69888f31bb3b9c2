// Package prometheus runs a real Prometheus server in the bed: built from
// the Go module pinned in e2e/tools/prometheus, started in a node's VM, fed
// the scrape configuration the Prometheus Operator would generate from the
// chart's rendered ServiceMonitor or PodMonitor (the bed has no Operator)
// and the rendered PrometheusRule's rules, and asked through its HTTP API.
package prometheus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// monitoringGroup is the Prometheus Operator's API group.
const monitoringGroup = "monitoring.coreos.com"

// Config is a Prometheus configuration file, the parts the bed writes.
type Config struct {
	Global        Global         `json:"global"`
	RuleFiles     []string       `json:"rule_files,omitempty"`
	ScrapeConfigs []ScrapeConfig `json:"scrape_configs"`
}

// Global is the configuration's global section.
type Global struct {
	ScrapeInterval     string `json:"scrape_interval,omitempty"`
	EvaluationInterval string `json:"evaluation_interval,omitempty"`
}

// ScrapeConfig is one scrape job.
type ScrapeConfig struct {
	JobName              string         `json:"job_name"`
	HonorLabels          bool           `json:"honor_labels"`
	ScrapeInterval       string         `json:"scrape_interval,omitempty"`
	ScrapeTimeout        string         `json:"scrape_timeout,omitempty"`
	MetricsPath          string         `json:"metrics_path,omitempty"`
	KubernetesSDConfigs  []KubernetesSD `json:"kubernetes_sd_configs"`
	RelabelConfigs       []Relabel      `json:"relabel_configs,omitempty"`
	MetricRelabelConfigs []Relabel      `json:"metric_relabel_configs,omitempty"`
}

// KubernetesSD is one kubernetes_sd_configs entry.
type KubernetesSD struct {
	Role           string      `json:"role"`
	KubeconfigFile string      `json:"kubeconfig_file,omitempty"`
	Namespaces     *Namespaces `json:"namespaces,omitempty"`
}

// Namespaces limits a discovery to namespaces.
type Namespaces struct {
	Names []string `json:"names"`
}

// Relabel is one relabel_configs (or metric_relabel_configs) rule.
type Relabel struct {
	SourceLabels []string `json:"source_labels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"target_label,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// YAML is the configuration file's text.
func (c Config) YAML() ([]byte, error) {
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("prometheus: configuration: %w", err)
	}
	return b, nil
}

// monitor is a ServiceMonitor or PodMonitor: its kind, name and
// namespace, and its spec with the fields the translation knows, decoded
// strictly, so that a field the chart adds and the translation would
// ignore fails instead.
type monitor struct {
	Kind, Name, Namespace string
	Spec                  monitorSpec
}

type monitorSpec struct {
	JobLabel          string `json:"jobLabel"`
	NamespaceSelector struct {
		Any        bool     `json:"any"`
		MatchNames []string `json:"matchNames"`
	} `json:"namespaceSelector"`
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	Endpoints           []endpoint `json:"endpoints"`
	PodMetricsEndpoints []endpoint `json:"podMetricsEndpoints"`
}

// endpoint is a ServiceMonitor's endpoint or a PodMonitor's
// podMetricsEndpoint.
type endpoint struct {
	Port              string       `json:"port"`
	Path              string       `json:"path"`
	Interval          string       `json:"interval"`
	ScrapeTimeout     string       `json:"scrapeTimeout"`
	Relabelings       []relabeling `json:"relabelings"`
	MetricRelabelings []relabeling `json:"metricRelabelings"`
	HonorLabels       bool         `json:"honorLabels"`
}

// relabeling is the Operator's RelabelConfig: Prometheus's relabel_config
// with camel-case keys (relabelKeys).
type relabeling map[string]any

// relabelKeys are the Operator's keys of a relabeling, to Prometheus's.
var relabelKeys = map[string]string{"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
	"regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}

// IsMonitoring tells the Prometheus Operator's objects, which the bed
// has no API for.
func IsMonitoring(obj *unstructured.Unstructured) bool {
	return obj.GroupVersionKind().Group == monitoringGroup
}

// ScrapeConfigs translates every ServiceMonitor and PodMonitor among objs
// into the scrape jobs the Prometheus Operator generates for them: one per
// endpoint, discovering role endpoints (a ServiceMonitor) or pod (a
// PodMonitor) in the namespaces it selects through kubeconfig, keeping the
// targets whose Service's (or pod's) labels match its selector and whose
// port has the endpoint's name, with the Operator's target labels
// (namespace, service, pod, container, node, endpoint, job) and then the
// endpoint's own relabelings. A field it does not translate is an error.
func ScrapeConfigs(objs []*unstructured.Unstructured, kubeconfig string) ([]ScrapeConfig, error) {
	var out []ScrapeConfig
	for _, obj := range objs {
		kind := obj.GetKind()
		if !IsMonitoring(obj) || kind != "ServiceMonitor" && kind != "PodMonitor" {
			continue
		}
		m, err := decodeMonitor(obj)
		if err != nil {
			return nil, err
		}
		jobs, err := m.scrapeConfigs(kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("prometheus: %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
		out = append(out, jobs...)
	}
	return out, nil
}

func decodeMonitor(obj *unstructured.Unstructured) (monitor, error) {
	m := monitor{Kind: obj.GetKind(), Name: obj.GetName(), Namespace: obj.GetNamespace()}
	b, err := json.Marshal(obj.Object["spec"])
	if err != nil {
		return m, fmt.Errorf("prometheus: %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&m.Spec); err != nil {
		return m, fmt.Errorf("prometheus: %s %s/%s has a field the bed's translation does not know: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return m, nil
}

func (m monitor) scrapeConfigs(kubeconfig string) ([]ScrapeConfig, error) {
	eps, role, kind := m.Spec.Endpoints, "endpoints", "serviceMonitor"
	if m.Kind == "PodMonitor" {
		eps, role, kind = m.Spec.PodMetricsEndpoints, "pod", "podMonitor"
	}
	if len(eps) == 0 {
		return nil, errors.New("no endpoints")
	}
	if len(m.Spec.Selector.MatchLabels) == 0 {
		return nil, errors.New("its selector has no matchLabels: it would select every object")
	}
	sd := KubernetesSD{Role: role, KubeconfigFile: kubeconfig}
	switch ns := m.Spec.NamespaceSelector; {
	case ns.Any:
	case len(ns.MatchNames) > 0:
		sd.Namespaces = &Namespaces{Names: ns.MatchNames}
	default:
		sd.Namespaces = &Namespaces{Names: []string{m.Namespace}}
	}
	var out []ScrapeConfig
	for i, ep := range eps {
		if ep.Port == "" {
			return nil, fmt.Errorf("endpoint %d has no port name", i)
		}
		rel, err := m.targetRelabelings(ep)
		if err != nil {
			return nil, fmt.Errorf("endpoint %d: %w", i, err)
		}
		metric, err := relabelings(ep.MetricRelabelings)
		if err != nil {
			return nil, fmt.Errorf("endpoint %d: metricRelabelings: %w", i, err)
		}
		out = append(out, ScrapeConfig{
			JobName:     fmt.Sprintf("%s/%s/%s/%d", kind, m.Namespace, m.Name, i),
			HonorLabels: ep.HonorLabels, ScrapeInterval: ep.Interval, ScrapeTimeout: ep.ScrapeTimeout, MetricsPath: ep.Path,
			KubernetesSDConfigs: []KubernetesSD{sd}, RelabelConfigs: rel, MetricRelabelConfigs: metric,
		})
	}
	return out, nil
}

// targetRelabelings are the Operator's relabelings for one endpoint:
// selection, its target labels, then the endpoint's own.
func (m monitor) targetRelabelings(ep endpoint) ([]Relabel, error) {
	obj, portLabel := "service", "__meta_kubernetes_endpoint_port_name"
	if m.Kind == "PodMonitor" {
		obj, portLabel = "pod", "__meta_kubernetes_pod_container_port_name"
	}
	var out []Relabel
	for _, k := range slices.Sorted(maps.Keys(m.Spec.Selector.MatchLabels)) {
		name := sanitize(k)
		out = append(out, Relabel{Action: "keep",
			SourceLabels: []string{"__meta_kubernetes_" + obj + "_label_" + name, "__meta_kubernetes_" + obj + "_labelpresent_" + name},
			Regex:        "(" + regexp.QuoteMeta(m.Spec.Selector.MatchLabels[k]) + ");true"})
	}
	out = append(out, Relabel{Action: "keep", SourceLabels: []string{portLabel}, Regex: regexp.QuoteMeta(ep.Port)})
	out = append(out, m.objectLabels()...)
	out = append(out, Relabel{TargetLabel: "endpoint", Replacement: ptr(ep.Port)})
	own, err := relabelings(ep.Relabelings)
	return append(out, own...), err
}

// objectLabels are the target labels the Operator gives every target:
// where it runs, and its job (the Service's name, or the PodMonitor's
// namespace/name, unless jobLabel names a label of the object).
func (m monitor) objectLabels() []Relabel {
	copyTo := func(src, dst string) Relabel { return Relabel{SourceLabels: []string{src}, TargetLabel: dst} }
	var out []Relabel
	if m.Kind == "ServiceMonitor" {
		for _, kind := range []string{"Node", "Pod"} {
			out = append(out, Relabel{SourceLabels: []string{"__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"},
				Separator: ptr(";"), Regex: kind + ";(.*)", Replacement: ptr("${1}"), TargetLabel: strings.ToLower(kind)})
		}
		out = append(out, copyTo("__meta_kubernetes_namespace", "namespace"), copyTo("__meta_kubernetes_service_name", "service"))
	} else {
		out = append(out, copyTo("__meta_kubernetes_namespace", "namespace"))
	}
	out = append(out, copyTo("__meta_kubernetes_pod_name", "pod"), copyTo("__meta_kubernetes_pod_container_name", "container"),
		Relabel{Action: "drop", SourceLabels: []string{"__meta_kubernetes_pod_phase"}, Regex: "(Failed|Succeeded)"})
	switch {
	case m.Spec.JobLabel != "" && m.Kind == "ServiceMonitor":
		out = append(out, copyTo("__meta_kubernetes_service_label_"+sanitize(m.Spec.JobLabel), "job"))
	case m.Spec.JobLabel != "":
		out = append(out, copyTo("__meta_kubernetes_pod_label_"+sanitize(m.Spec.JobLabel), "job"))
	case m.Kind == "ServiceMonitor":
		out = append(out, copyTo("__meta_kubernetes_service_name", "job"))
	default:
		out = append(out, Relabel{TargetLabel: "job", Replacement: ptr(m.Namespace + "/" + m.Name)})
	}
	return out
}

// relabelings translates the Operator's relabelings into Prometheus's,
// with the Operator's lower-case actions; a key it does not know is an
// error.
func relabelings(rs []relabeling) ([]Relabel, error) {
	var out []Relabel
	for i, r := range rs {
		renamed := map[string]any{}
		for k, v := range r {
			to, ok := relabelKeys[k]
			if !ok {
				return nil, fmt.Errorf("relabeling %d: unknown field %q", i, k)
			}
			renamed[to] = v
		}
		var rel Relabel
		b, err := json.Marshal(renamed)
		if err == nil {
			err = json.Unmarshal(b, &rel)
		}
		if err != nil {
			return nil, fmt.Errorf("relabeling %d: %w", i, err)
		}
		rel.Action = strings.ToLower(rel.Action)
		if rel.TargetLabel == "" && slices.Contains([]string{"", "replace", "hashmod", "lowercase", "uppercase"}, rel.Action) {
			return nil, fmt.Errorf("relabeling %d has no targetLabel", i)
		}
		out = append(out, rel)
	}
	return out, nil
}

// sanitize is a Kubernetes label name as Prometheus's discovery writes it
// into a meta label: every character but letters, digits and _ becomes _.
func sanitize(name string) string {
	return invalidLabelChars.ReplaceAllString(name, "_")
}

var invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func ptr[T any](v T) *T { return &v }

// RuleFile is the spec of the PrometheusRule among objs, a Prometheus rule
// file, and the names of its alerting and recording rules.
func RuleFile(objs []*unstructured.Unstructured) ([]byte, []string, error) {
	for _, obj := range objs {
		if !IsMonitoring(obj) || obj.GetKind() != "PrometheusRule" {
			continue
		}
		var spec struct {
			Groups []struct {
				Rules []struct {
					Alert  string `json:"alert"`
					Record string `json:"record"`
				} `json:"rules"`
			} `json:"groups"`
		}
		b, err := json.Marshal(obj.Object["spec"])
		if err == nil {
			err = json.Unmarshal(b, &spec)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("prometheus: PrometheusRule %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
		}
		var names []string
		for _, g := range spec.Groups {
			for _, r := range g.Rules {
				names = append(names, r.Alert+r.Record)
			}
		}
		file, err := yaml.JSONToYAML(b)
		if err != nil {
			return nil, nil, fmt.Errorf("prometheus: PrometheusRule %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
		}
		return file, names, nil
	}
	return nil, nil, errors.New("prometheus: no PrometheusRule among the objects")
}
