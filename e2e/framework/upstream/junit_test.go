package upstream

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const testSkips = `# a comment
## needs a cloud provider's LoadBalancer: the long reason
[Slow] [LinuxOnly]
LoadBalancer service

## needs at least two schedulable nodes
Services should serve a basic endpoint from pods
`

func TestReadJUnit(t *testing.T) {
	res, err := readJUnitFile("testdata/junit_sample.xml")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 9 {
		t.Fatalf("%d results, want 9", len(res))
	}
	want := map[string]Result{
		"[SynchronizedBeforeSuite]": {Outcome: Passed, Duration: 2500 * time.Millisecond},
		"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service": {
			Outcome: Skipped, Why: "Test requires >= 2 Ready nodes, but there are only 1 nodes", Duration: 1250 * time.Millisecond},
		"[sig-network] Services should be able to create a functioning NodePort service [Conformance]": {
			Outcome: Failed, Why: "[FAILED] service is not reachable within 2m0s timeout on endpoint nodeport-test:80 over TCP protocol",
			Duration: 80200 * time.Millisecond},
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]": {Outcome: Skipped, NotRun: true},
		"[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]": {
			Outcome: Passed, Duration: 3400 * time.Millisecond},
	}
	for _, r := range res {
		w, ok := want[r.Name]
		if !ok {
			continue
		}
		w.Name = r.Name
		if r != w {
			t.Errorf("got  %+v\nwant %+v", r, w)
		}
		delete(want, r.Name)
	}
	for n := range want {
		t.Errorf("no result for %q", n)
	}
}

func TestReadJUnitRejectsGarbage(t *testing.T) {
	if _, err := readJUnit(strings.NewReader("<testsuites><testsuite>")); err == nil {
		t.Error("a truncated report parsed")
	}
}

func TestSummary(t *testing.T) {
	res, err := readJUnitFile("testdata/junit_sample.xml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlanFrom(testSkips, false)
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(res, nil, p, "ipvs-proxy", 95*time.Second+600*time.Millisecond)
	var names []string
	for _, r := range s.Rows {
		names = append(names, r.Name+" = "+string(r.Outcome)+" ("+r.Why+")")
	}
	got := strings.Join(names, "\n")
	want := strings.Join([]string{
		"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service = skipped (Test requires >= 2 Ready nodes, but there are only 1 nodes)",
		"[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance] = passed ()",
		"[sig-network] Services should be able to create a functioning NodePort service [Conformance] = failed ([FAILED] service is not reachable within 2m0s timeout on endpoint nodeport-test:80 over TCP protocol)",
		"[sig-network] Services should have session affinity work for LoadBalancer service with ESIPP on [Slow] [LinuxOnly] = skipped (skip list: needs a cloud provider's LoadBalancer)",
		"[sig-network] Services should provide secure master service [Conformance] = passed ()",
		"[sig-network] Services should serve a basic endpoint from pods [Conformance] = skipped (skip list: needs at least two schedulable nodes)",
	}, "\n")
	if got != want {
		t.Errorf("rows:\n%s\nwant:\n%s", got, want)
	}
	if s.Passed != 2 || s.Failed != 1 || s.Skipped != 3 {
		t.Errorf("counts %d/%d/%d, want 2 passed, 1 failed, 3 skipped", s.Passed, s.Failed, s.Skipped)
	}

	var b strings.Builder
	if err := s.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, w := range []string{
		"# Kubernetes e2e (Services focus) with ipvs-proxy\n",
		"Wall time: 1m36s. Passed: 2, failed: 1, skipped: 3.\n",
		"| Test | Result | Time | Note |\n| --- | --- | ---: | --- |\n",
		"| [sig-network] Services should be able to create a functioning NodePort service [Conformance] | failed | 1m20.2s | [FAILED] service is not reachable",
		"| [sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance] | passed | 3.4s |  |\n",
		"\n2 passed, 1 failed, 3 skipped\n",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("summary lacks %q:\n%s", w, md)
		}
	}
	if n := strings.Count(md, "\n| [sig-network]"); n != 6 {
		t.Errorf("%d table rows, want 6:\n%s", n, md)
	}
}

