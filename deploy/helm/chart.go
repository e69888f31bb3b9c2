// Package helm renders ipvs-proxy's chart (ipvs-proxy/, beside this file)
// with Helm's Go SDK, as `helm template` and `helm install` do. It is a
// module of its own so that Helm's dependencies stay out of the agent's
// go.mod: the chart's tests and the bed's render tool (render/) use it.
package helm

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"sigs.k8s.io/yaml"
)

// Manifest is one rendered object: its template file and its YAML.
type Manifest struct {
	Template string
	YAML     string
}

// Render renders the chart in dir for release name in namespace, with vals
// over the chart's values.yaml (checked against its values.schema.json),
// and returns its objects in Helm's install order (ServiceAccount and RBAC,
// then the ConfigMap, then the DaemonSet). NOTES.txt and partials render
// nothing.
func Render(dir, name, namespace string, vals map[string]any) ([]Manifest, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	if vals == nil {
		vals = map[string]any{}
	}
	caps := common.DefaultCapabilities.Copy()
	top, err := util.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true}, caps, false)
	if err != nil {
		return nil, fmt.Errorf("chart %s values: %w", dir, err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", dir, err)
	}
	for f := range files {
		if strings.HasSuffix(f, "NOTES.txt") {
			delete(files, f)
		}
	}
	hooks, sorted, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", dir, err)
	}
	if len(hooks) > 0 {
		return nil, errors.New("chart " + dir + ": hooks are not expected")
	}
	out := make([]Manifest, 0, len(sorted))
	for _, m := range sorted {
		out = append(out, Manifest{Template: m.Name, YAML: m.Content})
	}
	return out, nil
}

// Notes renders the chart's NOTES.txt, what `helm install` prints.
func Notes(dir, name, namespace string, vals map[string]any) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", dir, err)
	}
	top, err := util.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true}, common.DefaultCapabilities.Copy(), false)
	if err != nil {
		return "", fmt.Errorf("chart %s values: %w", dir, err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return "", fmt.Errorf("render chart %s: %w", dir, err)
	}
	return files[ch.Name()+"/templates/NOTES.txt"], nil
}

// Stream joins manifests into one YAML stream, as kubectl apply -f reads.
func Stream(ms []Manifest) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Template, strings.TrimSpace(m.YAML))
	}
	return b.String()
}

// AlertRules renders the chart's PrometheusRule (prometheusRule.enabled
// set over vals) for release name in namespace and returns its spec: a
// Prometheus rule file, as promtool and a Prometheus server read it.
func AlertRules(dir, name, namespace string, vals map[string]any) ([]byte, error) {
	vals = maps.Clone(vals)
	if vals == nil {
		vals = map[string]any{}
	}
	rule, _ := vals["prometheusRule"].(map[string]any)
	rule = maps.Clone(rule)
	if rule == nil {
		rule = map[string]any{}
	}
	rule["enabled"] = true
	vals["prometheusRule"] = rule
	ms, err := Render(dir, name, namespace, vals)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		var o struct {
			Kind string         `json:"kind"`
			Spec map[string]any `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(m.YAML), &o); err != nil {
			return nil, fmt.Errorf("chart %s: %s: %w", dir, m.Template, err)
		}
		if o.Kind != "PrometheusRule" {
			continue
		}
		b, err := yaml.Marshal(o.Spec)
		if err != nil {
			return nil, fmt.Errorf("chart %s: PrometheusRule: %w", dir, err)
		}
		return b, nil
	}
	return nil, errors.New("chart " + dir + ": no PrometheusRule rendered")
}
