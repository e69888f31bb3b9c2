// Package nltest helps kernel tests: it runs a test in a fresh network
// namespace and decides whether a missing kernel feature skips the test (on
// a development machine) or fails it (in the test VM, where every feature
// is present).
package nltest

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// RequiredEnv is set to 1 where the kernel must have every feature (the test
// VM): a missing feature then fails the test instead of skipping it.
const RequiredEnv = "IPVS_PROXY_KERNEL_TESTS"

// Require skips, or fails where RequiredEnv=1, when err says that the kernel
// lacks feature.
func Require(t testing.TB, feature string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("%s: %v", feature, err)
	}
	t.Skipf("this kernel has no %s (%v); the test runs in the test VM: make e2e", feature, err)
}

// InFreshNetns runs the rest of the test in a new network namespace, on a
// locked OS thread, and restores the original namespace when it ends. It
// skips without root.
func InFreshNetns(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get current netns: %v", err)
	}
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("restore netns: %v", err)
		}
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
}
