package helm

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "ipvs-proxy"
	deployDir = ".." // deploy/'s manifests
	namespace = "kube-system"
)

// object is one rendered or written object, parsed: a tree of maps,
// lists, strings, numbers and booleans, as the apiserver reads it. A
// ConfigMap's data holding YAML (config.yaml, kubeconfig.conf) is parsed
// too, so that a comment or a key's order is no difference.
type object = map[string]any

// key names an object: kind/namespace/name.
func key(o object) string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%s/%v/%v", o["kind"], md["namespace"], md["name"])
}

// parse reads a YAML stream into objects by key.
func parse(t *testing.T, source, stream string) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, doc := range strings.Split(stream, "\n---") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", source, err, doc)
		}
		if o == nil {
			continue
		}
		if data, ok := o["data"].(map[string]any); ok && o["kind"] == "ConfigMap" {
			for k, v := range data {
				s, _ := v.(string)
				if !strings.HasSuffix(k, ".yaml") && !strings.HasSuffix(k, ".conf") {
					continue
				}
				var parsed any
				if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
					t.Fatalf("%s: %s data %s: %v", source, key(o), k, err)
				}
				data[k] = parsed
			}
		}
		if _, dup := out[key(o)]; dup {
			t.Fatalf("%s: %s twice", source, key(o))
		}
		out[key(o)] = o
	}
	return out
}

// render renders the chart with vals, parsed.
func render(t *testing.T, vals map[string]any) map[string]object {
	t.Helper()
	ms, err := Render(chartDir, "ipvs-proxy", namespace, vals)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, "chart", Stream(ms))
}

