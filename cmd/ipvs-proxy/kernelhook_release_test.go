//go:build !faultinject

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReleaseBuildHasNoFaultInjection: the binary `make build` makes has
// no fault injection flag, and does not link the fault injector at all.
func TestReleaseBuildHasNoFaultInjection(t *testing.T) {
	fs := newRunCommand().Flags()
	for _, name := range []string{"inject-write-failures", "inject-seed"} {
		if fs.Lookup(name) != nil {
			t.Errorf("the released run command has --%s", name)
		}
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasSuffix(pkg, "/cmd/ipvs-proxy/faults") || strings.HasSuffix(pkg, "/fake") {
			t.Errorf("the released binary links %s", pkg)
		}
	}
	out, err = exec.Command("go", "list", "-deps", "-tags", "faultinject", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -tags faultinject: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "/cmd/ipvs-proxy/faults\n") {
		t.Errorf("the faultinject build does not link the fault injector (is the check above still meaningful?)")
	}
}
