package ipvsproxy_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/ipvs-proxy/ipvs-proxy"

// floors are the floors of the agent's packages, from the ground up (the
// README's "Floors"): a package may import its own floor or lower ones. The
// longest prefix names a package's floor; a package no prefix names fails
// the test, so a new one is placed on purpose.
var floors = map[string]int{
	"scheduler":             0,
	"netlinkutil/ktypes":    0,
	"netlinkutil/nlbatch":   0,
	"netlinkutil/kmod":      0,
	"netlinkutil/nettest":   0,
	"netlinkutil/nltest":    0,
	"netlinkutil/probe":     0,
	"proxier/nodelock":      0,
	"proxier/kube":          0,
	"proxier/background":    0,
	"netlinkutil":           1,
	"ipset":                 1,
	"netlinkutil/fake":      2,
	"ipset/fake":            2,
	"proxier/model":         3,
	"proxier/consumer":      4,
	"proxier/reconciler":    5,
	"proxier/glue":          5,
	"proxier/healthcheck":   5,
	"proxier/sysctls":       5,
	"proxier/ctwatch":       5,
	"proxier/tunnelend":     5,
	"proxier/agent":         6,
	"proxier/config":        7,
	"proxier/opsserver":     7,
	"proxier/status":        8,
	"proxier/preflight":     8,
	"proxier/cleanup":       8,
	"proxier":               9, // no code; nothing may import it
	"deploy":                9,
	"cmd/ipvs-proxy":        10,
	"cmd/ipvs-proxy/faults": 10,
	"":                      10, // the repository's own tests (this package)
}

// floorOf is the floor of a package of the module (its path without the
// module's), by the longest prefix in floors.
func floorOf(rel string) (int, bool) {
	best, floor := -1, 0
	for p, f := range floors {
		if (rel == p || p == "" || strings.HasPrefix(rel, p+"/")) && len(p) > best {
			best, floor = len(p), f
		}
	}
	return floor, best >= 0 && (best > 0 || rel == "")
}

// TestImportsNeverGoUp: no package of the agent's module imports a package
// on a higher floor, and no package under proxier/ imports proxier itself.
func TestImportsNeverGoUp(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	arrows := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		ff, ok := floorOf(from)
		if !ok {
			t.Errorf("package %q has no floor: add it to floors", from)
			continue
		}
		for _, imp := range f[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			arrows++
			if tf, _ := floorOf(to); tf > ff || to == "proxier" {
				t.Errorf("%s (floor %d) imports %s (floor %d): an arrow running up", from, ff, to, tf)
			}
		}
	}
	if arrows < 50 {
		t.Errorf("only %d imports within the module seen: go list's output is not what this test reads", arrows)
	}
}
