package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

// command is a main package of the wrapper module and its binary's name.
// A binary named NAME.test is the package's test binary (`go test -c`).
type command struct{ pkg, binary string }

// testBinarySuffix marks a command built with `go test -c`.
const testBinarySuffix = ".test"

// The commands built from the wrapper module, in two sets. Every
// Kubernetes binary the bed's clusters run is built in one `go build`, so
// that `make bed` builds them all beside the lint and unit tests, and a
// fresh machine's first cluster test waits for none (built one by one on
// first use, kubelet, kube-controller-manager and kube-scheduler were
// compiled and linked on the tests' critical path). kube-proxy, which only
// the tests that compare with it run, is built on first use.
var (
	clusterCommands = []command{
		{"k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"},
		// The main package of etcd's server module is named "server".
		{"go.etcd.io/etcd/server/v3", "etcd"},
		{"k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"},
		{"k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"},
		// kubelet runs in the VM, which runs this host's architecture.
		{"k8s.io/kubernetes/cmd/kubelet", "kubelet"},
	}
	kubeProxyCommands = []command{{"k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy"}}
)

// Binary names inside the directories that the Ensure functions return.
const (
	BinAPIServer         = "kube-apiserver"
	BinControllerManager = "kube-controller-manager"
	BinEtcd              = "etcd"
	BinKubeProxy         = "kube-proxy"
	BinKubelet           = "kubelet"
	BinScheduler         = "kube-scheduler"
)

// CacheDir is where built control-plane binaries are kept between test runs:
// $IPVS_PROXY_CACHE if set, else $HOME/.cache/ipvs-proxy (or the user cache
// directory when HOME is unset).
func CacheDir() string {
	if d := os.Getenv("IPVS_PROXY_CACHE"); d != "" {
		return d
	}
	if home := os.Getenv("HOME"); home != "" {
		return filepath.Join(home, ".cache", "ipvs-proxy")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "ipvs-proxy")
	}
	return filepath.Join(os.TempDir(), "ipvs-proxy-cache")
}

// EnsureBinaries returns a directory holding kube-apiserver, etcd,
// kube-controller-manager, kube-scheduler and kubelet, built in one `go
// build` from the wrapper module e2e/tools/k8sbin
// with the Go toolchain on PATH (or /usr/local/go/bin/go). The directory is
// <cacheDir>/k8s-<version>-<hash>, where the hash covers the wrapper's
// build list (`go list -m all`: every module's version and replacement)
// and the build recipe, so a version bump builds afresh, while a command
// added to the wrapper's tools.go (which adds lines to go.mod and go.sum
// but selects no other version) rebuilds nothing.
// Nothing is built when the directory exists. Concurrent callers, also in
// other processes, are serialised with a file lock; the build goes to a
// temporary directory that is renamed into place, so a killed build leaves
// nothing that looks complete.
//
// A cold build takes several minutes and about 2 GB of memory.
func EnsureBinaries(ctx context.Context, cacheDir string) (string, error) {
	return ensure(ctx, cacheDir, clusterCommands)
}

// EnsureControllerManager is EnsureBinaries under the name of the binary
// the caller wants (kube-controller-manager).
func EnsureControllerManager(ctx context.Context, cacheDir string) (string, error) {
	return EnsureBinaries(ctx, cacheDir)
}

// EnsureScheduler is EnsureBinaries under the name of the binary the
// caller wants (kube-scheduler).
func EnsureScheduler(ctx context.Context, cacheDir string) (string, error) {
	return EnsureBinaries(ctx, cacheDir)
}

// EnsureKubelet is EnsureBinaries under the name of the binary the caller
// wants (kubelet).
func EnsureKubelet(ctx context.Context, cacheDir string) (string, error) {
	return EnsureBinaries(ctx, cacheDir)
}

// EnsureKubeProxy is EnsureBinaries for kube-proxy, in a directory of its
// own. Its binary runs inside the test VM, which runs this host's
// architecture.
func EnsureKubeProxy(ctx context.Context, cacheDir string) (string, error) {
	return ensure(ctx, cacheDir, kubeProxyCommands)
}

// WrapperPackage is a package of a wrapper module and the name of the
// binary built from it; a binary named NAME.test is the package's test
// binary (`go test -c`).
type WrapperPackage struct{ Path, Binary string }

// EnsureWrapperBinaries is EnsureBinaries for packages of another wrapper
// module: module is its folder relative to the repository root (e.g.
// "e2e/tools/k8se2e"), with its own go.mod requiring k8s.io/kubernetes. The
// directory is keyed by that module's build list, so each wrapper module
// has its own cache key.
func EnsureWrapperBinaries(ctx context.Context, cacheDir, module string, pkgs []WrapperPackage) (string, error) {
	commands := make([]command, len(pkgs))
	for i, p := range pkgs {
		commands[i] = command{p.Path, p.Binary}
	}
	return ensureModule(ctx, cacheDir, module, commands)
}

