package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ocitest"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
)

// resolve follows symlinks of a path inside root (absolute targets are
// relative to root).
func resolve(t *testing.T, root, p string) string {
	t.Helper()
	for range 40 {
		full := filepath.Join(root, p)
		st, err := os.Lstat(full)
		if err != nil {
			return ""
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return full
		}
		target, err := os.Readlink(full)
		if err != nil {
			t.Fatal(err)
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = target
	}
	t.Fatalf("%s: symlink loop", p)
	return ""
}

// TestImage builds the container image as `make image` does, checks the
// OCI archive (index, manifest, config, layers), that the image holds the
// binary, iptables (nft and legacy), modprobe and every shared library
// they need, and runs them from the image's root inside the VM.
func TestImage(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, archive := filepath.Join(dir, "ipvs-proxy"), filepath.Join(dir, "ipvs-proxy-image.tar")
	start := time.Now()
	repoRoot, err := repo.Root() // both are the root module's
	if err != nil {
		t.Fatal(err)
	}
	// As `make build` does: static and stripped.
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ipvs-proxy: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "github.com/ipvs-proxy/ipvs-proxy/deploy/image",
		"--binary", bin, "--output", archive, "--tag", "ipvs-proxy:e2e", "--version", "e2e")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the image: %v\n%s", err, out)
	} else {
		t.Logf("%s", bytes.TrimSpace(out))
	}
	st, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image archive: %.1f MiB, built (with the binary) in %v", float64(st.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))

	// The archive is an OCI image layout.
	a, err := ocitest.Open(archive, filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Desc.Annotations["io.containerd.image.name"] != "docker.io/library/ipvs-proxy:e2e" {
		t.Fatalf("index.json: %+v", a.Desc)
	}
	img := a.Image
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/ipvs-proxy" || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Errorf("config: entrypoint %q, %s/%s", cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: %d layers (%s), packages: %s", a.Desc.Digest, len(m.Layers), layerSizes(m),
		cf.Config.Labels["io.ipvs-proxy.debian-packages"])

	// Its files.
	root := filepath.Join(dir, "root")
	flat := mutate.Extract(img)
	if err := ocitest.Untar(flat, root); err != nil {
		t.Fatal(err)
	}
	flat.Close()
	execs := []string{"/usr/local/bin/ipvs-proxy", "/usr/sbin/iptables-nft-restore", "/usr/sbin/iptables-nft-save",
		"/usr/sbin/iptables-legacy-restore", "/usr/sbin/ip6tables-nft-restore", "/usr/sbin/iptables", "/sbin/modprobe"}
	var elves []string
	for _, p := range execs {
		resolved := resolve(t, root, p)
		if resolved == "" {
			t.Errorf("the image has no %s", p)
			continue
		}
		if st, err := os.Stat(resolved); err != nil || st.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s is not executable: %v", p, err)
		}
		elves = append(elves, resolved)
	}
	xt, _ := filepath.Glob(filepath.Join(root, "usr/lib/*/xtables/*.so"))
	if len(xt) == 0 {
		t.Error("no xtables extensions in the image")
	}
	elves = append(elves, xt...)
	for _, p := range []string{"/etc/protocols", "/tmp", "/run"} {
		if resolve(t, root, p) == "" {
			t.Errorf("the image has no %s", p)
		}
	}
	// Every shared library they need is there.
	libDirs := []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"}
	seen := map[string]bool{}
	for len(elves) > 0 {
		p := elves[0]
		elves = elves[1:]
		ef, err := elf.Open(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		libs, _ := ef.ImportedLibraries()
		ef.Close()
		for _, lib := range libs {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			found := ""
			for _, d := range libDirs {
				if found = resolve(t, root, path.Join("/", d, lib)); found != "" {
					break
				}
			}
			if found == "" {
				t.Errorf("%s needs %s, which the image lacks", strings.TrimPrefix(p, root), lib)
				continue
			}
			elves = append(elves, found)
		}
	}
	t.Logf("%d shared libraries, all present", len(seen))

	// Run the image's tools in the VM, chrooted into its root: the
	// userland works against Debian's kernel.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	flat = mutate.Extract(img)
	if _, err := io.Copy(zw, flat); err != nil {
		t.Fatal(err)
	}
	flat.Close()
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	const groot = "/tmp/image-root"
	inVM := time.Now()
	if err := e.VM.WriteFile(ctx, "/tmp/image-root.tar.gz", gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.VM.Run(context.Background(), "umount", groot+"/proc")
		_, _ = e.VM.Run(context.Background(), "rm", "-rf", groot, "/tmp/image-root.tar.gz")
	})
	for _, argv := range [][]string{
		{"mkdir", "-p", groot},
		{"tar", "-xzf", "/tmp/image-root.tar.gz", "-C", groot},
		{"mount", "-t", "proc", "proc", groot + "/proc"},
	} {
		if _, err := e.VM.RunOK(ctx, argv...); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/local/bin/ipvs-proxy", "version"}, ""},
		{[]string{"/usr/sbin/iptables", "--version"}, "nf_tables"},
		{[]string{"/usr/sbin/iptables-nft-save", "-t", "nat"}, "*nat"},
		{[]string{"/usr/sbin/iptables-legacy", "-t", "filter", "-n", "-L", "INPUT"}, "Chain INPUT"},
		{[]string{"/usr/sbin/ip6tables-nft", "-t", "filter", "-n", "-L", "INPUT"}, "Chain INPUT"},
		{[]string{"/sbin/modprobe", "--version"}, "kmod"},
	} {
		out, err := e.VM.RunOK(ctx, append([]string{"chroot", groot}, c.argv...)...)
		if err != nil {
			t.Errorf("in the image: %v", err)
			continue
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("in the image: %q printed %q, want %q", c.argv, out, c.want)
		}
	}
	t.Logf("copied the image's root into the VM and ran its tools there in %v", time.Since(inVM).Round(100*time.Millisecond))
}

func layerSizes(m *v1.Manifest) string {
	var s []string
	for _, l := range m.Layers {
		s = append(s, fmt.Sprintf("%.1f MiB", float64(l.Size)/(1<<20)))
	}
	return strings.Join(s, " + ")
}
