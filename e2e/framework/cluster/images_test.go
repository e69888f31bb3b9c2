package cluster

import (
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/manifest"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
)

// TestProxyImageIsDeploys: the bed imports ipvs-proxy's image under the
// name deploy/daemonset.yaml's containers ask for (IfNotPresent, no
// registry): were they to differ, every cluster's agent would wait for a
// pull that never comes.
func TestProxyImageIsDeploys(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ProxyImage(root)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.ReadDir(filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				m, _ := c.(map[string]any)
				if seen++; m["image"] != ref {
					t.Errorf("DaemonSet %s %s %v: image %v, the bed imports %s", o.GetName(), field, m["name"], m["image"], ref)
				}
			}
		}
	}
	if seen != 2 {
		t.Errorf("%d containers in deploy/'s DaemonSets, want 2 (preflight, ipvs-proxy)", seen)
	}
}
