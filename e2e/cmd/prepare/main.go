// Command prepare assembles the test bed's cached parts — the VM's kernel,
// QEMU and initramfs, and the control plane's binaries — in parallel, so
// that `make test` can build them while lint and unit tests run. Without a
// usable bed it reports why and exits 0, unless CI=true: the e2e tests then
// skip (or fail in CI) with the same reason.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

func main() {
	if failed := prepare(); failed && os.Getenv("CI") == "true" {
		os.Exit(1)
	}
}

// prepare assembles the parts and reports whether any of them failed.
func prepare() (failed bool) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "prepare: "+format+"\n", args...)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		dir, err := controlplane.EnsureBinaries(ctx, controlplane.CacheDir())
		if err == nil {
			logf("control plane binaries in %s (%v)", dir, time.Since(t0).Round(time.Second))
		}
		errs[0] = err
	}()
	go func() {
		defer wg.Done()
		t0 := time.Now()
		a, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
		if err == nil {
			logf("VM assets in %s (%v)", a.Dir, time.Since(t0).Round(time.Second))
		}
		errs[1] = err
	}()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			logf("%v", err)
			failed = true
		}
	}
	logf("done in %v", time.Since(start).Round(time.Second))
	return failed
}
