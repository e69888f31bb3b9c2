package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/debian"
)

// The kernel the VM boots is the one Debian's linux-image-amd64 names;
// the packages themselves are handled by deploy/debian.

// runCmd runs a command and returns its stdout; the error carries the tail
// of its stderr.
func runCmd(ctx context.Context, dir string, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	return stdout.String(), nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// kernelABI resolves the kernel ABI ("6.1.0-48-amd64") behind the
// linux-image-amd64 metapackage from the local package lists. The answer is
// remembered in cacheDir for as long as the lists are unchanged, since
// apt-cache takes most of a second to read them.
func kernelABI(ctx context.Context, cacheDir string) (string, error) {
	memo := ""
	if state := debian.ListsState(); state != "" {
		memo = filepath.Join(cacheDir, "kernel-abi-"+shortHash(state))
		if b, err := os.ReadFile(memo); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return string(bytes.TrimSpace(b)), nil
		}
	}
	out, err := runCmd(ctx, "", "apt-cache", "depends", "linux-image-amd64")
	if err != nil {
		return "", err
	}
	abi, err := parseKernelABI(out)
	if err == nil && memo != "" {
		// Old memos are tiny; drop them anyway.
		old, _ := filepath.Glob(filepath.Join(cacheDir, "kernel-abi-*"))
		for _, o := range old {
			os.Remove(o)
		}
		_ = os.WriteFile(memo, []byte(abi+"\n"), 0o644)
	}
	return abi, err
}

func parseKernelABI(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: linux-image-")
		if ok && dep != "" && dep[0] >= '0' && dep[0] <= '9' {
			return strings.Fields(dep)[0], nil
		}
	}
	return "", fmt.Errorf("no linux-image-<ABI> dependency in `apt-cache depends linux-image-amd64`: %q", tail(out, 500))
}
