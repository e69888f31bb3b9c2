package vm

import (
	"context"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Guest layout: merged /usr for libraries (/lib -> usr/lib), separate
// /bin, /sbin, /usr/bin, /usr/sbin as busybox lists its applets.
const guestLibDir = "usr/lib/x86_64-linux-gnu"

// guestModulesFile lists the modules /init loads, one per line, in order.
const guestModulesFile = "etc/vm/modules"

type baseInputs struct {
	out        string // the cpio to write
	abi        string
	busybox    string // static busybox (runs on the host too)
	kernelRoot string // unpacked linux-image package
	guestRoot  string // unpacked guestPackages
	work       string // scratch space
}

type moduleSet struct {
	boot, extra []string // module names; boot in load order
	files       int      // .ko files in the initramfs
}

// buildBaseInitramfs writes the base initramfs: busybox and its applets,
// the kernel modules (closure of bootModules and extraModules) with a
// modules.dep made by busybox depmod, the guest tools with their libraries
// and the dynamic loader, and a few files of /etc. /init and the agent are
// not in it: Start appends them per boot.
func buildBaseInitramfs(ctx context.Context, in baseInputs) (moduleSet, error) {
	ar := newArchive()
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "root", "var", "etc", guestLibDir,
		"bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "lib64"} {
		ar.dir(d, 0o755)
	}
	ar.dir("tmp", 0o1777)
	ar.dir("root", 0o700)
	ar.symlink("lib", "usr/lib")
	ar.symlink("var/run", "../run")
	ar.symlink("var/tmp", "../tmp")
	ar.charDev("dev/console", 0o600, 5, 1)
	ar.charDev("dev/null", 0o666, 1, 3)

	// busybox and its applets
	ar.file("bin/busybox", in.busybox, 0o755)
	out, err := runCmd(ctx, "", in.busybox, "--list-full")
	if err != nil {
		return moduleSet{}, err
	}
	for _, applet := range strings.Fields(out) {
		if applet != "bin/busybox" {
			ar.symlink(applet, "/bin/busybox")
		}
	}

	mods, err := addModules(ctx, ar, in)
	if err != nil {
		return moduleSet{}, err
	}
	if err := addGuestTools(ar, in.guestRoot); err != nil {
		return moduleSet{}, err
	}

	for _, f := range []string{"etc/protocols", "etc/services", "etc/ethertypes"} {
		if p := filepath.Join(in.guestRoot, f); fileExists(p) {
			ar.file(f, p, 0o644)
		}
	}
	ar.bytes("etc/hosts", []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), 0o644)
	ar.bytes("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0o644)
	ar.bytes("etc/group", []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
	ar.bytes("etc/nsswitch.conf", []byte("hosts: files\nnetworks: files\nprotocols: files\nservices: files\n"), 0o644)
	ar.bytes(guestModulesFile, []byte(strings.Join(mods.boot, "\n")+"\n"), 0o644)
	return mods, ar.writeFile(in.out)
}

// addModules adds the closure of bootModules and extraModules over the
// kernel's modules.dep, and a modules.dep for them made by busybox depmod.
func addModules(ctx context.Context, ar *archive, in baseInputs) (moduleSet, error) {
	var modDir string
	for _, d := range []string{"lib/modules", "usr/lib/modules"} {
		if p := filepath.Join(in.kernelRoot, d, in.abi); fileExists(p) {
			modDir = p
		}
	}
	if modDir == "" {
		return moduleSet{}, fmt.Errorf("no modules for %s in the kernel package", in.abi)
	}
	byName := map[string]string{} // module name -> path relative to modDir
	err := filepath.WalkDir(modDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.Contains(d.Name(), ".ko") {
			return err
		}
		rel, err := filepath.Rel(modDir, p)
		byName[moduleName(rel)] = rel
		return err
	})
	if err != nil {
		return moduleSet{}, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[moduleName(line)] = true
		}
	}

	var set moduleSet
	need := map[string]bool{} // paths relative to modDir
	var add func(m string) error
	add = func(m string) error {
		rel, ok := byName[m]
		if !ok {
			return fmt.Errorf("module %s: not in the kernel package", m)
		}
		if need[rel] {
			return nil
		}
		if !strings.HasSuffix(rel, ".ko") {
			return fmt.Errorf("module %s: %s is compressed, busybox modprobe wants plain .ko", m, rel)
		}
		need[rel] = true
		deps, err := moduleDepends(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := add(d); err != nil {
				return fmt.Errorf("%s needs %w", m, err)
			}
		}
		return nil
	}
	for i, list := range [][]string{bootModules, extraModules} {
		for _, m := range list {
			m = strings.ReplaceAll(m, "-", "_")
			if builtin[m] {
				continue
			}
			if err := add(m); err != nil {
				return moduleSet{}, err
			}
			if i == 0 {
				set.boot = append(set.boot, m)
			} else {
				set.extra = append(set.extra, m)
			}
		}
	}

	// busybox depmod works on a directory tree: stage the modules there.
	stage := filepath.Join(in.work, "modstage")
	stageMods := filepath.Join(stage, "lib/modules", in.abi)
	for rel := range need {
		dst := filepath.Join(stageMods, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return moduleSet{}, err
		}
		if err := os.Link(filepath.Join(modDir, rel), dst); err != nil {
			return moduleSet{}, fmt.Errorf("stage module: %w", err)
		}
		ar.file(path.Join("usr/lib/modules", in.abi, rel), dst, 0o644)
	}
	set.files = len(need)
	for _, f := range []string{"modules.builtin"} {
		if p := filepath.Join(modDir, f); fileExists(p) {
			ar.file(path.Join("usr/lib/modules", in.abi, f), p, 0o644)
		}
	}
	if _, err := runCmd(ctx, "", in.busybox, "depmod", "-b", stage, in.abi); err != nil {
		return moduleSet{}, err
	}
	generated, err := os.ReadDir(stageMods)
	if err != nil {
		return moduleSet{}, err
	}
	for _, e := range generated {
		if strings.HasPrefix(e.Name(), "modules.") {
			ar.file(path.Join("usr/lib/modules", in.abi, e.Name()), filepath.Join(stageMods, e.Name()), 0o644)
		}
	}
	if !ar.has(path.Join("usr/lib/modules", in.abi, "modules.dep")) {
		return moduleSet{}, fmt.Errorf("busybox depmod made no modules.dep")
	}
	return set, nil
}

