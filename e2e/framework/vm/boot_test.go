package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hungQEMU is an Assets whose QEMU is a script that records each start in
// a file and then sleeps, as a guest that hangs while booting looks from
// the host: QEMU runs and the agent never answers.
func hungQEMU(t *testing.T) (*Assets, func() int) {
	t.Helper()
	t.Setenv("IPVS_PROXY_VM_ACCEL", "tcg") // no KVM probe with the fake
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts")
	script := filepath.Join(dir, "qemu")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho start >> "+starts+"\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	initramfs := filepath.Join(dir, "base.cpio")
	if err := os.WriteFile(initramfs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Dir's parent is the real cache, where the agent is built once per
	// process for every VM, these included.
	a := &Assets{Dir: filepath.Join(CacheDir(), "hung-qemu-test"), QEMU: script, Kernel: filepath.Join(dir, "vmlinux"), Initramfs: initramfs}
	count := func() int {
		b, _ := os.ReadFile(starts)
		return strings.Count(string(b), "start")
	}
	return a, count
}

// A guest that hangs while booting is booted again by a new QEMU, up to
// three attempts, and the error then says it hung.
func TestStartRetriesHungBoot(t *testing.T) {
	a, starts := hungQEMU(t)
	began := time.Now()
	v, err := Start(context.Background(), Options{Assets: a, BootTimeout: time.Second})
	if err == nil {
		if err := v.Shutdown(); err != nil {
			t.Logf("Shutdown: %v", err)
		}
		t.Fatal("Start with a QEMU that never boots: no error")
	}
	if !errors.Is(err, errBootHung) {
		t.Errorf("Start: %v; want errBootHung", err)
	}
	if n := starts(); n != 3 {
		t.Errorf("QEMU started %d times; want 3 (two boots again)", n)
	}
	t.Logf("three hung boots of 1 s given up after %v: %v", time.Since(began).Round(100*time.Millisecond), err)
}

// When the caller's context ends during the boot, Start returns at once:
// no new QEMU for a caller that gave up.
func TestStartNoRetryWhenCallerGaveUp(t *testing.T) {
	a, starts := hungQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := Start(ctx, Options{Assets: a, BootTimeout: time.Minute})
	if err == nil {
		if err := v.Shutdown(); err != nil {
			t.Logf("Shutdown: %v", err)
		}
		t.Fatal("Start with a QEMU that never boots: no error")
	}
	if errors.Is(err, errBootHung) {
		t.Errorf("Start: %v; want the caller's deadline, not errBootHung", err)
	}
	if n := starts(); n != 1 {
		t.Errorf("QEMU started %d times; want 1 (Start: %v)", n, err)
	}
}
