package kube

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoClientset: the agent's binary, as `make build` builds
// it, links none of client-go's Clientset, typed clients, discovery,
// informers or apply configurations, and of k8s.io/api only the groups
// the agent reads (see the package's doc). A new import of any of them
// from the agent's code brings back every API group: this fails first.
func TestBinaryLinksNoClientset(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to list the binary's packages: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-deps", "github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/ipvs-proxy: %v", err)
	}
	allowed := map[string]bool{"k8s.io/api/core/v1": true, "k8s.io/api/discovery/v1": true, "k8s.io/api/networking/v1": true}
	banned := []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/discovery", "k8s.io/client-go/informers",
		"k8s.io/client-go/applyconfigurations", "k8s.io/client-go/gentype", "k8s.io/client-go/testing"}
	var apiGroups int
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/api/") {
			apiGroups++
			if !allowed[pkg] {
				t.Errorf("the binary links %s, an API group the agent does not use", pkg)
			}
		}
		for _, b := range banned {
			if pkg == b || strings.HasPrefix(pkg, b+"/") {
				t.Errorf("the binary links %s (client-go's generated clients link every API group)", pkg)
			}
		}
	}
	if apiGroups != len(allowed) {
		t.Errorf("the binary links %d k8s.io/api packages, want the %d the agent reads", apiGroups, len(allowed))
	}
}
