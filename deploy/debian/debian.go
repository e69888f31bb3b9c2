// Package debian resolves, downloads and unpacks Debian packages with the
// host's apt: dependencies are read with `apt-cache depends`, packages
// fetched with `apt-get download` and unpacked with `dpkg-deb -x` into a
// folder of the caller's; nothing is installed into /. The release image
// (deploy/image) takes its userland from it, and the test bed's VM
// (e2e/framework/vm) its QEMU, kernel and guest tools.
package debian

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// ListsDir holds apt's package lists.
const ListsDir = "/var/lib/apt/lists"

// ErrDownload marks a failed `apt-get download`, which stale package lists
// cause (the mirror drops superseded versions); Update and a retry mend it.
var ErrDownload = errors.New("apt-get download failed")

// run runs a command in dir and returns its stdout; the error carries the
// tail of its stderr.
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		if len(stderr) > 2000 {
			stderr = "..." + stderr[len(stderr)-2000:]
		}
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out), nil
}

// ListsState describes apt's package lists (names, sizes and times), ""
// if there are none: what a memo of an answer read from them is keyed on.
func ListsState() string {
	ents, err := os.ReadDir(ListsDir)
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range ents {
		if !strings.Contains(e.Name(), "_Packages") {
			continue
		}
		if info, err := e.Info(); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
		}
	}
	return b.String()
}

// Update refreshes the package lists; only root can.
func Update(ctx context.Context, logf func(string, ...any)) error {
	if os.Geteuid() != 0 {
		return errors.New("apt-get update needs root")
	}
	logf("debian packages: running apt-get update")
	_, err := run(ctx, "", "apt-get", "update")
	return err
}

// Download fetches the packages' .deb files into dir; its error wraps
// ErrDownload.
func Download(ctx context.Context, dir string, pkgs []string) error {
	args := []string{"download"}
	if os.Geteuid() == 0 {
		// apt drops to the _apt user, which cannot write to dir; say so
		// instead of letting it warn for every package.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	args = append(args, pkgs...)
	if _, err := run(ctx, dir, "apt-get", args...); err != nil {
		return fmt.Errorf("%w: %w", ErrDownload, err)
	}
	return nil
}

// debFile finds the downloaded .deb of pkg in dir and its version.
func debFile(dir, pkg string) (path, version string, err error) {
	matches, err := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if err != nil {
		return "", "", err
	}
	if len(matches) != 1 {
		return "", "", fmt.Errorf("want one %s_*.deb in %s, found %d", pkg, dir, len(matches))
	}
	parts := strings.Split(strings.TrimSuffix(filepath.Base(matches[0]), ".deb"), "_")
	if len(parts) == 3 {
		version, _ = url.PathUnescape(parts[1]) // the epoch's ':' is %3a
	}
	return matches[0], version, nil
}

// Extract unpacks the packages' .deb files from debDir (as Download left
// them) into root and, if versions is not nil, records each one's version.
func Extract(ctx context.Context, debDir, root string, pkgs []string, versions map[string]string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, p := range pkgs {
		deb, version, err := debFile(debDir, p)
		if err != nil {
			return err
		}
		if _, err := run(ctx, "", "dpkg-deb", "-x", deb, root); err != nil {
			return err
		}
		if versions != nil {
			versions[p] = version
		}
	}
	return nil
}

// Unpack downloads pkgs into dir/debs and unpacks them into dir/root.
// Package lists too stale for the mirror get one Update and a retry. It
// returns the root and each package's version.
func Unpack(ctx context.Context, dir string, pkgs []string, logf func(string, ...any)) (root string, versions map[string]string, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	debs, root := filepath.Join(dir, "debs"), filepath.Join(dir, "root")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	err = Download(ctx, debs, pkgs)
	if errors.Is(err, ErrDownload) {
		logf("debian packages: %v", err)
		if uerr := Update(ctx, logf); uerr != nil {
			return "", nil, fmt.Errorf("debian packages: %w (apt-get update: %w)", err, uerr)
		}
		err = Download(ctx, debs, pkgs)
	}
	if err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	versions = map[string]string{}
	if err := Extract(ctx, debs, root, pkgs, versions); err != nil {
		return "", nil, fmt.Errorf("debian packages: %w", err)
	}
	return root, versions, nil
}

// Group is one dependency: alternatives, any of which satisfies it. A
// virtual package ("<python3:any>") is followed by its providers.
type Group []string

// parseDepends parses `apt-cache depends` output (Depends and PreDepends
// only) into each package's dependency groups. A virtual package's
// providers join its group.
func parseDepends(out string) map[string][]Group {
	deps := map[string][]Group{}
	var pkg string
	orNext := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case line == "":
		case !strings.HasPrefix(line, " "):
			pkg, orNext = strings.TrimSpace(line), false
			if _, ok := deps[pkg]; !ok {
				deps[pkg] = nil
			}
		case strings.HasPrefix(line, "    "): // provider of the virtual package above
			if g := deps[pkg]; len(g) > 0 {
				g[len(g)-1] = append(g[len(g)-1], depName(line))
			}
		default:
			kind, name, ok := strings.Cut(strings.TrimSpace(line), ": ")
			if !ok {
				continue
			}
			kind = strings.TrimPrefix(kind, "|")
			if kind != "Depends" && kind != "PreDepends" {
				continue
			}
			if orNext && len(deps[pkg]) > 0 {
				g := deps[pkg]
				g[len(g)-1] = append(g[len(g)-1], depName(name))
			} else {
				deps[pkg] = append(deps[pkg], Group{depName(name)})
			}
			orNext = strings.HasPrefix(line, " |")
		}
	}
	return deps
}