// moduleName is the name of a module file: kernel/net/ipv4/ip_vs.ko ->
// ip_vs, with '-' as '_'.
func moduleName(rel string) string {
	base := path.Base(rel)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// moduleDepends reads the modules a module file needs from the
// "depends=" entry of its .modinfo section (the kernel package ships no
// modules.dep: depmod makes it on install).
func moduleDepends(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", p)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	var deps []string
	for _, kv := range strings.Split(string(data), "\x00") {
		if v, ok := strings.CutPrefix(kv, "depends="); ok {
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
		}
	}
	return deps, nil
}

// addGuestTools adds guestBinaries, the iptables front-end links, the
// xtables extensions, and every library they need (from their ELF
// headers) with the dynamic loader.
func addGuestTools(ar *archive, root string) error {
	var elves []string // host paths of ELF files whose libraries are needed
	for _, b := range guestBinaries {
		found := ""
		for _, d := range []string{"usr/sbin", "sbin", "usr/bin", "bin"} {
			if p := filepath.Join(root, d, b); fileExists(p) {
				found = p
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s: not in the guest packages", b)
		}
		ar.file("usr/sbin/"+b, found, 0o755)
		elves = append(elves, found)
	}
	for name, target := range guestLinks {
		ar.symlink("usr/sbin/"+name, target)
	}

	xtDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu/xtables")
	ents, err := os.ReadDir(xtDir)
	if err != nil {
		return fmt.Errorf("xtables extensions: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(xtDir, e.Name())
		guest := path.Join(guestLibDir, "xtables", e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			ar.symlink(guest, target)
			continue
		}
		ar.file(guest, p, 0o644)
		elves = append(elves, p)
	}

	return addLibraries(ar, root, elves)
}

// addLibraries adds every library that the ELF files elves (host paths
// below root) need, recursively, from root's library directories, with
// the dynamic loader.
func addLibraries(ar *archive, root string, elves []string) error {
	libDirs := []string{filepath.Join(root, "lib/x86_64-linux-gnu"), filepath.Join(root, "usr/lib/x86_64-linux-gnu")}
	seen := map[string]bool{}
	for len(elves) > 0 {
		p := elves[0]
		elves = elves[1:]
		f, err := elf.Open(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		libs, err := f.ImportedLibraries()
		interp := elfInterp(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if interp != "" {
			libs = append(libs, path.Base(interp))
			ar.symlink(strings.TrimPrefix(interp, "/"), "/"+path.Join(guestLibDir, path.Base(interp)))
		}
		sort.Strings(libs)
		for _, lib := range libs {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			found := ""
			for _, d := range libDirs {
				if q := filepath.Join(d, lib); fileExists(q) {
					found = q
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, which no unpacked package has: add its package", p, lib)
			}
			resolved, err := resolveIn(root, found)
			if err != nil {
				return err
			}
			ar.file(path.Join(guestLibDir, lib), resolved, 0o755)
			elves = append(elves, resolved)
		}
	}
	return nil
}

func elfInterp(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return strings.TrimRight(string(b), "\x00")
			}
		}
	}
	return ""
}

// resolveIn follows the symlinks of p, a path below root, treating
// absolute link targets as relative to root.
func resolveIn(root, p string) (string, error) {
	for range 40 {
		st, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return p, nil
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			p = filepath.Join(root, target)
		} else {
			p = filepath.Join(filepath.Dir(p), target)
		}
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", p)
}

// fileExists reports whether p exists (a symlink counts, even when it
// points outside the tree it is in).
func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
