package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
)

// recipeRevision is bumped by hand when the way assets are assembled
// changes in a way the lists below do not show; the lists are hashed into
// the cache key anyway.
const recipeRevision = 2

var (
	// hostRoots run on the host: QEMU with its firmware, and a static
	// busybox (depmod for the initramfs, nc for the apiserver forward, and
	// the guest's userland).
	hostRoots = []string{"qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios", "busybox-static"}
	// hostNoFollow: their dependencies are not needed to run
	// qemu-system-x86_64 (they serve helpers and display modules).
	hostNoFollow = map[string]bool{"qemu-system-common": true, "qemu-system-data": true, "seabios": true, "busybox-static": true}
	// hostSkip: network boot ROMs, unused (the NIC has romfile=).
	hostSkip = map[string]bool{"ipxe-qemu": true}

	// guestPackages provide the guest's tools and their libraries; the
	// libraries actually copied are found from the binaries' ELF headers.
	guestPackages = []string{"libc6", "libxtables12", "libip4tc2", "libip6tc2", "libmnl0", "libnl-3-200",
		"libnl-genl-3-200", "libpopt0", "libipset13", "libnftnl11", "libnetfilter-conntrack3", "libnfnetlink0",
		"ipvsadm", "ipset", "iptables", "netbase",
		// nft, for kube-proxy's nftables mode in `make bench`.
		"nftables", "libnftables1", "libgmp10", "libjansson4", "libedit2", "libbsd0", "libmd0", "libtinfo6"}
	// guestBinaries are copied from guestPackages into the guest.
	guestBinaries = []string{"ipvsadm", "ipset", "xtables-nft-multi", "xtables-legacy-multi", "nft"}
	// guestLinks are the iptables front ends: name -> multi-call binary.
	// The unsuffixed names are the nft ones, as on a default Debian.
	guestLinks = func() map[string]string {
		m := map[string]string{}
		for _, fam := range []string{"iptables", "ip6tables"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				m[fam+"-nft"+suffix] = "xtables-nft-multi"
				m[fam+suffix] = "xtables-nft-multi"
				m[fam+"-legacy"+suffix] = "xtables-legacy-multi"
			}
		}
		return m
	}()

	// bootModules are loaded by /init, in this order.
	bootModules = []string{
		"virtio_pci", "virtio_net", // the NIC (the agent's only way out)
		"crc32c_generic", "libcrc32c", "nf_defrag_ipv4", "nf_defrag_ipv6", "nf_conntrack", "nf_nat",
		"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_lblc", "ip_vs_lblcr", "ip_vs_dh",
		"ip_vs_sh", "ip_vs_sed", "ip_vs_nq", "ip_vs_fo", "ip_vs_ovf", "ip_vs_mh",
		"dummy", "veth",
		"nfnetlink", "nf_conntrack_netlink",
		"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet",
		"ip_set_hash_net", "ip_set_bitmap_port",
		"x_tables", "xt_tcpudp", "xt_set", "xt_mark", "xt_comment", "xt_addrtype", "xt_conntrack",
		"xt_MASQUERADE", "xt_nat", "xt_multiport", "xt_statistic",
		"ip_tables", "iptable_filter", "iptable_nat", "iptable_mangle",
		"ip6_tables", "ip6table_filter", "ip6table_nat", "ip6table_mangle",
		"nf_reject_ipv4", "nf_reject_ipv6", "ipt_REJECT", "ip6t_REJECT",
		"nf_tables", "nft_compat", "nft_chain_nat", "nft_ct", "nft_masq", "nft_nat",
		"nft_reject", "nft_reject_inet",
	}
	// extraModules are in the initramfs but loaded only on demand (by a
	// test, or by the kernel through /sbin/modprobe).
	extraModules = []string{"bridge", "br_netfilter", "sctp", "xt_physdev", "xt_recent", "xt_limit",
		"nft_fib_inet", "nft_limit", "ip_vs_ftp", "overlay",
		// kube-proxy's nftables mode (NFTablesModules) beyond bootModules.
		"nft_fib_ipv4", "nft_fib_ipv6", "nft_numgen", "nft_reject_ipv4", "nft_reject_ipv6",
		// Direct server return (TestDSRPrototype): IPIP and GUE (fou)
		// decapsulation, the IPv6 tunnel, TCP MSS clamping.
		"ipip", "fou", "ip6_tunnel", "xt_TCPMSS"}
)