// TestDefaultRenderingIsDeploy: the chart with its default values deploys
// exactly deploy/'s objects (configmap.yaml, daemonset.yaml, rbac.yaml),
// field by field.
func TestDefaultRenderingIsDeploy(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/*.yaml: %v %v", files, err)
	}
	want := map[string]object{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(want, parse(t, f, string(b)))
	}
	got := render(t, nil)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the chart's default rendering differs from deploy/ (-deploy +chart):\n%s", diff)
	}
	if len(got) != 5 {
		t.Errorf("%d objects: %v; want deploy/'s 5", len(got), slices.Sorted(maps.Keys(got)))
	}
}

// TestRenderOrder: objects come in Helm's install order, the DaemonSet last.
func TestRenderOrder(t *testing.T) {
	ms, err := Render(chartDir, "ipvs-proxy", namespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, m := range ms {
		var o object
		if err := yaml.Unmarshal([]byte(m.YAML), &o); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, fmt.Sprint(o["kind"]))
	}
	if want := []string{"ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}; !slices.Equal(kinds, want) {
		t.Errorf("kinds in order %v, want %v", kinds, want)
	}
}

// flatten lists every leaf of objs by path, e.g.
// "DaemonSet/kube-system/ipvs-proxy spec.template.spec.tolerations[0].operator".
func flatten(objs map[string]object) map[string]any {
	out := map[string]any{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if len(v) == 0 {
				out[path] = map[string]any{}
			}
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			if len(v) == 0 {
				out[path] = []any{}
			}
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		default:
			out[path] = v
		}
	}
	for k, o := range objs {
		for f, v := range o {
			walk(k+" "+f, v)
		}
	}
	return out
}

// changes are the leaves of objs that differ from base: the new value, or
// nil for a leaf that is gone.
func changes(base, objs map[string]object) map[string]any {
	b, o := flatten(base), flatten(objs)
	out := map[string]any{}
	for p, v := range o {
		if w, ok := b[p]; !ok || !cmp.Equal(v, w) {
			out[p] = v
		}
	}
	for p := range b {
		if _, ok := o[p]; !ok {
			out[p] = nil
		}
	}
	return out
}

const (
	cm  = "ConfigMap/kube-system/ipvs-proxy data."
	ds  = "DaemonSet/kube-system/ipvs-proxy spec."
	pod = ds + "template.spec."
	run = pod + "containers[0]."
	pre = pod + "initContainers[0]."
)

// TestValues: each value lands where it should, and nowhere else: the
// rendering differs from the default one in exactly these leaves.
func TestValues(t *testing.T) {
	base := render(t, nil)
	for _, tc := range []struct {
		name string
		vals string
		want map[string]any
	}{
		{"scheduler", `config: {ipvs: {scheduler: wlc, schedulerFlags: ""}}`, map[string]any{
			cm + "config.yaml.ipvs.scheduler": "wlc"}},
		{"strict ARP", `config: {ipvs: {strictARP: true}}`, map[string]any{
			cm + "config.yaml.ipvs.strictARP": true}},
		{"conntrack", `config: {conntrack: {maxPerCore: 0}}`, map[string]any{
			cm + "config.yaml.conntrack.maxPerCore": float64(0)}},
		{"cluster CIDRs", `config: {clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/56"]}`, map[string]any{
			cm + "config.yaml.clusterCIDRs":    nil,
			cm + "config.yaml.clusterCIDRs[0]": "10.244.0.0/16",
			cm + "config.yaml.clusterCIDRs[1]": "fd00:10:244::/56"}},
		{"node-port addresses", `config: {nodePortAddresses: [192.168.0.0/16]}`, map[string]any{
			cm + "config.yaml.nodePortAddresses":    nil,
			cm + "config.yaml.nodePortAddresses[0]": "192.168.0.0/16"}},
		{"metrics address: config and the container's port", `config: {metricsBindAddress: "0.0.0.0:9100"}`, map[string]any{
			cm + "config.yaml.metricsBindAddress": "0.0.0.0:9100",
			run + "ports[1].containerPort":        float64(9100)}},
		{"no metrics: no port", `config: {metricsBindAddress: ""}`, map[string]any{
			cm + "config.yaml.metricsBindAddress": "",
			run + "ports[1].name":                 nil,
			run + "ports[1].containerPort":        nil,
			run + "ports[1].protocol":             nil}},
		{"health address: config, port and probes", `config: {healthzBindAddress: "[::]:10266"}`, map[string]any{
			cm + "config.yaml.healthzBindAddress": "[::]:10266",
			run + "ports[0].containerPort":        float64(10266),
			run + "startupProbe.httpGet.port":     float64(10266),
			run + "livenessProbe.httpGet.port":    float64(10266),
			run + "readinessProbe.httpGet.port":   float64(10266)}}, // host: 127.0.0.1, as by default
		// The probes ask the address the server binds, never the pod's IP:
		// a host-network pod's is the node's address at its start.
		{"health address: one address, the probes' host", `config: {healthzBindAddress: "192.0.2.10:10256"}`, map[string]any{
			cm + "config.yaml.healthzBindAddress": "192.0.2.10:10256",
			run + "startupProbe.httpGet.host":     "192.0.2.10",
			run + "livenessProbe.httpGet.host":    "192.0.2.10",
			run + "readinessProbe.httpGet.host":   "192.0.2.10"}},
		{"health address: one IPv6 address, the probes' host", `config: {healthzBindAddress: "[2001:db8::10]:10256"}`, map[string]any{
			cm + "config.yaml.healthzBindAddress": "[2001:db8::10]:10256",
			run + "startupProbe.httpGet.host":     "2001:db8::10",
			run + "livenessProbe.httpGet.host":    "2001:db8::10",
			run + "readinessProbe.httpGet.host":   "2001:db8::10"}},
		// Helm merges maps: requests.memory stays 64Mi (null removes it).
		{"resources", `resources: {requests: {cpu: 200m}, limits: {memory: 256Mi}}`, map[string]any{
			run + "resources.requests.cpu":  "200m",
			run + "resources.limits.memory": "256Mi"}},
		{"resources: null removes", `resources: {requests: {memory: null}}`, map[string]any{
			run + "resources.requests.memory": nil}},
		{"tolerations", `tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]`, map[string]any{
			pod + "tolerations[0].key":    "node-role.kubernetes.io/control-plane",
			pod + "tolerations[0].effect": "NoSchedule"}},
		{"image", `image: {repository: registry.example.com/ipvs-proxy, tag: v1, pullPolicy: Always}`, map[string]any{
			run + "image":           "registry.example.com/ipvs-proxy:v1",
			pre + "image":           "registry.example.com/ipvs-proxy:v1",
			run + "imagePullPolicy": "Always",
			pre + "imagePullPolicy": "Always",
			// The version label follows the image's tag.
			"ServiceAccount/kube-system/ipvs-proxy metadata.labels.app.kubernetes.io/version": "v1",
			"ClusterRole/<nil>/ipvs-proxy metadata.labels.app.kubernetes.io/version":          "v1",
			"ClusterRoleBinding/<nil>/ipvs-proxy metadata.labels.app.kubernetes.io/version":   "v1",
			"ConfigMap/kube-system/ipvs-proxy metadata.labels.app.kubernetes.io/version":      "v1",
			ds[:len(ds)-len("spec.")] + "metadata.labels.app.kubernetes.io/version":           "v1",
			ds + "template.metadata.labels.app.kubernetes.io/version":                         "v1"}},
		{"image digest", `image: {digest: "sha256:` + strings.Repeat("ab", 32) + `"}`, map[string]any{
			run + "image": "ipvs-proxy@sha256:" + strings.Repeat("ab", 32),
			pre + "image": "ipvs-proxy@sha256:" + strings.Repeat("ab", 32)}},
		{"takeover", `config: {takeoverKubeProxy: true}`, map[string]any{
			cm + "config.yaml.takeoverKubeProxy": true}},
		{"migration: only the migrated nodes", `migration: {migratedNodesOnly: true}`, map[string]any{
			pod + "nodeSelector.ipvs-proxy.io/migrated": "true"}},
		{"apiserver", `apiServer: https://10.0.0.1:6443`, map[string]any{
			cm + "kubeconfig.conf.clusters[0].cluster.server": "https://10.0.0.1:6443"}},
		{"environment", `env: [{name: GOMEMLIMIT, value: 200MiB}]`, map[string]any{
			run + "env[3].name":  "GOMEMLIMIT",
			run + "env[3].value": "200MiB"}},
		{"pod annotations", `podAnnotations: {prometheus.io/scrape: "true"}`, map[string]any{
			pod[:len(pod)-len("spec.")] + "metadata.annotations.prometheus.io/scrape": "true"}},
		{"seccomp profile of one's own", `podSecurityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/ipvs-proxy.json}}`, map[string]any{
			pod + "securityContext.seccompProfile.type":             "Localhost",
			pod + "securityContext.seccompProfile.localhostProfile": "profiles/ipvs-proxy.json"}},
		{"no pod securityContext", `podSecurityContext: null`, map[string]any{
			pod + "securityContext.seccompProfile.type": nil}},
		{"extra args of run", `extraArgs: [--v=2]`, map[string]any{
			run + "command[4]": "--v=2"}},
		{"preflight: extra args and resources", `preflight: {extraArgs: [--all-schedulers], resources: {limits: {memory: 128Mi}}}`, map[string]any{
			pre + "command[5]":              "--all-schedulers",
			pre + "resources.limits.memory": "128Mi"}},
		{"extra volumes in both containers", `{extraVolumes: [{name: kube-proxy, configMap: {name: kube-proxy}}], extraVolumeMounts: [{name: kube-proxy, mountPath: /var/lib/kube-proxy}]}`, map[string]any{
			pod + "volumes[5].name":           "kube-proxy",
			pod + "volumes[5].configMap.name": "kube-proxy",
			run + "volumeMounts[4].name":      "kube-proxy",
			run + "volumeMounts[4].mountPath": "/var/lib/kube-proxy",
			pre + "volumeMounts[4].name":      "kube-proxy",
			pre + "volumeMounts[4].mountPath": "/var/lib/kube-proxy",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
				t.Fatal(err)
			}
			got := changes(base, render(t, vals))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("values %s: changes (-want +got):\n%s", tc.vals, diff)
			}
		})
	}
}

// TestNamespace: every namespaced object, the binding's subject and the
// kubeconfig's context follow the release's namespace.
func TestNamespace(t *testing.T) {
	ms, err := Render(chartDir, "ipvs-proxy", "net-system", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := parse(t, "chart", Stream(ms))
	want := map[string]string{
		"ServiceAccount/net-system/ipvs-proxy metadata.namespace":                            "net-system",
		"ConfigMap/net-system/ipvs-proxy metadata.namespace":                                 "net-system",
		"DaemonSet/net-system/ipvs-proxy metadata.namespace":                                 "net-system",
		"ClusterRoleBinding/<nil>/ipvs-proxy subjects[0].namespace":                          "net-system",
		"ConfigMap/net-system/ipvs-proxy data.kubeconfig.conf.contexts[0].context.namespace": "net-system",
	}
	flat := flatten(got)
	for p, v := range want {
		if flat[p] != v {
			t.Errorf("%s = %v, want %s", p, flat[p], v)
		}
	}
	for p, v := range flat {
		if v == namespace {
			t.Errorf("%s is still %s", p, namespace)
		}
	}
}

// TestBadValues: a mistake in the values is an error at install time that
// names it, not an agent that fails on the node.
func TestBadValues(t *testing.T) {
	for _, tc := range []struct{ vals, want string }{
		{`config: {ipvs: {strictArp: true}}`, "strictArp"},
		{`config: {strictARP: true}`, "strictARP"},
		{`config: {ipvs: {syncPeriod: 30}}`, "syncPeriod"},
		{`config: {clientConnection: {kubeconfig: /x}}`, "clientConnection"},
		{`config: {clusterCIDRs: 10.244.0.0/16}`, "clusterCIDRs"},
		{`config: {healthzBindAddress: "127.0.0.1:10256"}`, "load balancers"},
		{`config: {metricsBindAddress: "0.0.0.0"}`, "metricsBindAddress"},
		{`config: {logging: {format: text}}`, "format"},
		{`toleration: []`, "toleration"},
		{`apiServer: ""`, "apiServer"},
		{`podSecurityContext: {seccompProfile: {type: Default}}`, "type"},
		// Both monitors would scrape every agent twice; a monitor of a
		// metrics address turned off, nothing.
		{`{serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}`, "enable one"},
		{`{podMonitor: {enabled: true}, config: {metricsBindAddress: ""}}`, "metricsBindAddress is empty"},
		{`serviceMonitor: {enabled: true, interval: 30}`, "interval"},
		{`monitoring: {job: ""}`, "job"},
	} {
		var vals map[string]any
		if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
			t.Fatal(err)
		}
		_, err := Render(chartDir, "ipvs-proxy", namespace, vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %s: error %v, want one naming %q", tc.vals, err, tc.want)
		}
	}
}

// TestNotes: what helm install prints warns while apiServer is the
// placeholder, and not once it is set.
func TestNotes(t *testing.T) {
	notes, err := Notes(chartDir, "ipvs-proxy", namespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(notes, "WARNING: apiServer") {
		t.Errorf("notes with the placeholder apiServer have no warning:\n%s", notes)
	}
	notes, err = Notes(chartDir, "ipvs-proxy", namespace, map[string]any{"apiServer": "https://10.0.0.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(notes, "WARNING") || !strings.Contains(notes, "rollout status ds/ipvs-proxy") {
		t.Errorf("notes:\n%s", notes)
	}
}

// TestSchemaNamesEveryValue: values.schema.json, which refuses unknown
// keys, knows every key of values.yaml, config's in their groups (and so,
// by TestDefaultRenderingIsDeploy, deploy/'s config.yaml), and names none
// that values.yaml lacks: every value is documented with its default. An
// object the schema leaves open (resources, labels) is one value.
func TestSchemaNamesEveryValue(t *testing.T) {
	var schema schemaObject
	var values map[string]any
	for f, into := range map[string]any{"values.schema.json": &schema, "values.yaml": &values} {
		b, err := os.ReadFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	got, want := schema.paths(schema.Definitions, ""), schema.valuePaths(schema.Definitions, "", values)
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the schema's keys differ from values.yaml's (-values +schema):\n%s", diff)
	}
	if !slices.Contains(got, "config.ipvs.syncPeriod") {
		t.Errorf("the schema's keys miss config.ipvs.syncPeriod: %v", got)
	}
}

// schemaObject is an object of a JSON schema, with its properties.
type schemaObject struct {
	Ref         string                  `json:"$ref"`
	Properties  map[string]schemaObject `json:"properties"`
	Definitions map[string]schemaObject `json:"definitions"`
}

// resolve follows o's $ref into defs.
func (o schemaObject) resolve(defs map[string]schemaObject) schemaObject {
	if name, ok := strings.CutPrefix(o.Ref, "#/definitions/"); ok {
		return defs[name]
	}
	return o
}

// paths lists the dotted paths of o's leaf properties, under prefix.
func (o schemaObject) paths(defs map[string]schemaObject, prefix string) []string {
	var out []string
	for name, p := range o.Properties {
		if p = p.resolve(defs); len(p.Properties) > 0 {
			out = append(out, p.paths(defs, prefix+name+".")...)
		} else {
			out = append(out, prefix+name)
		}
	}
	return out
}

// valuePaths lists the dotted paths of vals, under prefix, descending
// into a mapping where o has properties for it.
func (o schemaObject) valuePaths(defs map[string]schemaObject, prefix string, vals map[string]any) []string {
	var out []string
	for name, v := range vals {
		p := o.Properties[name].resolve(defs)
		if m, ok := v.(map[string]any); ok && len(p.Properties) > 0 {
			out = append(out, p.valuePaths(defs, prefix+name+".", m)...)
		} else {
			out = append(out, prefix+name)
		}
	}
	return out
}
