// Command image assembles ipvs-proxy's container image without a
// container engine: an OCI image archive (an OCI image layout in a tar,
// with Docker's manifest.json as well) made with go-containerregistry from
// the static ipvs-proxy binary and Debian's iptables and kmod with their
// libraries, which are fetched with `apt-get download` and unpacked with
// `dpkg-deb -x` (nothing is installed into /). `make image` runs it:
//
//	go run ./deploy/image --binary bin/ipvs-proxy --output bin/ipvs-proxy-image.tar --tag ipvs-proxy:latest
//
// Load the archive with `ctr -n k8s.io images import`, `podman load`,
// `docker load` (Docker 25 or later), or push it with
// `skopeo copy oci-archive:bin/ipvs-proxy-image.tar docker://REGISTRY/ipvs-proxy:TAG`.
//
// The image: /usr/local/bin/ipvs-proxy is the entrypoint (command "run");
// iptables-nft and iptables-legacy (the unsuffixed names are nft, as on
// Debian) with ip6tables; kmod's modprobe for `ipvs-proxy preflight
// --load-modules`; with --sbom, the binary's SBOM at /sbom.cdx.json. Files
// and the image carry one fixed time
// (SOURCE_DATE_EPOCH, else 0), so the same inputs give the same digest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
)

// userlandRoots are the Debian packages of the image; their dependencies
// come along (libc6, the netfilter libraries, libkmod2, ...).
var userlandRoots = []string{"iptables", "kmod"}

// pruned are removed from the unpacked packages: documentation, and
// glibc's iconv modules, which neither iptables nor kmod use.
var pruned = []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale",
	"usr/share/bug", "usr/lib/x86_64-linux-gnu/gconv", "usr/lib/aarch64-linux-gnu/gconv"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run() error {
	binary := flag.String("binary", "bin/ipvs-proxy", "the static ipvs-proxy binary (make build)")
	output := flag.String("output", "bin/ipvs-proxy-image.tar", "the OCI image archive to write")
	tag := flag.String("tag", "ipvs-proxy:latest", "the image's name")
	version := flag.String("version", "dev", "the version label")
	work := flag.String("work", "", "scratch directory (default: a temporary one, removed)")
	sbom := flag.String("sbom", "", "the binary's SBOM (CycloneDX JSON), checked against the binary and put in the image at "+sbomPath)
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "image: "+format+"\n", args...) }

	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	arch, err := checkStatic(*binary)
	if err != nil {
		return err
	}
	if *sbom != "" {
		n, err := checkSBOM(*sbom, *binary)
		if err != nil {
			return err
		}
		logf("SBOM %s: lists the %d modules of %s", *sbom, n, *binary)
	}
	if debArch, err := dpkgArch(ctx); err != nil {
		return err
	} else if debArch != arch {
		return fmt.Errorf("the binary is %s but apt fetches %s packages: build for %s", arch, debArch, debArch)
	}
	dir := *work
	if dir == "" {
		if dir, err = os.MkdirTemp("", "ipvs-proxy-image-build-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	pkgs, err := debian.Closure(ctx, userlandRoots, debian.ClosureOptions{})
	if err != nil {
		return err
	}
	logf("Debian packages: %s", strings.Join(pkgs, " "))
	root, versions, err := debian.Unpack(ctx, dir, pkgs, logf)
	if err != nil {
		return err
	}
	if err := finishUserland(root); err != nil {
		return err
	}
	var pv []string
	for _, p := range pkgs {
		pv = append(pv, p+"="+versions[p])
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       "ipvs-proxy",
		"org.opencontainers.image.description": "A kube-proxy replacement that programs IPVS over netlink",
		"org.opencontainers.image.version":     *version,
		"io.ipvs-proxy.debian-packages":        strings.Join(pv, " "),
	}
	if *sbom != "" {
		labels["io.ipvs-proxy.sbom"] = sbomPath
	}
	img, err := assemble(spec{Binary: *binary, SBOM: *sbom, Userland: root, Arch: arch, Epoch: epoch, Labels: labels,
		UserlandDesc: "Debian packages " + strings.Join(pv, " ")})
	if err != nil {
		return err
	}
	if err := ociimage.WriteArchive(img, *tag, *output, epoch); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(*output)
	if err != nil {
		return err
	}
	logf("wrote %s: %s %s, %.1f MiB, in %s", *output, *tag, digest, float64(st.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// sourceDateEpoch is $SOURCE_DATE_EPOCH (reproducible-builds.org), else 0.
func sourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

func dpkgArch(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg", "--print-architecture").Output()
	if err != nil {
		return "", fmt.Errorf("dpkg --print-architecture: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// finishUserland prunes the unpacked packages and does what their
// maintainer scripts would have: the unsuffixed iptables names (nft, as
// Debian's alternatives default), and the directories a running system
// has.
func finishUserland(root string) error {
	for _, p := range pruned {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	sbin := filepath.Join(root, "usr/sbin")
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target := fam + "-nft" + suffix
			if _, err := os.Lstat(filepath.Join(sbin, target)); err != nil {
				return fmt.Errorf("iptables package: %w", err)
			}
			link := filepath.Join(sbin, fam+suffix)
			if err := os.Symlink(target, link); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
	}
	for d, mode := range map[string]os.FileMode{"tmp": 0o777 | os.ModeSticky, "run": 0o755, "var/run": 0, "proc": 0o555, "sys": 0o555, "dev": 0o755,
		"etc/ipvs-proxy": 0o755} {
		p := filepath.Join(root, d)
		if mode == 0 { // var/run -> /run
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink("/run", p); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			continue
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}
