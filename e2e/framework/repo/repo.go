// Package repo finds the repository's Go modules on disk: the agent's at
// the root and the bed's in e2e/, so that the bed builds each package in
// the module that holds it, from tests (which run in their package's
// folder) as from the Makefile's commands (which run at the root).
package repo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const (
	// RootModule is the agent's module, at the repository's root.
	RootModule = "github.com/ipvs-proxy/ipvs-proxy"
	// E2EModule is the bed's module, in e2e/ (RootModule requires nothing
	// of it; it requires RootModule through a replace).
	E2EModule = RootModule + "/e2e"
)

// Root is the repository's root: the first folder at or above the working
// directory whose go.mod is RootModule's.
func Root() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("repository root: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if modulePath(filepath.Join(d, "go.mod")) == RootModule {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("repository root: no go.mod of %s at or above %s", RootModule, wd)
		}
	}
}

// ModuleDir is the folder to run go in for package pkg, an import path:
// e2e/ for the bed's packages (E2EModule), the root for the agent's, which
// so build with the agent's own go.mod, as `make build` builds them.
func ModuleDir(pkg string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	if pkg == E2EModule || strings.HasPrefix(pkg, E2EModule+"/") {
		return filepath.Join(root, "e2e"), nil
	}
	return root, nil
}

// modulePath is the module path that the go.mod at path declares, or "".
func modulePath(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}
