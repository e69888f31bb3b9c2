package ipset

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// kernelTestsRequired is set (to 1) when tests run where the kernel must
// have every feature (the test VM): a missing one is then a failure.
const kernelTestsRequired = "IPVS_PROXY_KERNEL_TESTS"

// newKernel runs the rest of the test in a fresh network namespace (on a
// locked OS thread, restored afterwards) and opens a Kernel there. It skips
// without root or without ip_set, unless IPVS_PROXY_KERNEL_TESTS=1.
func newKernel(t *testing.T, opts ...Option) *Kernel {
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
	k, err := NewKernel(opts...)
	if err != nil {
		if os.Getenv(kernelTestsRequired) == "1" {
			t.Fatal(err)
		}
		t.Skipf("this kernel has no ip_set: %v", err)
	}
	t.Cleanup(k.Close)
	return k
}
