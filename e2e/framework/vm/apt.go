package vm

import (
	"bytes"
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

// Debian package handling: everything is fetched with `apt-get download`
// and unpacked with `dpkg-deb -x`; nothing is installed into /.

// errDownload marks a failed `apt-get download`, which stale package lists
// cause (the mirror drops superseded versions).
var errDownload = errors.New("apt-get download failed")

// runCmd runs a command and returns its stdout; the error carries the tail
// of its stderr.
func runCmd(ctx context.Context, dir string, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	return stdout.String(), nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// aptListsDir holds apt's package lists.
const aptListsDir = "/var/lib/apt/lists"

// kernelABI resolves the kernel ABI ("6.1.0-48-amd64") behind the
// linux-image-amd64 metapackage from the local package lists. The answer is
// remembered in cacheDir for as long as the lists are unchanged, since
// apt-cache takes most of a second to read them.
func kernelABI(ctx context.Context, cacheDir string) (string, error) {
	memo := ""
	if stamp := aptListsStamp(); stamp != "" {
		memo = filepath.Join(cacheDir, "kernel-abi-"+stamp)
		if b, err := os.ReadFile(memo); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return string(bytes.TrimSpace(b)), nil
		}
	}
	out, err := runCmd(ctx, "", "apt-cache", "depends", "linux-image-amd64")
	if err != nil {
		return "", err
	}
	abi, err := parseKernelABI(out)
	if err == nil && memo != "" {
		// Old memos are tiny; drop them anyway.
		old, _ := filepath.Glob(filepath.Join(cacheDir, "kernel-abi-*"))
		for _, o := range old {
			os.Remove(o)
		}
		_ = os.WriteFile(memo, []byte(abi+"\n"), 0o644)
	}
	return abi, err
}

// aptListsStamp is a digest of the names, sizes and times of apt's
// package lists ("" if there are none).
func aptListsStamp() string {
	ents, err := os.ReadDir(aptListsDir)
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
	if b.Len() == 0 {
		return ""
	}
	return shortHash(b.String())
}

func parseKernelABI(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: linux-image-")
		if ok && dep != "" && dep[0] >= '0' && dep[0] <= '9' {
			return strings.Fields(dep)[0], nil
		}
	}
	return "", fmt.Errorf("no linux-image-<ABI> dependency in `apt-cache depends linux-image-amd64`: %q", tail(out, 500))
}

// aptUpdate refreshes the package lists; only root can.
func aptUpdate(ctx context.Context, logf func(string, ...any)) error {
	if os.Geteuid() != 0 {
		return errors.New("apt-get update needs root")
	}
	logf("vm: running apt-get update")
	_, err := runCmd(ctx, "", "apt-get", "update")
	return err
}

// aptDownload fetches the packages' .deb files into dir.
func aptDownload(ctx context.Context, dir string, pkgs []string) error {
	args := []string{"download"}
	if os.Geteuid() == 0 {
		// apt drops to the _apt user, which cannot write to dir; say so
		// instead of letting it warn for every package.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	args = append(args, pkgs...)
	if _, err := runCmd(ctx, dir, "apt-get", args...); err != nil {
		return fmt.Errorf("%w: %v", errDownload, err)
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

// extractDebs unpacks the packages' .deb files from debDir into root.
func extractDebs(ctx context.Context, debDir, root string, pkgs []string, versions map[string]string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	for _, p := range pkgs {
		deb, version, err := debFile(debDir, p)
		if err != nil {
			return err
		}
		if _, err := runCmd(ctx, "", "dpkg-deb", "-x", deb, root); err != nil {
			return err
		}
		if versions != nil {
			versions[p] = version
		}
	}
	return nil
}

// depGroup is one dependency: alternatives, any of which satisfies it.
type depGroup []string

// parseDepends parses `apt-cache depends` output (Depends and PreDepends
// only) into each package's dependency groups. A virtual package's
// providers join its group.
func parseDepends(out string) map[string][]depGroup {
	deps := map[string][]depGroup{}
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
				deps[pkg] = append(deps[pkg], depGroup{depName(name)})
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

// installedPackages reports which of pkgs dpkg has installed on this host.
func installedPackages(ctx context.Context, pkgs []string) map[string]bool {
	out, _ := runCmd(ctx, "", "dpkg-query", append([]string{"-W", "-f=${Package}\t${db:Status-Status}\n"}, pkgs...)...)
	inst := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if name, status, ok := strings.Cut(line, "\t"); ok && status == "installed" {
			inst[name] = true
		}
	}
	return inst
}

// hostPackages lists the packages to unpack so that roots run on this host:
// the roots, and the closure of their dependencies that the host has not
// installed. The dependencies of packages in noFollow are not followed;
// packages in skip are left out.
func hostPackages(ctx context.Context, roots []string, noFollow, skip map[string]bool) ([]string, error) {
	want := map[string]bool{}
	for _, r := range roots {
		want[r] = true
	}
	var level []string
	for _, r := range roots {
		if !noFollow[r] {
			level = append(level, r)
		}
	}
	for len(level) > 0 {
		out, err := runCmd(ctx, "", "apt-cache", append([]string{"depends", "--no-recommends", "--no-suggests",
			"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, level...)...)
		if err != nil {
			return nil, err
		}
		deps := parseDepends(out)
		var names []string
		for _, p := range level {
			for _, g := range deps[p] {
				names = append(names, g...)
			}
		}
		inst := installedPackages(ctx, names)
		var next []string
		for _, p := range level {
			for _, g := range deps[p] {
				choice := ""
				for _, alt := range g {
					if inst[alt] || want[alt] || skip[alt] {
						choice = ""
						break
					}
					if choice == "" && !strings.HasPrefix(alt, "<") {
						choice = alt
					}
				}
				if choice != "" && !want[choice] {
					want[choice] = true
					if !noFollow[choice] {
						next = append(next, choice)
					}
				}
			}
		}
		level = next
	}
	var pkgs []string
	for p := range want {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	return pkgs, nil
}
