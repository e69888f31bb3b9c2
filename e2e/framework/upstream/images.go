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
	"sort"
	"strings"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
	"github.com/ipvs-proxy/ipvs-proxy/deploy/image/ociimage"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
)

// The names e2e.test v1.36.3 gives the test images that the focus's pods
// use (test/utils/image/manifest.go): each image must be in the nodes'
// runtime under exactly its name, as no registry is reachable.
const (
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	// BusyBoxImage: the Conntrack tests' init container and the client
	// of the invalid-conntrack-state test (`nc boom-server 9000`).
	BusyBoxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	// RegressionIssue74839Image: that test's boom-server.
	RegressionIssue74839Image = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"
	// DistrolessIptablesImage: KubeProxy's CLOSE_WAIT test reads the
	// node's conntrack table from a privileged hostNetwork pod of it.
	DistrolessIptablesImage = "registry.k8s.io/build-image/distroless-iptables:v0.9.6"
)

// imageRecipe changes whenever the way the images are assembled changes,
// so that cached archives are rebuilt.
const imageRecipe = "test-images-r4"

// imagePrune are removed from the unpacked packages.
var imagePrune = []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian",
	"usr/share/locale", "usr/share/bug", "usr/lib/x86_64-linux-gnu/gconv", "usr/lib/aarch64-linux-gnu/gconv"}

// imageEpoch is the time of every file and of the images.
var imageEpoch = time.Unix(0, 0).UTC()

// binDirs are where the images' commands are looked up (their PATH).
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}

// imagePath is the images' PATH: binDirs as absolute paths.
var imagePath = "PATH=/" + strings.Join(binDirs, ":/")

// The users and groups of every image; a recipe may add more.
const (
	basePasswd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	baseGroup  = "root:x:0:\nnogroup:x:65534:\n"
)

// testImage is the recipe of a test image: a layer of Debian packages,
// unpacked with their dependencies (nothing installed) and finished as
// their maintainer scripts would (links), with busybox-static's applets
// linked for every command that no package provides; above it, a layer
// of host files (static binaries), if any.
type testImage struct {
	ref  string // the name e2e.test gives the image
	name string // the archive's base name; the node's file is name.tar
	// packages are Debian packages, followed by their dependencies;
	// noFollow packages come without theirs. busybox-static must be
	// among packages.
	packages, noFollow []string
	// links are symbolic links (path -> target) that the packages'
	// maintainer scripts (update-alternatives) would have made.
	links map[string]string
	// need are the commands the tests run: each must be on PATH.
	need []string
	// users and groups are /etc/passwd and /etc/group lines beyond
	// root's and nobody's; dirs are more directories (0755).
	users, groups string
	dirs          []string
	// files are the top layer: path in the image -> host file (0755).
	files map[string]string
	// source says where the files come from (the layer's history).
	source          string
	entrypoint, cmd []string
}

