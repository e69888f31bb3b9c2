package vm

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
)

// LayerSpec describes an extra initramfs of Debian packages, for the
// guests that need more than the base assets (Options.Layers): the
// one-node cluster's container runtime, for instance. The base stays as
// it is, so other tests boot exactly as before.
type LayerSpec struct {
	// Name names the cached archive (layer-<Name>-<hash>.cpio).
	Name string
	// Packages are fetched with `apt-get download` and unpacked; their
	// dependencies are not followed: list the libraries' packages too
	// (libc6 included, whose files the base has anyway).
	Packages []string
	// Files are paths inside the unpacked packages, e.g. "usr/bin/runc",
	// copied to the same guest path; a directory is copied whole. The
	// libraries that the ELF files among them need come along.
	Files []string
}

// EnsureLayer returns the path of the layer's archive, assembling it into
// cacheDir ("" means CacheDir()) on first use, under a file lock and
// atomically, like EnsureAssets. The cache key is the spec; the package
// versions are those the package lists name when it is first assembled.
func EnsureLayer(ctx context.Context, cacheDir string, spec LayerSpec, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if cacheDir == "" {
		cacheDir = CacheDir()
	}
	h := sha256.New()
	fmt.Fprintln(h, recipeRevision, spec.Packages, spec.Files)
	out := filepath.Join(cacheDir, "layer-"+spec.Name+"-"+hex.EncodeToString(h.Sum(nil))[:12]+".cpio")
	if fileExists(out) {
		return out, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	unlock, err := lockFile(ctx, out+".lock", logf)
	if err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	defer unlock()
	if fileExists(out) {
		return out, nil
	}
	start := time.Now()
	work, err := os.MkdirTemp(cacheDir, "layer-"+spec.Name+".work-")
	if err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	defer os.RemoveAll(work)
	root, versions, err := debian.Unpack(ctx, work, spec.Packages, logf)
	if err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	ar := newArchive()
	if err := addLayerFiles(ar, root, spec.Files); err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	tmp := filepath.Join(work, "layer.cpio")
	if err := ar.writeFile(tmp); err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("vm layer %s: %w", spec.Name, err)
	}
	var pv []string
	for _, p := range spec.Packages {
		pv = append(pv, p+"="+versions[p])
	}
	sort.Strings(pv)
	if st, err := os.Stat(out); err == nil {
		logf("vm: layer %s (%s): %d MiB in %s", spec.Name, strings.Join(pv, " "), st.Size()>>20,
			time.Since(start).Round(100*time.Millisecond))
	}
	return out, nil
}

// addLayerFiles adds files (paths below root; directories whole) and the
// libraries their ELF files need.
func addLayerFiles(ar *archive, root string, files []string) error {
	var elves []string
	for _, f := range files {
		top := filepath.Join(root, f)
		if _, err := os.Stat(top); err != nil {
			return fmt.Errorf("%s: not in the packages: %w", f, err)
		}
		err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			info, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case d.IsDir():
				ar.dir(rel, info.Mode().Perm())
			case info.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				ar.symlink(rel, target)
			case info.Mode().IsRegular():
				ar.file(rel, p, info.Mode().Perm())
				if isDynamicELF(p) {
					elves = append(elves, p)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return addLibraries(ar, root, elves)
}

// isDynamicELF reports whether p is an ELF file that needs libraries.
func isDynamicELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	return len(libs) > 0 || elfInterp(f) != ""
}
