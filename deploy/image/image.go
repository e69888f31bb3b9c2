package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/oci"
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

// assemble builds the image: the userland layer, then the binary's layer;
// the binary is the entrypoint.
func assemble(s spec) (v1.Image, error) {
	userland, err := oci.NewLayer(func(t *oci.TarWriter) error { return t.Tree(s.Userland) }, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("userland layer: %w", err)
	}
	bin, err := oci.NewLayer(func(t *oci.TarWriter) error {
		return t.File(strings.TrimPrefix(binaryPath, "/"), s.Binary, 0o755)
	}, s.Epoch)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return oci.Image([]oci.Layer{
		{Layer: userland, CreatedBy: s.UserlandDesc},
		{Layer: bin, CreatedBy: "ipvs-proxy " + binaryPath},
	}, oci.Config{
		Arch: s.Arch, Epoch: s.Epoch,
		Entrypoint: []string{binaryPath}, Cmd: []string{"run"}, Env: []string{imagePATH},
		WorkingDir: "/", Labels: s.Labels,
	})
}

// sortedLabels is labels as sorted "k=v" lines (for printing).
func sortedLabels(l map[string]string) []string {
	var out []string
	for k, v := range l {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
