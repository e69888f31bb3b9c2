package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// kernelTestPackages have tests that need the VM's kernel (IPVS, dummy
// links). Their test binaries run inside the VM with
// IPVS_PROXY_KERNEL_TESTS=1, which turns a missing feature into a failure.
var kernelTestPackages = []string{"github.com/ipvs-proxy/ipvs-proxy/netlinkutil", "github.com/ipvs-proxy/ipvs-proxy/ipset",
	// the reconciler's diff on the kernel (TestOrderedTablesAgreeOnKernel)
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler",
	// the backend side of direct server return (TestTunnelEndsOnKernel)
	"github.com/ipvs-proxy/ipvs-proxy/proxier/tunnelend",
	// the bench's readers of IPVS and of kube-proxy's nftables table
	"github.com/ipvs-proxy/ipvs-proxy/e2e/guest/ipvsbench"}

// kernelTestsThatMustPass names, per package, a VM-only test whose pass
// shows that its kernel tests ran (they are skipped by name on the host).
var kernelTestsThatMustPass = map[string]string{"netlinkutil": "TestIPVSRealTraffic", "reconciler": "TestOrderedTablesAgreeOnKernel",
	"tunnelend": "TestTunnelEndsOnKernel"}

func TestKernelPackagesInVM(t *testing.T) {
	e := setup(t)
	for _, pkg := range kernelTestPackages {
		bin := "/usr/local/bin/" + filepath.Base(pkg) + ".test"
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			res, err := e.VM.Run(context.Background(), "env", "IPVS_PROXY_KERNEL_TESTS=1", bin, "-test.v", "-test.count=1")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s in the VM:\n%s%s", pkg, res.Stdout, res.Stderr)
			if res.ExitCode != 0 {
				t.Fatalf("%s failed in the VM (exit %d)", pkg, res.ExitCode)
			}
			if strings.Contains(res.Stdout, "--- SKIP") {
				t.Errorf("%s skipped tests in the VM, where every kernel feature is present", pkg)
			}
			if must, ok := kernelTestsThatMustPass[filepath.Base(pkg)]; ok && !strings.Contains(res.Stdout, "--- PASS: "+must) {
				t.Errorf("%s did not pass in the VM", must)
			}
		})
	}
}

// TestVMReachesAPIServer lists Services from inside the VM through the
// forward to the host's apiserver.
func TestVMReachesAPIServer(t *testing.T) {
	e := setup(t)
	out, err := e.VM.RunOK(context.Background(), "/usr/local/bin/vmkube", guestKubecfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "default/kubernetes 10.96.0.1") {
		t.Errorf("the VM listed:\n%s\nwant default/kubernetes 10.96.0.1", out)
	}
}
