package helm

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// chartMeta is Chart.yaml's name and versions.
type chartMeta struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func readChartMeta(t *testing.T) chartMeta {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m chartMeta
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	return m
}

// labelsAt reads the string map at path (dotted) of o.
func labelsAt(o object, path ...string) map[string]string {
	var cur any = o
	for _, p := range path {
		m, _ := cur.(map[string]any)
		cur = m[p]
	}
	out := map[string]string{}
	m, _ := cur.(map[string]any)
	for k, v := range m {
		s, _ := v.(string)
		out[k] = s
	}
	return out
}

// TestStandardLabels: every object carries Kubernetes' recommended labels
// and k8s-app, the release's name as its instance and the image's version;
// the pods the same but helm.sh/chart (a new chart of the same image
// restarts no agent), values' podLabels beside them; the DaemonSet's
// selector stays the name alone (it is immutable: an upgrade from chart
// 0.2.0 or deploy/ must not need the DaemonSet deleted).
func TestStandardLabels(t *testing.T) {
	meta := readChartMeta(t)
	for _, tc := range []struct {
		name, release, vals string
		version             string
		podExtra            map[string]string
	}{
		{name: "default", release: "ipvs-proxy", version: meta.AppVersion},
		{name: "release name and image tag", release: "edge", vals: `image: {tag: v9.1.0}`, version: "v9.1.0"},
		{name: "pod labels", release: "ipvs-proxy", version: meta.AppVersion,
			vals:     `podLabels: {team: net, app.kubernetes.io/name: other}`,
			podExtra: map[string]string{"team": "net"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
				t.Fatal(err)
			}
			ms, err := Render(chartDir, tc.release, namespace, vals)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"app.kubernetes.io/name":       "ipvs-proxy",
				"app.kubernetes.io/instance":   tc.release,
				"app.kubernetes.io/version":    tc.version,
				"app.kubernetes.io/managed-by": "Helm",
				"helm.sh/chart":                meta.Name + "-" + meta.Version,
				"k8s-app":                      "ipvs-proxy",
			}
			for k, o := range parse(t, "chart", Stream(ms)) {
				if diff := cmp.Diff(want, labelsAt(o, "metadata", "labels")); diff != "" {
					t.Errorf("%s labels (-want +got):\n%s", k, diff)
				}
				if o["kind"] != "DaemonSet" {
					continue
				}
				pod := maps.Clone(want)
				delete(pod, "helm.sh/chart")
				maps.Copy(pod, tc.podExtra)
				if diff := cmp.Diff(pod, labelsAt(o, "spec", "template", "metadata", "labels")); diff != "" {
					t.Errorf("%s pod labels (-want +got):\n%s", k, diff)
				}
				sel := map[string]string{"app.kubernetes.io/name": "ipvs-proxy"}
				if diff := cmp.Diff(sel, labelsAt(o, "spec", "selector", "matchLabels")); diff != "" {
					t.Errorf("%s selector (-want +got):\n%s", k, diff)
				}
			}
		})
	}
}

// TestImageIsAppVersion: the image's tag is the chart's appVersion, a
// release's version (vMAJOR.MINOR.PATCH, as `git describe` names a tagged
// build and `ipvs-proxy --version` prints it), not latest.
func TestImageIsAppVersion(t *testing.T) {
	meta := readChartMeta(t)
	if !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(meta.AppVersion) {
		t.Errorf("Chart.yaml's appVersion %q is no release version (vX.Y.Z)", meta.AppVersion)
	}
	flat := flatten(render(t, nil))
	for _, p := range []string{run + "image", pre + "image"} {
		if want := "ipvs-proxy:" + meta.AppVersion; flat[p] != want {
			t.Errorf("%s = %v, want %s", p, flat[p], want)
		}
	}
}

// TestServiceAccount: serviceAccount.name names the account the pods run
// as and the ClusterRoleBinding binds; create: false uses an existing one
// (no ServiceAccount rendered).
func TestServiceAccount(t *testing.T) {
	for _, tc := range []struct {
		vals        string
		name        string
		created     bool
		annotations map[string]string
	}{
		{vals: ``, name: "ipvs-proxy", created: true, annotations: map[string]string{}},
		{vals: `serviceAccount: {name: proxy, annotations: {a: b}}`, name: "proxy", created: true, annotations: map[string]string{"a": "b"}},
		{vals: `serviceAccount: {create: false, name: existing}`, name: "existing"},
	} {
		var vals map[string]any
		if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
			t.Fatal(err)
		}
		objs := render(t, vals)
		flat := flatten(objs)
		if got := flat[pod+"serviceAccountName"]; got != tc.name {
			t.Errorf("values %q: pods run as %v, want %s", tc.vals, got, tc.name)
		}
		if got := flat["ClusterRoleBinding/<nil>/ipvs-proxy subjects[0].name"]; got != tc.name {
			t.Errorf("values %q: the binding binds %v, want %s", tc.vals, got, tc.name)
		}
		var accounts []string
		for k, o := range objs {
			if o["kind"] == "ServiceAccount" {
				accounts = append(accounts, k)
				if diff := cmp.Diff(tc.annotations, labelsAt(o, "metadata", "annotations")); diff != "" {
					t.Errorf("values %q: %s annotations (-want +got):\n%s", tc.vals, k, diff)
				}
			}
		}
		var want []string
		if tc.created {
			want = []string{"ServiceAccount/kube-system/" + tc.name}
		}
		if diff := cmp.Diff(want, accounts); diff != "" {
			t.Errorf("values %q: ServiceAccounts rendered (-want +got):\n%s", tc.vals, diff)
		}
	}
}