// depName strips spaces and an architecture qualifier ("python3:any").
func depName(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, ':'); i > 0 && !strings.HasPrefix(s, "<") {
		s = s[:i]
	}
	return s
}

// Depends reads the dependencies (Depends and PreDepends) of pkgs from the
// package lists, as groups of alternatives per package.
func Depends(ctx context.Context, pkgs []string) (map[string][]Group, error) {
	out, err := run(ctx, "", "apt-cache", append([]string{"depends", "--no-recommends", "--no-suggests",
		"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("debian dependencies: %w", err)
	}
	return parseDepends(out), nil
}

// installed reports which of pkgs dpkg has installed on this host.
func installed(ctx context.Context, pkgs []string) map[string]bool {
	out, _ := run(ctx, "", "dpkg-query", append([]string{"-W", "-f=${Package}\t${db:Status-Status}\n"}, pkgs...)...)
	return parseInstalled(out)
}

func parseInstalled(out string) map[string]bool {
	inst := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if name, status, ok := strings.Cut(line, "\t"); ok && status == "installed" {
			inst[name] = true
		}
	}
	return inst
}

// ClosureOptions narrow a Closure.
type ClosureOptions struct {
	// NoFollow: the dependencies of these packages are not followed.
	NoFollow map[string]bool
	// Skip: these packages are left out, and a dependency they satisfy
	// needs nothing else.
	Skip map[string]bool
	// ForHost leaves out what dpkg has installed on this host, with what
	// it alone needs: the result runs here. Without it the result is a
	// self-contained userland (e.g. a container image's).
	ForHost bool
}

// Closure lists roots and every package they depend on (Depends and
// PreDepends, recursively; of each dependency the first alternative
// unless one is already in), sorted.
func Closure(ctx context.Context, roots []string, opt ClosureOptions) ([]string, error) {
	return closure(roots, opt, func(pkgs []string) (map[string][]Group, error) { return Depends(ctx, pkgs) },
		func(pkgs []string) map[string]bool { return installed(ctx, pkgs) })
}

// closure is Closure over a dependency reader and an installed-package
// test (asked only ForHost), one level of the dependency tree per call of
// each.
func closure(roots []string, opt ClosureOptions, depends func([]string) (map[string][]Group, error),
	installed func([]string) map[string]bool) ([]string, error) {
	want := map[string]bool{}
	var level []string
	for _, r := range roots {
		want[r] = true
		if !opt.NoFollow[r] {
			level = append(level, r)
		}
	}
	for len(level) > 0 {
		deps, err := depends(level)
		if err != nil {
			return nil, err
		}
		var inst map[string]bool
		if opt.ForHost {
			var names []string
			for _, p := range level {
				for _, g := range deps[p] {
					names = append(names, g...)
				}
			}
			inst = installed(names)
		}
		var next []string
		for _, p := range level {
			for _, g := range deps[p] {
				choice := ""
				for _, alt := range g {
					if inst[alt] || want[alt] || opt.Skip[alt] {
						choice = ""
						break
					}
					if choice == "" && !strings.HasPrefix(alt, "<") {
						choice = alt
					}
				}
				if choice != "" && !want[choice] {
					want[choice] = true
					if !opt.NoFollow[choice] {
						next = append(next, choice)
					}
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
