package vm

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// PowerLoss kills QEMU's whole process group at once (SIGKILL: no
// poweroff through the agent, which this fake has none of), keeps the
// console readable, removes the scratch directory, and a later Shutdown
// does nothing more.
func TestPowerLoss(t *testing.T) {
	tmp := t.TempDir()
	if err := os.WriteFile(filepath.Join(tmp, "console.log"), []byte("booted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A QEMU stand-in that ignores SIGTERM (a clean stop would be seen
	// as a power loss too) with a child in its group.
	cmd := exec.Command("sh", "-c", "trap '' TERM; sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	v := &VM{cmd: cmd, exited: exited, tmp: tmp, client: &http.Client{}, logf: t.Logf}
	go func() { v.waitErr = cmd.Wait(); close(exited) }()

	if err := v.PowerLoss(); err != nil {
		t.Fatalf("PowerLoss: %v", err)
	}
	dead, err := v.Exited()
	var ee *exec.ExitError
	if !dead || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("after PowerLoss: exited %v, %v; want killed by SIGKILL", dead, err)
	}
	if err := syscall.Kill(-cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("QEMU's process group still has processes (kill 0: %v)", err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("scratch directory left: %v", err)
	}
	if got := v.ConsoleLog(); got != "booted\n" {
		t.Errorf("console after PowerLoss = %q", got)
	}
	if err := v.Shutdown(); !errors.Is(err, errExitedBeforeShutdown) {
		t.Errorf("Shutdown after PowerLoss = %v; want the exit before it, again", err)
	}
}
