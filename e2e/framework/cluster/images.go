package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// Images of the node, imported into containerd under these names so that
// IfNotPresent finds them (no registry is reachable).
const (
	// PauseImage is the sandbox image of kubelet v1.36.3 (and e2e's
	// test/utils/image: registry.k8s.io/pause:3.10.2), here e2e/guest/pause.
	PauseImage = "registry.k8s.io/pause:3.10.2"
	// ServerImage holds the bed's agent binary as /vmagent: `vmagent serve`
	// answers "<name> <client-ip>", `vmagent hit` and `vmagent http` are
	// clients.
	ServerImage = "ipvs-proxy.test/vmagent:e2e"
)

// ProxyImage is the name of ipvs-proxy's image that deploy/daemonset.yaml
// and the chart use, and `make image` gives it: ipvs-proxy tagged with the
// chart's appVersion (root: the repository's).
func ProxyImage(root string) (string, error) {
	chart := filepath.Join(root, "deploy", "helm", "ipvs-proxy", "Chart.yaml")
	b, err := os.ReadFile(chart)
	if err != nil {
		return "", fmt.Errorf("ipvs-proxy's image: %w", err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &meta); err != nil {
		return "", fmt.Errorf("ipvs-proxy's image: %s: %w", chart, err)
	}
	if meta.AppVersion == "" {
		return "", fmt.Errorf("ipvs-proxy's image: %s has no appVersion", chart)
	}
	return "ipvs-proxy:" + meta.AppVersion, nil
}

// imageEpoch is the time of the test images' files (reproducible).
var imageEpoch = time.Unix(1700000000, 0).UTC()

// staticImage builds Go package pkg and returns binaryImage of it.
func staticImage(ctx context.Context, cacheDir, tmp, pkg, name, ref string) (string, error) {
	bin := filepath.Join(tmp, name)
	if err := vm.BuildGoBinary(ctx, pkg, bin); err != nil {
		return "", fmt.Errorf("image %s: %w", ref, err)
	}
	return binaryImage(cacheDir, bin, name, ref)
}

// binaryImage returns an OCI archive of an image named ref holding the
// static binary bin as /<name>, its entrypoint, cached in cacheDir/images
// by the binary's digest.
func binaryImage(cacheDir, bin, name, ref string) (string, error) {
	sum, err := ociimage.FileDigest(bin)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref, err)
	}
	h := sha256.Sum256([]byte(ref + "\x00" + sum))
	out := filepath.Join(cacheDir, "images", name+"-"+hex.EncodeToString(h[:])[:12]+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	img, err := ociimage.StaticImage(map[string]string{"/" + name: bin}, []string{"/" + name}, "amd64", imageEpoch)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref, err)
	}
	if err := ociimage.WriteArchive(img, ref, out, imageEpoch); err != nil {
		return "", fmt.Errorf("image %s: %w", ref, err)
	}
	return out, nil
}

// proxyImage builds ipvs-proxy's image as `make image` does: the static,
// stripped binary and deploy/image (Debian's iptables and kmod). The
// archive is cached in cacheDir/images by the binary's digest and the
// image's name.
func proxyImage(ctx context.Context, cacheDir, tmp string, logf func(string, ...any)) (string, error) {
	root, err := repo.Root() // both are the root module's
	if err != nil {
		return "", err
	}
	ref, err := ProxyImage(root)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, "ipvs-proxy")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin,
		"github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build ipvs-proxy: %w\n%s", err, b)
	}
	sum, err := ociimage.FileDigest(bin)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref, err)
	}
	h := sha256.Sum256([]byte(ref + "\x00" + sum))
	out := filepath.Join(cacheDir, "images", "ipvs-proxy-"+hex.EncodeToString(h[:])[:12]+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	// The SBOM as make image writes it (e2e/tools/cyclonedx-gomod).
	sbom := filepath.Join(tmp, "ipvs-proxy.cdx.json")
	gen := exec.CommandContext(ctx, "go", "-C", filepath.Join(root, "e2e/tools/cyclonedx-gomod"), "tool", "cyclonedx-gomod",
		"bin", "-json", "-noserial", "-notimestamp", "-version", "e2e", "-output", sbom, bin)
	if b, err := gen.CombinedOutput(); err != nil {
		return "", fmt.Errorf("ipvs-proxy's SBOM: %w\n%s", err, b)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "github.com/ipvs-proxy/ipvs-proxy/deploy/image",
		"--binary", bin, "--sbom", sbom, "--output", out, "--tag", ref, "--version", "e2e")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(imageEpoch.Unix(), 10))
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build ipvs-proxy's image: %w\n%s", err, b)
	}
	logf("cluster: %s", trimSpace(b))
	return out, nil
}

func trimSpace(b []byte) string {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return string(b)
}