// recipe is the asset recipe's version: the revision and a hash of the
// lists, so that editing a list makes a new cache directory.
var recipe = func() string {
	h := sha256.New()
	fmt.Fprintln(h, recipeRevision, hostRoots, hostNoFollow, hostSkip, guestPackages, guestBinaries, guestLinks,
		bootModules, extraModules)
	return fmt.Sprintf("r%d-%s", recipeRevision, hex.EncodeToString(h.Sum(nil))[:8])
}()

// Assets are the files a VM boots from, cached under one directory.
type Assets struct {
	// Dir holds everything below.
	Dir string `json:"-"`
	// KernelABI is the Debian kernel's ABI, e.g. 6.1.0-48-amd64.
	KernelABI string `json:"kernel_abi"`
	// Packages maps each unpacked Debian package to its version.
	Packages map[string]string `json:"packages"`
	// Modules are the modules /init loads, in order (built-in ones left
	// out); ExtraModules can be loaded on demand.
	Modules      []string `json:"modules"`
	ExtraModules []string `json:"extra_modules"`
	// Kernel is the uncompressed ELF vmlinux (booted via PVH).
	Kernel string `json:"-"`
	// Initramfs is the base initramfs, an uncompressed newc cpio.
	Initramfs string `json:"-"`
	// QEMU is qemu-system-x86_64; it runs with LibDirs in
	// LD_LIBRARY_PATH and finds its firmware in FirmwareDirs.
	QEMU         string   `json:"-"`
	LibDirs      []string `json:"-"`
	FirmwareDirs []string `json:"-"`
	// Busybox is a static busybox for the host (its nc serves guestfwd).
	Busybox string `json:"-"`
}

const manifestName = "assets.json"

// CacheDir is where assets are cached by default: $IPVS_PROXY_CACHE, or
// $HOME/.cache/ipvs-proxy.
func CacheDir() string {
	if d := os.Getenv("IPVS_PROXY_CACHE"); d != "" {
		return d
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "ipvs-proxy")
	}
	return filepath.Join(os.TempDir(), "ipvs-proxy-cache")
}

func (a *Assets) fillPaths(dir string) {
	a.Dir = dir
	host := filepath.Join(dir, "host")
	a.Kernel = filepath.Join(dir, "vmlinux")
	a.Initramfs = filepath.Join(dir, "initramfs.cpio")
	a.QEMU = filepath.Join(host, "usr/bin/qemu-system-x86_64")
	a.LibDirs = []string{filepath.Join(host, "lib/x86_64-linux-gnu"), filepath.Join(host, "usr/lib/x86_64-linux-gnu")}
	a.FirmwareDirs = []string{filepath.Join(host, "usr/share/qemu"), filepath.Join(host, "usr/share/seabios")}
	a.Busybox = filepath.Join(host, "bin/busybox")
}

// qemuEnv is the environment QEMU runs with.
func (a *Assets) qemuEnv() []string {
	libs := strings.Join(a.LibDirs, ":")
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		libs += ":" + old
	}
	return append(os.Environ(), "LD_LIBRARY_PATH="+libs)
}

// check verifies that the assets are complete and QEMU runs here.
func (a *Assets) check(ctx context.Context) error {
	for _, f := range []string{a.Kernel, a.Initramfs, a.QEMU, a.Busybox} {
		if _, err := os.Stat(f); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.QEMU, "-version")
	cmd.Env = a.qemuEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s does not run here: %w: %s", a.QEMU, err, tail(string(out), 1000))
	}
	return nil
}

func loadAssets(dir string) (*Assets, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	a := &Assets{}
	if err := json.Unmarshal(b, a); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	a.fillPaths(dir)
	return a, nil
}

var ensured sync.Map // cacheDir -> *Assets, for this process

// EnsureAssets returns the assets to boot test VMs from, assembling them
// into cacheDir ("" means CacheDir()) on first use: the current Debian
// kernel (its ABI resolved from `apt-cache depends linux-image-amd64`),
// QEMU and the libraries this host lacks for it, SeaBIOS, busybox, and a
// base initramfs with the kernel modules IPVS tests need and ipvsadm, ipset
// and iptables (nft and legacy). Packages are fetched with `apt-get
// download` and unpacked with `dpkg-deb -x`; nothing is installed. The
// result lives in cacheDir/vm-<kernel ABI>-<recipe>/, made atomically under
// a file lock, so concurrent callers assemble once and later calls only
// check it. logf (may be nil) reports progress.
func EnsureAssets(ctx context.Context, cacheDir string, logf func(string, ...any)) (*Assets, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if cacheDir == "" {
		cacheDir = CacheDir()
	}
	if a, ok := ensured.Load(cacheDir); ok {
		return a.(*Assets), nil
	}
	a, err := ensureAssets(ctx, cacheDir, logf)
	if err != nil {
		return nil, err
	}
	ensured.Store(cacheDir, a)
	return a, nil
}

