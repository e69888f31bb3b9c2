package vm

import (
	"context"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

var required struct {
	once   sync.Once
	assets *Assets
	err    error
}

// Require returns the VM assets for a test, assembling them on first use
// (in CacheDir()). When they cannot be had (no apt-get, no Debian mirror,
// not linux/amd64), the test is skipped with the reason, unless the
// environment has CI=true: then it fails, so that CI never passes by
// skipping. Tests are skipped in -short mode.
func Require(t testing.TB) *Assets {
	t.Helper()
	if testing.Short() {
		t.Skip("vm: VM tests are skipped in -short mode")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		skipOrFail(t, "vm: the VM test bed needs linux/amd64, this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	required.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		required.assets, required.err = EnsureAssets(ctx, CacheDir(), t.Logf)
	})
	if required.err != nil {
		skipOrFail(t, "vm: cannot assemble the VM test bed: %v", required.err)
	}
	return required.assets
}

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (skipped; with CI=true this fails)", args...)
}

// Boot starts a VM for a test (Require supplies opts.Assets when nil, and
// opts.Log defaults to t.Logf) and shuts it down when the test ends,
// logging the guest's console if the test failed.
func Boot(t testing.TB, opts Options) *VM {
	t.Helper()
	if opts.Assets == nil {
		opts.Assets = Require(t)
	}
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	t.Cleanup(func() {
		if err := v.Shutdown(); err != nil {
			t.Errorf("vm: shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("vm: guest console:\n%s", tail(v.ConsoleLog(), 20000))
		}
	})
	return v
}
