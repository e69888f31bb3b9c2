package sysctls

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSysctlRoot(t *testing.T) {
	host := filepath.Join(t.TempDir(), "host", "proc", "sys")
	if got := sysctlRootIn(host); got != "/proc/sys" {
		t.Errorf("without the mount: %q, want /proc/sys", got)
	}
	if err := os.MkdirAll(filepath.Join(host, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := sysctlRootIn(host); got != host {
		t.Errorf("with the mount: %q, want %q", got, host)
	}
}
