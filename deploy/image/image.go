package main

import (
	"debug/elf"
	"fmt"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
)

// Where things are in the image.
const (
	binaryPath = "/usr/local/bin/ipvs-proxy"
	imagePATH  = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// spec describes an image to assemble.
type spec struct {
	// Binary is the static ipvs-proxy binary.
	Binary string
	// SBOM is the binary's SBOM, put at sbomPath; empty: none.
	SBOM string
	// Userland is a directory tree (Debian's iptables, kmod and their
	// libraries, unpacked) that becomes the first layer.
	Userland string
	// UserlandDesc says what Userland holds (the layer's history).
	UserlandDesc string
	// Arch is the GOARCH / Debian architecture of both, e.g. amd64.
	Arch string
	// Epoch is the time of every file and of the image (reproducible
	// builds: the same inputs give the same digests).
	Epoch time.Time
	// Labels are the image's labels.
	Labels map[string]string
}

// elfArch maps an ELF machine to the image architecture.
var elfArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// checkStatic fails unless p is a statically linked ELF executable (no
// program interpreter, no shared libraries); it returns its architecture.
func checkStatic(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("binary %s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return "", fmt.Errorf("binary %s is dynamically linked: build it with CGO_ENABLED=0 (make build)", p)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return "", fmt.Errorf("binary %s needs shared libraries %v: build it with CGO_ENABLED=0 (make build)", p, libs)
	}
	arch, ok := elfArch[f.Machine]
	if !ok {
		return "", fmt.Errorf("binary %s: unsupported machine %v", p, f.Machine)
	}
	return arch, nil
}

// assemble builds the image: the userland layer, then the binary's layer;
// the binary is the entrypoint.
func assemble(s spec) (v1.Image, error) {
	userland, err := ociimage.Layer(func(t *ociimage.TarWriter) error { return t.Tree(s.Userland) }, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("userland layer: %w", err)
	}
	bin, err := ociimage.Layer(func(t *ociimage.TarWriter) error {
		if s.SBOM != "" {
			if err := t.File(strings.TrimPrefix(sbomPath, "/"), s.SBOM, 0o644); err != nil {
				return err
			}
		}
		return t.File(strings.TrimPrefix(binaryPath, "/"), s.Binary, 0o755)
	}, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return ociimage.Image([]ociimage.ImageLayer{
		{Layer: userland, CreatedBy: s.UserlandDesc},
		{Layer: bin, CreatedBy: "ipvs-proxy " + binaryPath},
	}, ociimage.Config{
		Arch: s.Arch, Epoch: s.Epoch,
		Entrypoint: []string{binaryPath}, Cmd: []string{"run"}, Env: []string{imagePATH},
		Labels: s.Labels,
	})
}
