package upstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
)

// AgnhostImage is the name e2e.test v1.36.3 gives agnhost
// (test/utils/image/manifest.go): the image must be in the node's runtime
// under exactly this name, as no registry is reachable.
const AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"

// agnhostPackages are the Debian packages of the agnhost image. Upstream's
// image is Alpine's busybox with bind-tools, curl, netcat-openbsd,
// iproute2 (and iperf, bash, util-linux-misc that the Services tests do
// not use). The tests exec `/bin/sh -x -c` with curl, nc (-v -z -t -u -w),
// nslookup, ss, wget, seq, grep, tail, test, echo, sleep and cat. wget is
// GNU wget: Debian 12's busybox-static (1.35) segfaults on every
// `wget -T N` (the timeout the Services tests' wget loops pass), which
// failed "should serve a basic endpoint from pods"-style reachability
// checks with "Segmentation fault" as the answer.
var agnhostPackages = []string{"busybox-static", "bind9-dnsutils", "curl", "iproute2", "netcat-openbsd", "wget"}

// agnhostShell is /bin/sh. Not busybox's: Debian builds busybox-static to
// prefer its own applets inside its shell, so `nc` or `ip` there would be
// busybox's, not the packages'. dash needs only libc6, which is in; its
// package's other dependencies (dpkg, debianutils) are not followed.
const agnhostShell = "dash"

// alternatives are the links that Debian's maintainer scripts make with
// update-alternatives (they are not in the packages' files).
var alternatives = map[string]string{"bin/nc": "nc.openbsd"}

// imageRecipe changes whenever the way the images are assembled changes,
// so that cached archives are rebuilt.
const imageRecipe = "agnhost-r3"

// agnhostPrune are removed from the unpacked packages.
var agnhostPrune = []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian",
	"usr/share/locale", "usr/share/bug", "usr/lib/x86_64-linux-gnu/gconv", "usr/lib/aarch64-linux-gnu/gconv"}

// imageEpoch is the time of every file and of the images.
var imageEpoch = time.Unix(0, 0).UTC()

// binDirs are where the image's commands are looked up (its PATH).
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}

// EnsureAgnhostImage returns an OCI archive of the agnhost image, named
// AgnhostImage, made from the static agnhost binary and Debian's
// busybox-static, curl, netcat-openbsd, iproute2 and bind9-dnsutils with
// their libraries (fetched with apt-get download, unpacked, nothing
// installed). It is cached in cacheDir/images, keyed by the binary and the
// recipe; concurrent callers build it once.
func EnsureAgnhostImage(ctx context.Context, cacheDir, agnhost string, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	sum, err := ociimage.FileDigest(agnhost)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s %s\n", imageRecipe, AgnhostImage, sum, strings.Join(agnhostPackages, " "), agnhostShell)
	_, tag, _ := strings.Cut(AgnhostImage[strings.LastIndex(AgnhostImage, "/")+1:], ":")
	out := filepath.Join(cacheDir, "images", "agnhost-"+tag+"-"+hex.EncodeToString(h.Sum(nil))[:12]+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	unlock, err := controlplane.LockFile(ctx, out+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	start := time.Now()
	work, err := os.MkdirTemp("", "agnhost-image-")
	if err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	defer os.RemoveAll(work)
	pkgs, err := debian.Closure(ctx, agnhostPackages, debian.ClosureOptions{})
	if err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	pkgs = append(pkgs, agnhostShell)
	root, versions, err := debian.Unpack(ctx, work, pkgs, logf)
	if err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	if err := finishAgnhostUserland(ctx, root); err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	var pv []string
	for _, p := range pkgs {
		pv = append(pv, p+"="+versions[p])
	}
	userland, err := ociimage.Layer(func(t *ociimage.TarWriter) error { return t.Tree(root) }, imageEpoch)
	if err != nil {
		return "", fmt.Errorf("agnhost image: userland layer: %w", err)
	}
	// The agnhost layer: the binary, the second name the entrypoint
	// tests run it under, and netexec's upload directory.
	top := filepath.Join(work, "agnhost-layer")
	if err := os.MkdirAll(filepath.Join(top, "uploads"), 0o755); err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	if err := os.Symlink("agnhost", filepath.Join(top, "agnhost-2")); err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	bin, err := ociimage.Layer(func(t *ociimage.TarWriter) error {
		if err := t.File("agnhost", agnhost, 0o755); err != nil {
			return err
		}
		return t.Tree(top)
	}, imageEpoch)
	if err != nil {
		return "", fmt.Errorf("agnhost image: binary layer: %w", err)
	}
	img, err := ociimage.Image([]ociimage.ImageLayer{
		{Layer: userland, CreatedBy: "Debian packages " + strings.Join(pv, " ")},
		{Layer: bin, CreatedBy: "agnhost (k8s.io/kubernetes/test/images/agnhost) /agnhost"},
	}, ociimage.Config{
		// agnhost is built for this machine, like the Debian packages.
		Arch: runtime.GOARCH, Epoch: imageEpoch,
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{"io.ipvs-proxy.debian-packages": strings.Join(pv, " ")},
	})
	if err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	if err := ociimage.WriteArchive(img, AgnhostImage, out, imageEpoch); err != nil {
		return "", fmt.Errorf("agnhost image: %w", err)
	}
	if st, err := os.Stat(out); err == nil {
		logf("agnhost image %s: %.1f MiB in %s", out, float64(st.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))
	}
	return out, nil
}

// finishAgnhostUserland prunes the unpacked packages, links busybox's
// applets that no package provides (wget, seq, grep...), and adds the
// users and files a running system has.
func finishAgnhostUserland(ctx context.Context, root string) error {
	for _, p := range agnhostPrune {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	for link, target := range alternatives {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	busybox := filepath.Join(root, "bin", "busybox")
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if provided(root, filepath.Base(applet)) {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(applet))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil {
			return err
		}
	}
	for _, cmd := range []string{"sh", "curl", "nc", "nslookup", "ss", "ip", "wget", "seq", "grep"} {
		if !provided(root, cmd) {
			return fmt.Errorf("no %s in the image", cmd)
		}
	}
	files := map[string]string{
		// The users and groups of upstream's image (a supplemental-groups
		// test relies on the last two).
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" +
			"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		"etc/group": "root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\n" +
			"group-defined-in-image:x:50000:user-defined-in-image\n",
		"etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	for d, mode := range map[string]os.FileMode{"tmp": 0o777 | os.ModeSticky, "root": 0o700, "proc": 0o555, "sys": 0o555,
		"dev": 0o755, "run": 0o755, "home/user-defined-in-image": 0o755} {
		p := filepath.Join(root, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}

// provided reports whether a command of that name is in one of binDirs.
func provided(root, name string) bool {
	for _, d := range binDirs {
		if _, err := os.Lstat(filepath.Join(root, d, name)); err == nil {
			return true
		}
	}
	return false
}
