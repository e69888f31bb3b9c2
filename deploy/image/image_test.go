package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ocitest"
)

// staticBinary builds a tiny static program.
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-o", out, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// fakeUserland is a small tree like the unpacked packages.
func fakeUserland(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/sbin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/sbin/xtables-nft-multi"), []byte("\x7fELF fake"), 0o755))
	for _, s := range []string{"", "-save", "-restore"} {
		must(os.Symlink("xtables-nft-multi", filepath.Join(root, "usr/sbin/iptables-nft"+s)))
		must(os.Symlink("xtables-nft-multi", filepath.Join(root, "usr/sbin/ip6tables-nft"+s)))
	}
	must(os.MkdirAll(filepath.Join(root, "usr/share/doc/iptables"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/share/doc/iptables/copyright"), []byte("GPL"), 0o644))
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/protocols"), []byte("tcp 6 TCP\n"), 0o644))
	must(finishUserland(root))
	return root
}

// flatten lists the image's files (last layer wins) by name.
func flatten(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = h
	}
}

func TestImageArchive(t *testing.T) {
	bin := staticBinary(t)
	arch, err := checkStatic(bin)
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Unix(1700000000, 0).UTC()
	sbom := filepath.Join(t.TempDir(), "sbom.cdx.json")
	if err := os.WriteFile(sbom, []byte(`{"bomFormat":"CycloneDX"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := spec{Binary: bin, SBOM: sbom, Userland: fakeUserland(t), UserlandDesc: "fake packages", Arch: arch, Epoch: epoch,
		Labels: map[string]string{"org.opencontainers.image.version": "test"}}
	img, err := assemble(s)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteArchive(img, "ipvs-proxy:test", out, epoch); err != nil {
		t.Fatal(err)
	}

	// Read it back as an OCI layout.
	dir := t.TempDir()
	a, err := ocitest.Open(out, dir)
	if err != nil {
		t.Fatal(err)
	}
	desc, got := a.Desc, a.Image
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", desc.MediaType)
	}
	if got := desc.Annotations["io.containerd.image.name"]; got != "docker.io/library/ipvs-proxy:test" {
		t.Errorf("io.containerd.image.name = %q", got)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "test" {
		t.Errorf("org.opencontainers.image.ref.name = %q", got)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != binaryPath || strings.Join(cf.Config.Cmd, " ") != "run" ||
		cf.OS != "linux" || cf.Architecture != arch || !cf.Created.Time.Equal(epoch) || cf.Config.Labels["org.opencontainers.image.version"] != "test" {
		t.Errorf("config: entrypoint %q cmd %q %s/%s created %v labels %v", cf.Config.Entrypoint, cf.Config.Cmd, cf.OS, cf.Architecture, cf.Created, cf.Config.Labels)
	}
	layers, err := got.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s", mt)
		}
	}

	files := flatten(t, got)
	want := map[string]byte{binaryPath[1:]: tar.TypeReg, "usr/sbin/xtables-nft-multi": tar.TypeReg,
		"usr/sbin/iptables-nft-restore": tar.TypeSymlink, "usr/sbin/iptables": tar.TypeSymlink,
		"usr/sbin/ip6tables-save": tar.TypeSymlink, "etc/protocols": tar.TypeReg, "tmp": tar.TypeDir,
		"var/run": tar.TypeSymlink, sbomPath[1:]: tar.TypeReg}
	for name, typ := range want {
		h, ok := files[name]
		if !ok {
			t.Errorf("image lacks %s", name)
			continue
		}
		if h.Typeflag != typ {
			t.Errorf("%s has type %c, want %c", name, h.Typeflag, typ)
		}
	}
	if h := files[binaryPath[1:]]; h != nil && h.Mode != 0o755 {
		t.Errorf("binary mode %o", h.Mode)
	}
	if h := files[sbomPath[1:]]; h != nil && h.Mode != 0o644 {
		t.Errorf("SBOM mode %o, want 644", h.Mode)
	}
	if h := files["usr/sbin/iptables"]; h != nil && h.Linkname != "iptables-nft" {
		t.Errorf("iptables -> %s, want iptables-nft", h.Linkname)
	}
	if h := files["tmp"]; h != nil && h.Mode != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", h.Mode)
	}
	if _, ok := files["usr/share/doc/iptables/copyright"]; ok {
		t.Error("documentation was not pruned")
	}
	for name, h := range files {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v owner %d:%d, want %v root", name, h.ModTime, h.Uid, h.Gid, epoch)
		}
	}

	// Docker's manifest.json points at the layout's blobs.
	var dms []ociimage.DockerManifest
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dms); err != nil {
		t.Fatal(err)
	}
	if len(dms) != 1 || len(dms[0].Layers) != 2 || strings.Join(dms[0].RepoTags, ",") != "ipvs-proxy:test" {
		t.Fatalf("manifest.json: %s", b)
	}
	for _, p := range append([]string{dms[0].Config}, dms[0].Layers...) {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("manifest.json names a missing blob: %v", err)
		}
	}

	// Reproducible: the same inputs make the same bytes.
	img2, err := assemble(s)
	if err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteArchive(img2, "ipvs-proxy:test", out2, epoch); err != nil {
		t.Fatal(err)
	}
	if sum(t, out) != sum(t, out2) {
		t.Error("two builds from the same inputs differ")
	}
}

func sum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestCheckStatic(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	if _, err := checkStatic(sh); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("checkStatic(%s) = %v, want a dynamically-linked error", sh, err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := checkStatic(notELF); err == nil {
		t.Error("checkStatic accepted a script")
	}
}

func TestRefNames(t *testing.T) {
	for _, c := range []struct{ in, full, tag, short string }{
		{"ipvs-proxy:latest", "docker.io/library/ipvs-proxy:latest", "latest", "ipvs-proxy:latest"},
		{"ipvs-proxy", "docker.io/library/ipvs-proxy:latest", "latest", "ipvs-proxy:latest"},
		{"registry.example:5000/net/ipvs-proxy:v1", "registry.example:5000/net/ipvs-proxy:v1", "v1", "registry.example:5000/net/ipvs-proxy:v1"},
	} {
		full, tag, short, err := ociimage.RefNames(c.in)
		if err != nil || full != c.full || tag != c.tag || short != c.short {
			t.Errorf("refNames(%q) = %q %q %q %v, want %q %q %q", c.in, full, tag, short, err, c.full, c.tag, c.short)
		}
	}
	if _, _, _, err := ociimage.RefNames("Bad Name"); err == nil {
		t.Error("refNames accepted an invalid reference")
	}
}
