// Package upstream provides Kubernetes' own end-to-end suite to the test
// bed: e2e.test, the kubectl it runs and the agnhost command, built from
// the wrapper module e2e/tools/k8se2e at the bed's Kubernetes version and cached
// like the control plane's binaries; and the test images those tests
// start, assembled as OCI archives under the exact names the suite uses.
package upstream

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
)

// The wrapper module and the binaries built from it.
const (
	module     = "e2e/tools/k8se2e"
	BinE2ETest = "e2e.test"
	BinKubectl = "kubectl"
	BinAgnhost = "agnhost"
	// BinRegressionIssue74839 is the boom-server of the Conntrack tests'
	// regression-issue-74839 image.
	BinRegressionIssue74839 = "regression-issue-74839"
)

var suitePackages = []controlplane.WrapperPackage{
	// The network tests alone under upstream's framework (e2e/tools/k8se2e/netsuite):
	// every test of the focus, a third fewer packages to build than test/e2e.
	{Path: "github.com/ipvs-proxy/ipvs-proxy/e2e/tools/k8se2e/netsuite", Binary: BinE2ETest},
	{Path: "k8s.io/kubernetes/cmd/kubectl", Binary: BinKubectl},
	{Path: "k8s.io/kubernetes/test/images/agnhost", Binary: BinAgnhost},
}

// imagePackages are the commands of the test images other than agnhost.
// They are built apart from the suite, so that a new one leaves the
// suite's cache key, and e2e.test's long build, alone.
var imagePackages = []controlplane.WrapperPackage{
	{Path: "k8s.io/kubernetes/test/images/regression-issue-74839", Binary: BinRegressionIssue74839},
}

// Suite is a directory of the suite's binaries.
type Suite struct{ Dir string }

// E2ETest is the path of the suite's e2e.test binary.
func (s Suite) E2ETest() string { return filepath.Join(s.Dir, BinE2ETest) }

// Kubectl is the path of the suite's kubectl binary.
func (s Suite) Kubectl() string { return filepath.Join(s.Dir, BinKubectl) }

// Agnhost is the path of the suite's agnhost binary.
func (s Suite) Agnhost() string { return filepath.Join(s.Dir, BinAgnhost) }

// EnsureGinkgo builds Ginkgo's command-line runner, at the version the
// suite is built with, from the wrapper module e2e/tools/ginkgo into a directory
// of cacheDir keyed by its build list, unless it is there, and returns
// its path.
func EnsureGinkgo(ctx context.Context, cacheDir string) (string, error) {
	dir, err := controlplane.EnsureModuleBinaries(ctx, cacheDir, "e2e/tools/ginkgo", "ginkgo",
		[]controlplane.WrapperPackage{{Path: "github.com/onsi/ginkgo/v2/ginkgo", Binary: "ginkgo"}})
	if err != nil {
		return "", fmt.Errorf("build Ginkgo's runner: %w", err)
	}
	return filepath.Join(dir, "ginkgo"), nil
}

// EnsureSuite builds e2e.test (`go test -c` of e2e/tools/k8se2e/netsuite: the
// network tests of test/e2e), kubectl and
// agnhost into a directory of cacheDir keyed by e2e/tools/k8se2e's build list
// (static, -trimpath, version-stamped), unless it is there. A cold build
// compiles most of Kubernetes: many minutes and a few GB of memory.
func EnsureSuite(ctx context.Context, cacheDir string) (Suite, error) {
	dir, err := controlplane.EnsureWrapperBinaries(ctx, cacheDir, module, suitePackages)
	return Suite{Dir: dir}, err
}

// EnsureImageBinaries builds the commands of the test images other than
// agnhost (the boom-server of regression-issue-74839) from e2e/tools/k8se2e,
// as EnsureSuite builds agnhost, into a directory of cacheDir of their
// own, unless they are there, and returns it.
func EnsureImageBinaries(ctx context.Context, cacheDir string) (string, error) {
	dir, err := controlplane.EnsureWrapperBinaries(ctx, cacheDir, module, imagePackages)
	if err != nil {
		return "", fmt.Errorf("build the test images' binaries: %w", err)
	}
	return dir, nil
}
