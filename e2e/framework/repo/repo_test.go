package repo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRootAndModuleDirs(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	// This test runs in e2e/framework/repo.
	if wd, _ := os.Getwd(); filepath.Join(root, "e2e", "framework", "repo") != wd {
		t.Errorf("Root() = %s, from %s", root, wd)
	}
	for pkg, want := range map[string]string{
		RootModule + "/cmd/ipvs-proxy":      root,
		RootModule + "/netlinkutil":         root,
		RootModule + "/netlinkutil/nettest": root,
		E2EModule + "/framework/vm":         filepath.Join(root, "e2e"),
		RootModule + "/e2efoo":              root,
		"k8s.io/kubernetes/cmd/kube-proxy":  root,
	} {
		if got, err := ModuleDir(pkg); err != nil || got != want {
			t.Errorf("ModuleDir(%s) = %s, %v; want %s", pkg, got, err, want)
		}
	}
	if modulePath(filepath.Join(root, "e2e", "go.mod")) != E2EModule {
		t.Errorf("e2e/go.mod does not declare %s", E2EModule)
	}
}