func TestSummaryConformanceOnly(t *testing.T) {
	res, err := readJUnitFile("testdata/junit_sample.xml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlanFrom(testSkips, true)
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(res, nil, p, "kube-proxy", time.Minute)
	for _, r := range s.Rows {
		if r.NotRun && p.SkipGroupOf(r.Name) == nil && !IsConformance(r.Name) {
			t.Errorf("a test left out by --conformance-only is in the table: %s", r.Name)
		}
	}
	// The runtime skip (Conntrack) ran, so it stays; the filtered ones
	// of the skip list keep their reason.
	if s.Passed != 2 || s.Failed != 1 || s.Skipped != 3 {
		t.Errorf("counts %d/%d/%d, want 2/1/3", s.Passed, s.Failed, s.Skipped)
	}
}

func TestFailedSuiteNodeIsReported(t *testing.T) {
	const report = `<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" status="failed" time="30"><failure type="failed">[FAILED] there are no schedulable nodes&#xA;more</failure></testcase>
</testsuite></testsuites>`
	res, err := readJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlanFrom(testSkips, false)
	if err != nil {
		t.Fatal(err)
	}
	// The report lacks the tests when the suite failed before them.
	all := []string{
		"[sig-network] Services should provide secure master service [Conformance]",
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]",
	}
	s := summarize(res, all, p, "ipvs-proxy", time.Minute)
	if s.Failed != 1 || s.NotRun != 1 || s.Skipped != 1 || len(s.Rows) != 3 ||
		s.Rows[0].Why != "[FAILED] there are no schedulable nodes" ||
		s.Rows[1].Outcome != NotRun || s.Rows[1].Name != all[0] ||
		s.Rows[2].Outcome != Skipped || s.Rows[2].Why != "skip list: needs at least two schedulable nodes" {
		t.Errorf("summary %+v", s)
	}
	var b strings.Builder
	if err := s.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Passed: 0, failed: 1, skipped: 1, not run: 1.") {
		t.Errorf("summary:\n%s", b.String())
	}
}

func TestParseSkips(t *testing.T) {
	if _, err := parseSkips("orphan line\n"); err == nil {
		t.Error("a test outside a group was accepted")
	}
	if _, err := parseSkips("## empty group\n## another\nx\n"); err == nil {
		t.Error("an empty group was accepted")
	}
	p, err := NewPlan(false)
	if err != nil {
		t.Fatalf("the checked-in skip list: %v", err)
	}
	if len(p.Groups) == 0 {
		t.Fatal("the checked-in skip list has no group")
	}
}

func TestParseTestList(t *testing.T) {
	out := "k8s.io/kubernetes@v1.36.3/test/e2e/network/service.go:733: [sig-network] Services should serve a basic endpoint from pods [Conformance]\n" +
		"\n  k8s.io/kubernetes@v1.36.3/test/e2e/network/networking.go:147: [sig-network] Networking Granular Checks: Services should function for pod-Service: http\n"
	got := strings.Join(parseTestList(out), "\n")
	want := "[sig-network] Services should serve a basic endpoint from pods [Conformance]\n" +
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: http"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestNarrow(t *testing.T) {
	p, err := newPlanFrom(testSkips, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Narrow(`secure master`); err != nil {
		t.Fatal(err)
	}
	if !p.InFocus("[sig-network] Services should provide secure master service [Conformance]") ||
		p.InFocus("[sig-network] Services should serve a basic endpoint from pods [Conformance]") ||
		p.InFocus("[sig-apps] Deployment should provide secure master service") {
		t.Error("Narrow does not keep exactly the focus's tests it matches")
	}
	if got := strings.Join(p.ginkgoArgs(), " "); !strings.Contains(got, "--ginkgo.focus=secure master ") {
		t.Errorf("ginkgo arguments %q", got)
	}
	if err := p.Narrow(`(`); err == nil {
		t.Error("a bad expression was accepted")
	}
}

// testdata/junit_flaky.xml is Ginkgo v2.28.1's report of a two-test suite
// run with --flake-attempts=2 whose first test failed its first attempt.
func TestFlakedTestIsNamed(t *testing.T) {
	res, err := readJUnitFile("testdata/junit_flaky.xml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlanFrom(testSkips, false)
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(res, nil, p, "ipvs-proxy", time.Minute)
	if s.Passed != 2 || s.Failed != 0 || s.Flaked != 1 {
		t.Fatalf("passed %d, failed %d, flaked %d; want 2, 0, 1: %+v", s.Passed, s.Failed, s.Flaked, s.Rows)
	}
	const flaky = "[sig-network] Services should pass on the second attempt [Conformance]"
	want := []Result{
		{Name: "[sig-network] Services should pass at once [Conformance]", Outcome: Passed},
		{Name: flaky, Outcome: Passed, Retries: 1, RetryWhy: "service is not reachable within 2m0s timeout"},
	}
	if diff := cmp.Diff(want, s.Rows, cmpopts.IgnoreFields(Result{}, "Duration")); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	var b strings.Builder
	if err := s.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"Passed: 2, failed: 0, skipped: 0, passed after a failed attempt: 1.\n",
		"| " + flaky + " | passed | 0s | 1 failed attempt(s) first; attempt 1: service is not reachable within 2m0s timeout |\n",
		"\n2 passed, 0 failed, 0 skipped; 1 passed after a failed attempt: " + flaky + "\n",
	} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, b.String())
		}
	}
}