func ensureAssets(ctx context.Context, cacheDir string, logf func(string, ...any)) (*Assets, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("vm assets: %w", err)
	}
	updated := false
	abi, err := kernelABI(ctx, cacheDir)
	if err != nil {
		// No usable package lists: a cached kernel of this recipe will do.
		if a := newestCached(ctx, cacheDir); a != nil {
			logf("vm: cannot resolve the kernel ABI (%v); using cached %s", err, a.Dir)
			return a, nil
		}
		if uerr := debian.Update(ctx, logf); uerr != nil {
			return nil, fmt.Errorf("vm assets: resolve kernel ABI: %w (apt-get update: %w)", err, uerr)
		}
		updated = true
		if abi, err = kernelABI(ctx, cacheDir); err != nil {
			return nil, fmt.Errorf("vm assets: resolve kernel ABI after apt-get update: %w", err)
		}
	}
	for {
		a, err := ensureABI(ctx, cacheDir, abi, logf)
		if err == nil || !errors.Is(err, debian.ErrDownload) || updated {
			return a, err
		}
		// Stale package lists name files the mirror no longer has.
		logf("vm: %v", err)
		if uerr := debian.Update(ctx, logf); uerr != nil {
			return nil, fmt.Errorf("vm assets: %w (apt-get update: %w)", err, uerr)
		}
		updated = true
		if abi, err = kernelABI(ctx, cacheDir); err != nil {
			return nil, fmt.Errorf("vm assets: resolve kernel ABI after apt-get update: %w", err)
		}
	}
}

// newestCached returns the most recent complete assets of this recipe in
// cacheDir, if any.
func newestCached(ctx context.Context, cacheDir string) *Assets {
	dirs, _ := filepath.Glob(filepath.Join(cacheDir, "vm-*-"+recipe))
	var best *Assets
	var bestTime time.Time
	for _, d := range dirs {
		st, err := os.Stat(filepath.Join(d, manifestName))
		if err != nil || (best != nil && st.ModTime().Before(bestTime)) {
			continue
		}
		if a, err := loadAssets(d); err == nil && a.check(ctx) == nil {
			best, bestTime = a, st.ModTime()
		}
	}
	return best
}

func ensureABI(ctx context.Context, cacheDir, abi string, logf func(string, ...any)) (*Assets, error) {
	dir := filepath.Join(cacheDir, "vm-"+abi+"-"+recipe)
	if a, err := loadAssets(dir); err == nil {
		err := a.check(ctx)
		if err == nil {
			markUsed(dir)
			return a, nil
		}
		logf("vm: cached assets in %s are unusable, assembling them again: %v", dir, err)
	}

	unlock, err := lockFile(ctx, dir+".lock", logf)
	if err != nil {
		return nil, fmt.Errorf("vm assets: %w", err)
	}
	defer unlock()
	if a, err := loadAssets(dir); err == nil { // made while we waited?
		if err := a.check(ctx); err == nil {
			return a, nil
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("vm assets: %w", err)
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("vm assets: %w", err)
	}
	start := time.Now()
	logf("vm: assembling assets for kernel %s in %s", abi, dir)
	a, err := assemble(ctx, tmp, abi, logf)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("vm assets for kernel %s: %w", abi, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("vm assets: %w", err)
	}
	a.fillPaths(dir)
	logf("vm: assets for kernel %s assembled in %v", abi, time.Since(start).Round(100*time.Millisecond))
	pruneUnused(cacheDir, dir, logf)
	return a, nil
}

// pruneAfter is how long assets may go unused before another assembly in
// the same cache directory removes them.
const pruneAfter = 14 * 24 * time.Hour

// markUsed bumps the time of dir's manifest (at most hourly), which
// pruneUnused reads as the time of last use.
func markUsed(dir string) {
	p := filepath.Join(dir, manifestName)
	if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > time.Hour {
		now := time.Now()
		_ = os.Chtimes(p, now, now)
	}
}

// pruneUnused removes the other asset directories of cacheDir (older
// kernels, older recipes) that have not been used for pruneAfter.
func pruneUnused(cacheDir, keep string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(cacheDir, "vm-*"))
	for _, d := range dirs {
		st, err := os.Stat(filepath.Join(d, manifestName))
		if d == keep || err != nil || time.Since(st.ModTime()) < pruneAfter {
			continue
		}
		f, err := os.OpenFile(d+".lock", os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			logf("vm: removing assets unused since %s: %s", st.ModTime().Format(time.DateOnly), d)
			_ = os.RemoveAll(d)
			_ = os.Remove(d + ".lock")
		}
		f.Close()
	}
}

