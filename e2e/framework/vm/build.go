package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
)

// goTool is the go command: from PATH (go test puts its own first), else
// the usual install location.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// runGo runs the go command for package pkg in the module that holds it
// (repo.ModuleDir), or in the working directory for a ./relative pkg.
func runGo(ctx context.Context, pkg string, args ...string) error {
	dir := ""
	if !strings.HasPrefix(pkg, ".") {
		d, err := repo.ModuleDir(pkg)
		if err != nil {
			return err
		}
		dir = d
	}
	args = append(args, pkg)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 4000))
	}
	return nil
}

// BuildGoBinary builds package pkg (an import path, built in the module
// that holds it, or a ./relative directory, resolved in the current
// directory's module) into a static binary at out that runs in the guest.
func BuildGoBinary(ctx context.Context, pkg, out string) error {
	return runGo(ctx, pkg, "build", "-trimpath", "-o", out)
}

// buildStripped is BuildGoBinary without symbol tables: smaller, so the
// guest kernel unpacks it faster (under TCG that is about 60 ms per MiB).
func buildStripped(ctx context.Context, pkg, out string) error {
	return runGo(ctx, pkg, "build", "-trimpath", "-ldflags=-s -w", "-o", out)
}

// BuildTestBinary builds the tests of package pkg (`go test -c`) into a
// static binary at out that runs in the guest; run it there with -test.v
// and friends.
func BuildTestBinary(ctx context.Context, pkg, out string) error {
	return runGo(ctx, pkg, "test", "-c", "-trimpath", "-o", out)
}

// AgentPackage is the guest agent's import path.
const AgentPackage = "github.com/ipvs-proxy/ipvs-proxy/e2e/guest/vmagent"

var agentBuild struct {
	sync.Mutex
	dir string // cache directory of this module's agent, once built
}

// buildAgent brings the agent binary up to date in the cache (go build
// relinks only when sources changed) and copies it to out. The cache
// directory is per module checkout and guarded by a file lock, so that
// concurrent test processes neither race nor see a half-written binary.
func buildAgent(ctx context.Context, cacheDir, out string, logf func(string, ...any)) error {
	agentBuild.Lock()
	defer agentBuild.Unlock()
	dir := agentBuild.dir
	if dir == "" {
		mod, err := checkoutKey()
		if err != nil {
			return fmt.Errorf("vmagent: %w", err)
		}
		dir = filepath.Join(cacheDir, "vmagent-"+shortHash(mod))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("vmagent: %w", err)
		}
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"), logf)
	if err != nil {
		return fmt.Errorf("vmagent: %w", err)
	}
	defer unlock()
	bin := filepath.Join(dir, "vmagent")
	if agentBuild.dir == "" { // once per process: later VMs reuse the binary
		if err := buildStripped(ctx, AgentPackage, bin); err != nil {
			return fmt.Errorf("vmagent: %w", err)
		}
		agentBuild.dir = dir
	}
	return copyFile(bin, out, 0o755)
}

// checkoutKey names this checkout in cache keys: the path of the root
// module's go.mod (what `go env GOMOD` said when the bed was part of the
// root module, so the cached builds keep their folders).
func checkoutKey() (string, error) {
	root, err := repo.Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "go.mod"), nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, perm)
}

// BuildVariant builds package pkg with build tags (a test build, such as
// ipvs-proxy's faultinject) into a cache directory of its own, per module
// checkout and tags, and returns the binary's path. The binary stays
// there: go build relinks it only when its inputs changed (its build ID
// says), so a second build with nothing changed costs a check. A file lock
// keeps concurrent test processes apart.
func BuildVariant(ctx context.Context, cacheDir, pkg string, tags []string, logf func(string, ...any)) (string, error) {
	mod, err := checkoutKey()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	tagList := strings.Join(tags, ",")
	dir := filepath.Join(cacheDir, "variants", filepath.Base(pkg)+"-"+strings.ReplaceAll(tagList, ",", "-")+"-"+shortHash(mod))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"), logf)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	defer unlock()
	bin := filepath.Join(dir, filepath.Base(pkg))
	if err := runGo(ctx, pkg, "build", "-trimpath", "-tags", tagList, "-o", bin); err != nil {
		return "", err
	}
	return bin, nil
}