func ensure(ctx context.Context, cacheDir string, commands []command) (string, error) {
	return ensureModule(ctx, cacheDir, "e2e/tools/k8sbin", commands)
}

// EnsureModuleBinaries is EnsureWrapperBinaries for a wrapper module of
// another project than Kubernetes (e.g. "e2e/tools/coredns"): its binaries are
// not version-stamped and go to a directory of cacheDir named name-<hash
// of the module's build list>.
func EnsureModuleBinaries(ctx context.Context, cacheDir, module, name string, pkgs []WrapperPackage) (string, error) {
	commands := make([]command, len(pkgs))
	for i, p := range pkgs {
		commands[i] = command{p.Path, p.Binary}
	}
	modDir, err := wrapperModuleDir(module)
	if err != nil {
		return "", err
	}
	return buildModule(ctx, cacheDir, modDir, name, "-s -w", commands)
}

func ensureModule(ctx context.Context, cacheDir, module string, commands []command) (string, error) {
	modDir, err := wrapperModuleDir(module)
	if err != nil {
		return "", err
	}
	goMod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("read wrapper module: %w", err)
	}
	version, err := kubernetesVersion(goMod)
	if err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(modDir, "go.mod"), err)
	}
	ldflags, err := versionLDFlags(version)
	if err != nil {
		return "", err
	}
	return buildModule(ctx, cacheDir, modDir, "k8s-"+version, ldflags, commands)
}

// buildModule builds commands of the wrapper module in modDir with ldflags
// into cacheDir/<name>-<hash>, unless they are there; the hash covers the
// module's build list, the flags and the commands.
func buildModule(ctx context.Context, cacheDir, modDir, name, ldflags string, commands []command) (string, error) {
	modules, err := buildList(ctx, modDir)
	if err != nil {
		return "", err
	}

	h := sha256.New()
	for _, part := range [][]byte{modules, []byte(ldflags)} {
		h.Write(part)
		h.Write([]byte{0})
	}
	for _, c := range commands {
		fmt.Fprintf(h, "%s=%s\n", c.pkg, c.binary)
	}
	// The wrapper module's own code (netsuite's test main, say), which
	// the build list does not cover; tools.go only pins requirements.
	if err := hashLocalSources(h, modDir); err != nil {
		return "", err
	}
	binDir := filepath.Join(cacheDir, name+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	if complete(binDir, commands) {
		return binDir, nil
	}

	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	unlock, err := lockFile(ctx, binDir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have finished the build while we waited.
	if complete(binDir, commands) {
		return binDir, nil
	}
	// Whoever left a temporary build directory behind is gone: it would
	// still hold the lock otherwise.
	if stale, _ := filepath.Glob(binDir + ".build-*"); len(stale) > 0 {
		for _, d := range stale {
			_ = os.RemoveAll(d)
		}
	}
	if _, err := os.Stat(binDir); err == nil {
		// Present but incomplete (should not happen with the rename).
		if err := os.RemoveAll(binDir); err != nil {
			return "", fmt.Errorf("remove incomplete %s: %w", binDir, err)
		}
	}

	tmp, err := os.MkdirTemp(cacheDir, filepath.Base(binDir)+".build-")
	if err != nil {
		return "", fmt.Errorf("create build dir: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op after the rename
	if err := goBuild(ctx, modDir, tmp, ldflags, commands); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(tmp, "server")); err == nil {
		if err := os.Rename(filepath.Join(tmp, "server"), filepath.Join(tmp, BinEtcd)); err != nil {
			return "", fmt.Errorf("rename etcd binary: %w", err)
		}
	}
	if !complete(tmp, commands) {
		return "", fmt.Errorf("go build in %s did not produce all of %s", modDir, binaryNames(commands))
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp made it 0700
		return "", fmt.Errorf("chmod build dir: %w", err)
	}
	if err := os.Rename(tmp, binDir); err != nil {
		return "", fmt.Errorf("move binaries into place: %w", err)
	}
	return binDir, nil
}

// hashLocalSources writes the path and content of every Go file of the
// wrapper module in modDir but tools.go into h (nothing when it has none,
// so a module of tools.go alone keeps its key).
func hashLocalSources(h io.Writer, modDir string) error {
	var files []string
	err := filepath.WalkDir(modDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && d.Name() != "tools.go" {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wrapper module %s: %w", modDir, err)
	}
	sort.Strings(files)
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("wrapper module %s: %w", modDir, err)
		}
		rel, _ := filepath.Rel(modDir, p)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		if _, err := h.Write(b); err != nil {
			return fmt.Errorf("wrapper module %s: %w", modDir, err)
		}
	}
	return nil
}

// goTool is the go command on PATH, or at its usual install location.
func goTool() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
		if _, serr := os.Stat(goBin); serr != nil {
			return "", fmt.Errorf("no go toolchain on PATH nor at %s: %w", goBin, err)
		}
	}
	return goBin, nil
}

// goEnv is the environment of go commands in the wrapper module: the
// binaries run on this machine, whatever the caller cross-compiles to.
func goEnv() []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
}

// buildList is the wrapper module's build list: every module with its
// selected version and replacement, and the wrapper's go version. (Not the
// other modules' go versions: `go list` knows those only for modules that
// go.mod lists, so a new import would change them.)
func buildList(ctx context.Context, modDir string) ([]byte, error) {
	goBin, err := goTool()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, goBin, "list", "-m",
		"-f", "{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{if .Main}} go {{.GoVersion}}{{end}}", "all")
	cmd.Dir = modDir
	cmd.Env = goEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m all in %s: %w\n%s", modDir, err, tail(stderr.Bytes(), 20))
	}
	return out, nil
}

// goBuild builds commands of the wrapper module into outDir.
func goBuild(ctx context.Context, modDir, outDir, ldflags string, commands []command) error {
	goBin, err := goTool()
	if err != nil {
		return err
	}
	var mains []string
	for _, c := range commands {
		if strings.HasSuffix(c.binary, testBinarySuffix) {
			args := []string{"test", "-c", "-vet=off", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(outDir, c.binary), c.pkg}
			if err := runGo(ctx, goBin, modDir, args); err != nil {
				return err
			}
			continue
		}
		mains = append(mains, c.pkg)
	}
	if len(mains) == 0 {
		return nil
	}
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", outDir + string(filepath.Separator)}, mains...)
	return runGo(ctx, goBin, modDir, args)
}

// runGo runs the go command in the wrapper module.
func runGo(ctx context.Context, goBin, modDir string, args []string) error {
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = modDir
	cmd.Env = goEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Own process group, so that cancelling also stops the compilers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second

	start := time.Now()
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("start go %s: %w", args[0], err)
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return fmt.Errorf("go %s in %s after %s: %w\n%s", args[0], modDir, time.Since(start).Round(time.Second),
			err, tail(out.Bytes(), 60))
	}
	return nil
}

// LockFile takes an exclusive flock on path, waiting for ctx; the returned
// func releases it. Other builders of cached parts share it.
func LockFile(ctx context.Context, path string) (func(), error) { return lockFile(ctx, path) }

// lockFile takes an exclusive flock on path, polling so that ctx can cancel
// the wait. The returned func releases it.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for lock %s (another build running?): %w", path, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// complete reports whether dir holds every binary of commands.
func complete(dir string, commands []command) bool {
	for _, c := range commands {
		fi, err := os.Stat(filepath.Join(dir, c.binary))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

func binaryNames(commands []command) string {
	var names []string
	for _, c := range commands {
		names = append(names, c.binary)
	}
	return strings.Join(names, ", ")
}

// wrapperModuleDir finds a wrapper module (rel, e.g. e2e/tools/k8sbin): next to
// this source file when the test binary was built without -trimpath, else
// above the working directory (go test runs a test binary in its package's
// folder).
func wrapperModuleDir(rel string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		d := filepath.Join(filepath.Dir(file), "..", "..", "..", filepath.FromSlash(rel))
		if isModule(d) {
			return d, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", rel, err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if c := filepath.Join(d, filepath.FromSlash(rel)); isModule(c) {
			return c, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find %s: not next to this source file nor above %s", rel, wd)
		}
	}
}

func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// kubernetesVersion reads the required version of k8s.io/kubernetes.
func kubernetesVersion(goMod []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(goMod))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require"))
		if len(f) >= 2 && f[0] == "k8s.io/kubernetes" && strings.HasPrefix(f[1], "v1.") {
			return f[1], nil
		}
	}
	return "", errors.New("no requirement of k8s.io/kubernetes v1.x")
}

// versionLDFlags stamps the version into the binaries as the upstream build
// does; unstamped binaries report v0.0.0-master.
func versionLDFlags(version string) (string, error) {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return "", fmt.Errorf("odd Kubernetes version %q", version)
	}
	major, minor := parts[0], parts[1]
	flags := []string{"-s", "-w"}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			"-X", pkg+".gitVersion="+version,
			"-X", pkg+".gitMajor="+major,
			"-X", pkg+".gitMinor="+minor,
			"-X", pkg+".gitTreeState=clean")
	}
	return strings.Join(flags, " "), nil
}
