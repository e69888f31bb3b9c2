package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/upstream"
)

// coreReportDir receives the upstream core's JUnit report, e2e.log and
// summary.md (relative to the package: the repository's bin/).
const coreReportDir = "../bin/conformance/core"

// upstreamCoreSuite returns Kubernetes' e2e suite and the archives of the
// test images its core starts (both cached; `make bed` builds them).
func upstreamCoreSuite(ctx context.Context, t *testing.T) (upstream.Suite, map[string]string) {
	t.Helper()
	cache := controlplane.CacheDir()
	suite, err := upstream.EnsureSuite(ctx, cache)
	if err != nil {
		t.Fatalf("the upstream suite: %v", err)
	}
	all, err := upstream.EnsureTestImages(ctx, cache, suite, t.Logf)
	if err != nil {
		t.Fatalf("the upstream test images: %v", err)
	}
	images := map[string]string{}
	for _, name := range upstream.CoreImages {
		p, ok := all[name]
		if !ok {
			t.Fatalf("the upstream test images: no %s among %v", name, all)
		}
		images[name] = p
	}
	return suite, images
}

// runUpstreamCore runs the upstream core (upstream.NarrowToCore: the
// [Conformance] tests that drive the proxy through its hardest paths) on
// the fresh cluster, two at a time, a failed test given a second
// attempt as in `make conformance-ci`. Every test of the core must pass.
func runUpstreamCore(ctx context.Context, t *testing.T, c *cluster.Cluster, suite upstream.Suite) {
	t.Helper()
	p, err := upstream.NewPlan(true)
	if err == nil {
		err = p.ForNodes(len(c.Nodes))
	}
	if err == nil {
		err = p.ForProxy("ipvs-proxy")
	}
	if err == nil {
		err = p.NarrowToCore()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDNS(ctx); err != nil {
		t.Fatal(err)
	}
	ginkgo, err := upstream.EnsureGinkgo(ctx, controlplane.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	s, err := suite.Run(ctx, p, upstream.RunOptions{
		Kubeconfig: c.Kubeconfig, Proxy: "ipvs-proxy", OutDir: coreReportDir, Nodes: len(c.Nodes),
		Timeout: 20 * time.Minute, StartupTimeout: 2 * time.Minute,
		Procs: 2, Ginkgo: ginkgo, FlakeAttempts: 2, Logf: t.Logf,
	})
	t.Logf("TIMING upstream core: %s (%s); report in %s", time.Since(began).Round(time.Second), s.Line(), coreReportDir)
	if s.Proxy != "" {
		if path, err := upstream.Keep("conformance-core", s, len(c.Nodes), "the upstream core of make test"); err != nil {
			t.Errorf("keep the upstream core's figures: %v", err)
		} else {
			t.Logf("figures in %s", path)
		}
	}
	for _, r := range s.Rows {
		if r.Outcome == upstream.Failed || (r.Retries > 0 && r.Outcome == upstream.Passed) {
			t.Logf("%s %s: %s", r.Outcome, r.Name, firstNonEmpty(r.Why, r.RetryWhy))
		}
	}
	if err != nil {
		t.Fatalf("upstream core: %v", err)
	}
	if s.Passed != upstream.CoreSize() {
		t.Errorf("upstream core: %d passed; want all %d of the core", s.Passed, upstream.CoreSize())
	}
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return "(no reason given)"
}
