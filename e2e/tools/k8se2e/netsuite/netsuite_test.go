// Package netsuite is the bed's e2e.test: Kubernetes' own end-to-end
// framework with the network tests only (k8s.io/kubernetes/test/e2e/network,
// imported as it is), which hold every test of the bed's focus (Services,
// EndpointSlice, the granular Service checks, Conntrack, KubeProxy). The
// whole suite (test/e2e) also compiles the storage, apps, DRA, autoscaling
// and node tests, none of which the bed runs: about a third more packages
// to build on a fresh machine. Test names and the flags the bed passes
// are the whole suite's; --list-conformance-tests and --logcheck-* are
// not registered, and --repo-root is no file source (the network tests
// read no repository files).
package netsuite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	manifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	"k8s.io/kubernetes/test/fixtures"

	// The tests, the feature names they use, and the framework's hooks
	// as the whole suite sets them up.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "print the Kubernetes version and exit")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if args := flag.Args(); len(args) > 0 {
		fmt.Fprintf(os.Stderr, "netsuite: unexpected arguments %q\n", args)
		os.Exit(2)
	}
	// Manifests and fixtures the tests read, from the files embedded in
	// their packages.
	testfiles.AddFileSource(manifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(fixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the selected tests under Ginkgo, with the framework's
// reporters (JUnit into --report-dir).
func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }
