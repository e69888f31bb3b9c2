package netlinkutil

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernelTestsRequired is set (to 1) when the tests run inside the test VM,
// whose kernel has everything: there a missing feature is a failure.
const kernelTestsRequired = "IPVS_PROXY_KERNEL_TESTS"

// requireKernel skips, or fails inside the VM, when err says the kernel
// lacks a feature.
func requireKernel(t *testing.T, feature string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv(kernelTestsRequired) == "1" {
		t.Fatalf("%s: %v", feature, err)
	}
	t.Skipf("this kernel has no %s (%v); the test runs in the test VM: make e2e", feature, err)
}

// missingFeature reports whether err is the kernel saying "not supported".
func missingFeature(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) ||
		errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT)
}

// inFreshNetns runs the rest of the test in a new network namespace on a
// locked OS thread, and restores the original namespace afterwards.
func inFreshNetns(t *testing.T) {
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