// testImages are the recipes of the images that the focus's tests start,
// around the static agnhost and boom-server binaries.
func testImages(agnhost, boomServer string) []testImage {
	return []testImage{{
		// Upstream's agnhost is Alpine's busybox with bind-tools, curl,
		// netcat-openbsd, iproute2 (and iperf, bash, util-linux-misc
		// that the Services tests do not use). The tests exec `/bin/sh
		// -x -c` with curl, nc (-v -z -t -u -w), nslookup, ss, wget, seq,
		// grep, tail, test, echo, sleep and cat. wget is GNU wget:
		// Debian 12's busybox-static (1.35) segfaults on every `wget -T
		// N` (the timeout the Services tests' wget loops pass), which
		// failed "should serve a basic endpoint from pods"-style
		// reachability checks with "Segmentation fault" as the answer.
		// /bin/sh is dash, not busybox's: Debian builds busybox-static
		// to prefer its own applets inside its shell, so `nc` or `ip`
		// there would be busybox's, not the packages'. dash needs only
		// libc6, which is in; its other dependencies (dpkg, debianutils)
		// are not followed.
		ref: AgnhostImage, name: "agnhost",
		packages: []string{"busybox-static", "bind9-dnsutils", "curl", "iproute2", "netcat-openbsd", "wget"},
		noFollow: []string{"dash"},
		// agnhost-2: the second name the entrypoint tests run it under.
		links: map[string]string{"bin/nc": "nc.openbsd", "agnhost-2": "agnhost"},
		need:  []string{"sh", "curl", "nc", "nslookup", "ss", "ip", "wget", "seq", "grep"},
		// The users and groups of upstream's image (a
		// supplemental-groups test relies on the last two).
		users:  "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		groups: "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n",
		// uploads: netexec's upload directory.
		dirs:       []string{"home/user-defined-in-image", "uploads"},
		files:      map[string]string{"agnhost": agnhost},
		source:     "agnhost (k8s.io/kubernetes/test/images/agnhost)",
		entrypoint: []string{"/agnhost"}, cmd: []string{"pause"},
	}, {
		// Upstream's is Docker Hub's busybox:1.37.0 (CMD ["sh"]); the
		// Conntrack tests run sh, echo, sleep and nc in it.
		ref: BusyBoxImage, name: "busybox",
		packages: []string{"busybox-static"},
		need:     []string{"sh", "echo", "sleep", "nc", "date", "seq"},
		cmd:      []string{"sh"},
	}, {
		// Upstream's is the static boom-server on debian-base (its
		// Dockerfile: ADD regression-issue-74839 /regression-issue-74839,
		// ENTRYPOINT ["/regression-issue-74839"]); busybox stands in for
		// debian-base's shell.
		ref: RegressionIssue74839Image, name: "regression-issue-74839",
		packages:   []string{"busybox-static"},
		need:       []string{"sh"},
		files:      map[string]string{"regression-issue-74839": boomServer},
		source:     "boom-server (k8s.io/kubernetes/test/images/regression-issue-74839)",
		entrypoint: []string{"/regression-issue-74839"},
	}, {
		// Upstream's is Debian's iptables, conntrack and friends staged
		// on distroless/static (no entrypoint). The test runs `sleep 600`
		// and execs `/bin/sh -x -c` with test, which, conntrack -L, grep
		// -m 1 and cat. The unsuffixed iptables names are nft, as
		// Debian's alternatives default.
		ref: DistrolessIptablesImage, name: "distroless-iptables",
		packages: []string{"busybox-static", "conntrack", "iptables"},
		links: map[string]string{
			"usr/sbin/iptables": "iptables-nft", "usr/sbin/iptables-save": "iptables-nft-save",
			"usr/sbin/iptables-restore": "iptables-nft-restore", "usr/sbin/ip6tables": "ip6tables-nft",
			"usr/sbin/ip6tables-save": "ip6tables-nft-save", "usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
		},
		need: []string{"sh", "sleep", "test", "which", "conntrack", "grep", "cat", "iptables"},
	}}
}

// EnsureTestImages returns OCI archives of the images that the focus's
// tests start (agnhost, BusyBox, RegressionIssue74839 and
// DistrolessIptables), keyed by the file name a node imports each from
// (agnhost.tar, ...): the images are made from the suite's agnhost, the
// boom-server built from e2e/tools/k8se2e, and Debian packages (fetched with
// apt-get download, unpacked, nothing installed). Each is cached in
// cacheDir/images, keyed by its recipe and binaries; concurrent callers
// build it once.
func EnsureTestImages(ctx context.Context, cacheDir string, suite Suite, logf func(string, ...any)) (map[string]string, error) {
	bins, err := EnsureImageBinaries(ctx, cacheDir)
	if err != nil {
		return nil, err
	}
	archives := map[string]string{}
	for _, im := range testImages(suite.Agnhost(), filepath.Join(bins, BinRegressionIssue74839)) {
		out, err := ensureImage(ctx, cacheDir, im, logf)
		if err != nil {
			return nil, err
		}
		archives[im.name+".tar"] = out
	}
	return archives, nil
}

// key is the cache key of the image: its recipe with the files' digests
// in place of their paths.
func (im testImage) key() (string, error) {
	digests := map[string]string{}
	for p, host := range im.files {
		sum, err := ociimage.FileDigest(host)
		if err != nil {
			return "", err
		}
		digests[p] = sum
	}
	im.files = digests
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%#v\n", imageRecipe, im) // %#v prints maps sorted by key
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// ensureImage returns the image's archive, built unless it is in
// cacheDir/images.
func ensureImage(ctx context.Context, cacheDir string, im testImage, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	key, err := im.key()
	if err != nil {
		return "", fmt.Errorf("%s image: %w", im.name, err)
	}
	_, tag, _ := strings.Cut(im.ref[strings.LastIndex(im.ref, "/")+1:], ":")
	out := filepath.Join(cacheDir, "images", im.name+"-"+tag+"-"+key+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("%s image: %w", im.name, err)
	}
	unlock, err := controlplane.LockFile(ctx, out+".lock")
	if err != nil {
		return "", fmt.Errorf("%s image: %w", im.name, err)
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	start := time.Now()
	if err := im.build(ctx, out, logf); err != nil {
		return "", fmt.Errorf("%s image: %w", im.name, err)
	}
	if st, err := os.Stat(out); err == nil {
		logf("%s image %s: %.1f MiB in %s", im.name, out, float64(st.Size())/(1<<20), time.Since(start).Round(100*time.Millisecond))
	}
	return out, nil
}

// build assembles the image and writes its archive to out.
func (im testImage) build(ctx context.Context, out string, logf func(string, ...any)) error {
	work, err := os.MkdirTemp("", im.name+"-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	pkgs, err := debian.Closure(ctx, im.packages, debian.ClosureOptions{})
	if err != nil {
		return err
	}
	pkgs = append(pkgs, im.noFollow...)
	root, versions, err := debian.Unpack(ctx, work, pkgs, logf)
	if err != nil {
		return err
	}
	if err := im.finishUserland(ctx, root); err != nil {
		return fmt.Errorf("userland: %w", err)
	}
	var pv []string
	for _, p := range pkgs {
		pv = append(pv, p+"="+versions[p])
	}
	userland, err := ociimage.Layer(func(t *ociimage.TarWriter) error { return t.Tree(root) }, imageEpoch)
	if err != nil {
		return fmt.Errorf("userland layer: %w", err)
	}
	layers := []ociimage.ImageLayer{{Layer: userland, CreatedBy: "Debian packages " + strings.Join(pv, " ")}}
	if len(im.files) > 0 {
		names := make([]string, 0, len(im.files))
		for p := range im.files {
			names = append(names, p)
		}
		sort.Strings(names)
		top, err := ociimage.Layer(func(t *ociimage.TarWriter) error {
			for _, p := range names {
				if err := t.File(p, im.files[p], 0o755); err != nil {
					return err
				}
			}
			return nil
		}, imageEpoch)
		if err != nil {
			return fmt.Errorf("binary layer: %w", err)
		}
		layers = append(layers, ociimage.ImageLayer{Layer: top, CreatedBy: im.source + " /" + strings.Join(names, " /")})
	}
	img, err := ociimage.Image(layers, ociimage.Config{
		// The binaries are built for this machine, like the Debian
		// packages.
		Arch: runtime.GOARCH, Epoch: imageEpoch,
		Entrypoint: im.entrypoint, Cmd: im.cmd,
		Env:    []string{imagePath},
		Labels: map[string]string{"io.ipvs-proxy.debian-packages": strings.Join(pv, " ")},
	})
	if err != nil {
		return err
	}
	return ociimage.WriteArchive(img, im.ref, out, imageEpoch)
}

// finishUserland prunes the unpacked packages, makes the recipe's links,
// links busybox's applets that no package provides (wget, seq, grep...),
// and adds the users, directories and files a running system has.
func (im testImage) finishUserland(ctx context.Context, root string) error {
	for _, p := range imagePrune {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	for link, target := range im.links {
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
	for _, cmd := range im.need {
		if !provided(root, cmd) {
			return fmt.Errorf("no %s in the image", cmd)
		}
	}
	files := map[string]string{
		"etc/passwd":        basePasswd + im.users,
		"etc/group":         baseGroup + im.groups,
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
	dirs := map[string]os.FileMode{"tmp": 0o777 | os.ModeSticky, "root": 0o700, "proc": 0o555, "sys": 0o555,
		"dev": 0o755, "run": 0o755}
	for _, d := range im.dirs {
		dirs[d] = 0o755
	}
	for d, mode := range dirs {
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
