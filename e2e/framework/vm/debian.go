package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// UnpackDebianPackages fetches pkgs with `apt-get download` into dir/debs
// and unpacks them with `dpkg-deb -x` into dir/root, the same way the VM's
// assets are made (nothing is installed into /). Package lists too stale
// for the mirror get one `apt-get update` and a retry. It returns the root
// and each package's version. Other tools use it too (the container image
// builder takes Debian's iptables from it).
func UnpackDebianPackages(ctx context.Context, dir string, pkgs []string, logf func(string, ...any)) (root string, versions map[string]string, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	debs, root := filepath.Join(dir, "debs"), filepath.Join(dir, "root")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	err = aptDownload(ctx, debs, pkgs)
	if errors.Is(err, errDownload) {
		logf("debian packages: %v", err)
		if uerr := aptUpdate(ctx, logf); uerr != nil {
			return "", nil, fmt.Errorf("debian packages: %w (apt-get update: %v)", err, uerr)
		}
		err = aptDownload(ctx, debs, pkgs)
	}
	if err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	versions = map[string]string{}
	if err := extractDebs(ctx, debs, root, pkgs, versions); err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	return root, versions, nil
}

// DebianClosure lists roots and every package they depend on (Depends and
// PreDepends, recursively, the first alternative of each dependency unless
// another is already in), sorted. Nothing is skipped for being installed
// on this host: the result is a self-contained userland, e.g. for a
// container image.
func DebianClosure(ctx context.Context, roots []string) ([]string, error) {
	want := map[string]bool{}
	for _, r := range roots {
		want[r] = true
	}
	level := append([]string(nil), roots...)
	for len(level) > 0 {
		out, err := runCmd(ctx, "", "apt-cache", append([]string{"depends", "--no-recommends", "--no-suggests",
			"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, level...)...)
		if err != nil {
			return nil, fmt.Errorf("debian dependencies: %w", err)
		}
		deps := parseDepends(out)
		var next []string
		for _, p := range level {
			for _, g := range deps[p] {
				choice := ""
				for _, alt := range g {
					if want[alt] {
						choice = ""
						break
					}
					if choice == "" && !strings.HasPrefix(alt, "<") {
						choice = alt
					}
				}
				if choice != "" && !want[choice] {
					want[choice] = true
					next = append(next, choice)
				}
			}
		}
		level = next
	}
	pkgs := make([]string, 0, len(want))
	for p := range want {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	return pkgs, nil
}