// lockFile takes an exclusive flock on path, waiting for ctx.
func lockFile(ctx context.Context, path string, logf func(string, ...any)) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !logged {
			logf("vm: waiting for %s (another process holds it)", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// assemble builds the assets of kernel abi in dir.
func assemble(ctx context.Context, dir, abi string, logf func(string, ...any)) (*Assets, error) {
	work := filepath.Join(dir, "work")
	debs := filepath.Join(work, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	host, err := debian.Closure(ctx, hostRoots, debian.ClosureOptions{NoFollow: hostNoFollow, Skip: hostSkip, ForHost: true})
	if err != nil {
		return nil, fmt.Errorf("host packages: %w", err)
	}
	kernelPkg := "linux-image-" + abi
	all := append(append(append([]string{}, host...), kernelPkg), guestPackages...)
	xz, err := exec.LookPath("xz")
	if err != nil {
		all = append(all, "xz-utils")
	}
	all = dedup(all)
	t := time.Now()
	logf("vm: apt-get download %s", strings.Join(all, " "))
	if err := debian.Download(ctx, debs, all); err != nil {
		return nil, err
	}
	logf("vm: downloaded %d packages in %v", len(all), time.Since(t).Round(100*time.Millisecond))

	a := &Assets{KernelABI: abi, Packages: map[string]string{}}
	a.fillPaths(dir)
	kernelRoot, guestRoot := filepath.Join(work, "kernel"), filepath.Join(work, "guest")
	if err := debian.Extract(ctx, debs, filepath.Join(dir, "host"), host, a.Packages); err != nil {
		return nil, err
	}
	if err := debian.Extract(ctx, debs, kernelRoot, []string{kernelPkg}, a.Packages); err != nil {
		return nil, err
	}
	if err := debian.Extract(ctx, debs, guestRoot, guestPackages, a.Packages); err != nil {
		return nil, err
	}
	if xz == "" {
		xzRoot := filepath.Join(work, "xz")
		if err := debian.Extract(ctx, debs, xzRoot, []string{"xz-utils"}, nil); err != nil {
			return nil, err
		}
		xz = filepath.Join(xzRoot, "usr/bin/xz")
	}

	if err := extractVmlinux(ctx, xz, filepath.Join(kernelRoot, "boot", "vmlinuz-"+abi), a.Kernel); err != nil {
		return nil, err
	}
	mods, err := buildBaseInitramfs(ctx, baseInputs{
		out: a.Initramfs, abi: abi, busybox: a.Busybox, kernelRoot: kernelRoot, guestRoot: guestRoot, work: work,
	})
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	a.Modules, a.ExtraModules = mods.boot, mods.extra
	if st, err := os.Stat(a.Initramfs); err == nil {
		logf("vm: base initramfs %d MiB, %d modules (%d loaded at boot)", st.Size()>>20, mods.files, len(a.Modules))
	}
	if err := a.check(ctx); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, manifestName), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	return a, nil
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

// xzMagic starts an xz stream.
var xzMagic = []byte("\xfd7zXZ\x00")

// extractVmlinux unpacks the xz payload of a bzImage into an ELF vmlinux,
// which QEMU boots through its PVH entry point, skipping the slow (under
// TCG) in-guest decompressor.
func extractVmlinux(ctx context.Context, xz, vmlinuz, out string) error {
	img, err := os.ReadFile(vmlinuz)
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	lastErr := errors.New("no xz payload found")
	for off := 0; ; {
		i := bytes.Index(img[off:], xzMagic)
		if i < 0 {
			break
		}
		off += i
		lastErr = unxz(ctx, xz, img[off:], out)
		if lastErr == nil {
			return nil
		}
		off++
	}
	return fmt.Errorf("vmlinux from %s: %w", vmlinuz, lastErr)
}

func unxz(ctx context.Context, xz string, payload []byte, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	// --single-stream ignores what follows the payload in the bzImage.
	cmd := exec.CommandContext(ctx, xz, "-dc", "--single-stream")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(payload), f, &stderr
	runErr := cmd.Run()
	if err := f.Close(); err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil {
		return fmt.Errorf("xz: %w: %s", runErr, tail(stderr.String(), 500))
	}
	e, err := elf.Open(out)
	if err != nil {
		return fmt.Errorf("payload is no ELF: %w", err)
	}
	defer e.Close()
	if e.Machine != elf.EM_X86_64 {
		return fmt.Errorf("payload is an ELF for %v", e.Machine)
	}
	return nil
}

// shortHash is a short hex digest of s, for file names.
func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:12]
}