// TestPlanForNodes: a "[below N nodes]" group skips its tests on fewer
// than N nodes only; other groups skip on any cluster.
func TestPlanForNodes(t *testing.T) {
	const skips = `## [below 2 nodes] needs two nodes: client and backend apart
Services should preserve source pod IP
## [below 3 nodes] needs three nodes
HealthCheckNodePort correctly when ExternalTrafficPolicy changes
## [Disruptive]: restarts the proxy's pod
[Disruptive]
`
	names := []string{
		"[sig-network] Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
		"[sig-network] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes",
		"[sig-network] Services should work after restarting apiserver [Disruptive]",
	}
	for _, tc := range []struct {
		nodes int
		want  []bool // skipped, per name
	}{{1, []bool{true, true, true}}, {2, []bool{false, true, true}}, {3, []bool{false, false, true}}} {
		p, err := newPlanFrom(skips, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.ForNodes(tc.nodes); err != nil {
			t.Fatal(err)
		}
		for i, name := range names {
			if got := p.skipRE.MatchString(name); got != tc.want[i] {
				t.Errorf("%d nodes: %q skipped = %v, want %v", tc.nodes, name, got, tc.want[i])
			}
		}
		if g := p.SkipGroupOf(names[2]); g == nil || g.Reason != "[Disruptive]: restarts the proxy's pod" {
			t.Errorf("%d nodes: group of the [Disruptive] test: %+v", tc.nodes, g)
		}
	}
	if _, err := newPlanFrom("## [below one nodes] x\nname\n", false); err == nil {
		t.Error("a malformed [below N nodes] was accepted")
	}
}

// TestPlanForProxy: a "[with PROXY]" group skips its tests only in runs
// with that proxy; it can be combined with "[below N nodes]".
func TestPlanForProxy(t *testing.T) {
	const skips = `## [with kube-proxy] [Disruptive]: kube-proxy is no pod here
Services should work after restarting kube-proxy [Disruptive]
## [below 2 nodes] [with kube-proxy] both
Services should preserve source pod IP
## [Disruptive]: the apiserver is no pod here
Services should work after restarting apiserver [Disruptive]
`
	names := []string{
		"[sig-network] Services should work after restarting kube-proxy [Disruptive]",
		"[sig-network] Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
		"[sig-network] Services should work after restarting apiserver [Disruptive]",
	}
	for _, tc := range []struct {
		proxy string
		nodes int
		want  []bool // skipped, per name
	}{
		{"ipvs-proxy", 1, []bool{false, false, true}},
		{"kube-proxy", 1, []bool{true, true, true}},
		{"kube-proxy", 2, []bool{true, false, true}},
	} {
		p, err := newPlanFrom(skips, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.ForProxy(tc.proxy); err != nil {
			t.Fatal(err)
		}
		if err := p.ForNodes(tc.nodes); err != nil {
			t.Fatal(err)
		}
		for i, name := range names {
			if got := p.skipRE.MatchString(name); got != tc.want[i] {
				t.Errorf("%s, %d nodes: %q skipped = %v, want %v", tc.proxy, tc.nodes, name, got, tc.want[i])
			}
		}
		if g := p.SkipGroupOf(names[0]); tc.proxy == "kube-proxy" && (g == nil || g.Reason != "[Disruptive]: kube-proxy is no pod here" || g.Proxy != "kube-proxy") {
			t.Errorf("%s: group of the kube-proxy restart: %+v", tc.proxy, g)
		}
	}
	for _, bad := range []string{"## [with ] x\nname\n", "## [with kube proxy] x\nname\n", "## [with kube-proxy]x\nname\n",
		"## [with a] [with b] x\nname\n", "## [below 2 nodes] [below 3 nodes] x\nname\n"} {
		if _, err := newPlanFrom(bad, false); err == nil {
			t.Errorf("a malformed [with PROXY] was accepted: %q", bad)
		}
	}
}

// TestPart deals the tests the plan runs into parts: every one in exactly
// one part, a test whose name holds another's in the same part, skipped
// and out-of-focus tests in none.
func TestPart(t *testing.T) {
	names := []string{
		"[sig-network] Services should provide secure master service [Conformance]",
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]", // skipped
		"[sig-network] Services should be able to up and down services",
		"[sig-network] Services should work after the service has been recreated",
		"[sig-network] Services should be able to up and down services again", // holds the one above
		"[sig-network] Conntrack should drop INVALID conntrack entries",
		"[sig-apps] Deployment should provide secure master service", // out of focus
	}
	seen := map[string]int{}
	for k := 1; k <= 2; k++ {
		p, err := newPlanFrom(testSkips, false)
		if err != nil {
			t.Fatal(err)
		}
		part, err := p.Part(names, k, 2)
		if err != nil {
			t.Fatalf("part %d: %v", k, err)
		}
		for _, n := range part {
			seen[n]++
			if !p.InFocus(n) {
				t.Errorf("part %d: %q not in its narrowed focus", k, n)
			}
		}
		up, again := slices.Contains(part, names[2]), slices.Contains(part, names[4])
		if up != again {
			t.Errorf("part %d: %q and %q, one holding the other, were dealt apart", k, names[2], names[4])
		}
	}
	for _, n := range []string{names[0], names[2], names[3], names[4], names[5]} {
		if seen[n] != 1 {
			t.Errorf("%q in %d parts, want 1", n, seen[n])
		}
	}
	if seen[names[1]]+seen[names[6]] != 0 {
		t.Errorf("a skipped or out-of-focus test was dealt: %v", seen)
	}
	p, _ := newPlanFrom(testSkips, false)
	if _, err := p.Part(names, 3, 2); err == nil {
		t.Error("part 3 of 2 was accepted")
	}
}
