package upstream

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

const (
	conntrackNP   = "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service"
	functioningNP = "[sig-network] Services should be able to create a functioning NodePort service [Conformance]"
	basicEndpoint = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
	restartProxy  = "[sig-network] Services should work after restarting kube-proxy [Disruptive]"
	restartAPI    = "[sig-network] Services should work after restarting apiserver [Disruptive]"
	threeNodes    = "[sig-network] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes"
	outsideFocus  = "[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]"
)

// junitCaseXML is one test case of a report: outcome passed, failed,
// skipped (by the test: why is its reason) or "" (left out by the
// filters); timeline is its system-err.
func junitCaseXML(name, outcome string, secs float64, why, timeline string) string {
	inner := ""
	switch outcome {
	case "failed":
		inner = fmt.Sprintf(`<failure type="failed">%s</failure>`, why)
	case "skipped":
		inner = fmt.Sprintf(`<skipped message="skipped - %s"></skipped>`, why)
	case "":
		outcome, inner = "skipped", `<skipped message="skipped"></skipped>`
	}
	if timeline != "" {
		inner += "<system-err>" + timeline + "</system-err>"
	}
	return fmt.Sprintf(`<testcase name="[It] %s" status="%s" time="%g">%s</testcase>`, name, outcome, secs, inner)
}

func writeReport(t *testing.T, dir string, cases ...string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	x := `<?xml version="1.0" encoding="UTF-8"?><testsuites><testsuite name="Kubernetes e2e suite">` +
		strings.Join(cases, "") + `</testsuite></testsuites>`
	if err := os.WriteFile(filepath.Join(dir, "junit_01.xml"), []byte(x), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCompare(t *testing.T) {
	tmp := t.TempDir()
	// ipvs-proxy: a part, and one test rerun alone after it failed there.
	part := writeReport(t, filepath.Join(tmp, "ipvs-part"),
		junitCaseXML(conntrackNP, "passed", 108.6, "", ""),
		junitCaseXML(functioningNP, "failed", 605.9, "[FAILED] no answer&#xA;In [It] at: service.go:1", ""),
		junitCaseXML(restartProxy, "passed", 962.4, "", ""),
		junitCaseXML(restartAPI, "", 0, "", ""),
		junitCaseXML(basicEndpoint, "", 0, "", ""),
		junitCaseXML(threeNodes, "", 0, "", ""),
		junitCaseXML(outsideFocus, "", 0, "", ""))
	alone := writeReport(t, filepath.Join(tmp, "ipvs-alone"),
		junitCaseXML(functioningNP, "passed", 97, "", ""),
		junitCaseXML(conntrackNP, "", 0, "", ""))
	// kube-proxy: one report, a file named as such; one test passed at its
	// second attempt, one the test skipped itself, the basic endpoint test
	// not reached.
	kp := filepath.Join(writeReport(t, filepath.Join(tmp, "kp"),
		junitCaseXML(conntrackNP, "passed", 50, "",
			"[FAILED] Failure recorded during attempt 1:&#xA;timed out&#xA;Attempt #1 Failed.  Retrying"),
		junitCaseXML(functioningNP, "passed", 40.04, "", ""),
		junitCaseXML(threeNodes, "skipped", 0.1, "Requires at least 3 nodes", ""),
		junitCaseXML(restartProxy, "", 0, "", ""),
		junitCaseXML(basicEndpoint, "", 0, "", "")), "junit_01.xml")

	var out strings.Builder
	err := Compare(&out, 2, []Column{
		{Label: "ipvs-proxy", Reports: []string{part, alone}},
		{Label: "kube-proxy (IPVS mode)", Reports: []string{kp}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `| test (5 on 2 node(s)) | ipvs-proxy | kube-proxy (IPVS mode) |
|---|---|---|
| Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service | passed 1m48.6s | passed 50s (after 1 failed attempt(s): timed out) |
| Services should be able to create a functioning NodePort service [Conformance] | failed 10m5.9s: [FAILED] no answer; then passed 1m37s | passed 40s |
| Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes | skip list: needs three or more schedulable nodes (skips itself below three) | skipped 100ms: Requires at least 3 nodes |
| Services should serve a basic endpoint from pods [Conformance] | not run | not run |
| Services should work after restarting kube-proxy [Disruptive] | passed 16m2.4s | skip list: [Disruptive] |
| **in all** | 3 passed, 1 not run, 1 skip list | 2 passed, 1 skipped, 1 not run, 1 skip list |
`
	if d := cmp.Diff(want, out.String()); d != "" {
		t.Errorf("table (-want +got):\n%s", d)
	}
}

func TestParseColumn(t *testing.T) {
	c, err := ParseColumn("kube-proxy run 2=a, b/junit_01.xml")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Column{Label: "kube-proxy run 2", Reports: []string{"a", "b/junit_01.xml"}}, c); d != "" {
		t.Error(d)
	}
	for _, bad := range []string{"ipvs-proxy", "ipvs-proxy=", "cilium=a", "=a"} {
		if _, err := ParseColumn(bad); err == nil {
			t.Errorf("ParseColumn(%q) took it", bad)
		}
	}
}

// A long failure message must not hide the outcomes after it: the last is
// the one the table counts.
func TestOutcomesClipEachReason(t *testing.T) {
	long := "error running kubectl exec pause-pod-0 -- curl é" + strings.Repeat("x", 400)
	got := outcomes([]Result{
		{Outcome: Failed, Duration: 605900 * time.Millisecond, Retries: 1, RetryWhy: long, Why: "[FAILED] " + long},
		{Outcome: Passed, Duration: 97 * time.Second},
	})
	if !strings.HasSuffix(got, "; then passed 1m37s") {
		t.Errorf("cell %q does not end with the rerun's pass", got)
	}
	if !strings.HasPrefix(got, "failed 10m5.9s (after 1 failed attempt(s): error running kubectl") {
		t.Errorf("cell %q lost the first outcome", got)
	}
	if n := strings.Count(got, "..."); n != 2 {
		t.Errorf("cell %q: %d clipped reasons, want 2", got, n)
	}
	if !utf8.ValidString(got) || len(got) > 2*reasonLen+100 {
		t.Errorf("cell of %d bytes, valid UTF-8 %v: %q", len(got), utf8.ValidString(got), got)
	}
	if c := clip("é", 4); c != "é" {
		t.Errorf("clip kept %q of a short string", c)
	}
	if c := clip("aé"+strings.Repeat("b", 10), 5); c != "a..." || !utf8.ValidString(c) {
		t.Errorf("clip = %q; want %q (the cut must not split é)", c, "a...")
	}
}
