package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
)

// The bed's persistent glue failure: how long iptables-restore fails, and
// the bound on the glue's repair after the mend (a retry of the failed
// glue sync backs off to the bed's --sync-period, 5 s; then the sync).
const (
	bedGlueOutage = 45 * time.Second
	bedGlueResync = 20 * time.Second
)

// restoreTools are the restore commands the agent may run (glue's
// backend choice: iptables-nft-restore, iptables-legacy-restore, or
// iptables-restore, for each family).
var restoreTools = []string{"iptables-restore", "iptables-nft-restore", "iptables-legacy-restore",
	"ip6tables-restore", "ip6tables-nft-restore", "ip6tables-legacy-restore"}

// breakRestoreScript moves each restore tool of /usr/sbin aside (to
// NAME.chaos) and puts a script that fails in its place; the VM's root is
// its initramfs, so nothing outlives the bed. mendRestoreBedScript puts
// them back.
var (
	breakRestoreScript = `set -e
for t in ` + strings.Join(restoreTools, " ") + `; do
	[ -e /usr/sbin/$t ] || [ -L /usr/sbin/$t ] || continue
	mv /usr/sbin/$t /usr/sbin/$t.chaos
	printf '#!/bin/sh\necho "$0: failing on purpose (TestChaosGlueRestoreFails)" >&2\nexit 1\n' >/usr/sbin/$t
	chmod 755 /usr/sbin/$t
done`
	mendRestoreBedScript = `for t in ` + strings.Join(restoreTools, " ") + `; do
	[ -e /usr/sbin/$t.chaos ] || [ -L /usr/sbin/$t.chaos ] || continue
	mv -f /usr/sbin/$t.chaos /usr/sbin/$t
done`
)

// TestChaosGlueRestoreFails is TestChaosNodes' nodes-glue-restore-fails
// (issue 45's case 3) on the bed, in make test's chaos slice: the case
// that found three of the agent's bugs (6b0155f, f468815, 91314fb: the
// failure cleared or never reported while iptables-restore still failed).
// iptables-restore fails in the VM for bedGlueOutage while the glue has
// drift to repair (strayRule in IPVSP-POSTROUTING). Meanwhile: no
// connection of the live Service fails, held ones included; a Service
// created in the fault is served through IPVS; the stray rule stays (no
// restore succeeds); ipvs_proxy_node_sync_failing{part="iptables glue"}
// is 1 and stays 1; a NodeSyncFailed Event on the Node names the glue;
// /healthz turns 503 naming it within healthLimit after the first
// report and stays 503; /livez stays 200 (a restart cannot mend
// iptables-restore). After the mend, within bedGlueResync: the glue's
// rules are those before the fault, the metric 0, /healthz 200 and a
// NodeSyncRecovered Event.
func TestChaosGlueRestoreFails(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	c.logGlueState(t)
	ns := c.namespace(t)
	live := c.liveService(t, ns)
	c.waitHealth(t, healthzURL, 200, time.Minute)
	want := c.glueLines(t)
	// Events of earlier tests (a Node's Events outlive them) are not this
	// fault's: the reports must be newer than these.
	failedBefore := c.nodeEvent(t, "NodeSyncFailed", "iptables glue", time.Time{})
	recoveredBefore := c.nodeEvent(t, "NodeSyncRecovered", "", time.Time{})
	lt := c.startLiveTraffic(t, live, 2)

	faulted := time.Now()
	mend := c.breakRestore(t)
	c.vmRun(t, append([]string{"iptables"}, strayRule...)...)
	seen := c.watchBedGlueFailure(t, ns, faulted, failedBefore)
	if err := mend(); err != nil {
		t.Fatal(err)
	}
	mended := time.Now()
	eventually(t, 2*bedGlueResync, func() error {
		if missing, extra := lineDiff(want, c.glueLines(t)); len(missing)+len(extra) > 0 {
			return fmt.Errorf("the glue's rules after the mend: missing %s; extra %s", sample(missing), sample(extra))
		}
		return nil
	})
	whole := time.Since(mended)
	if whole > bedGlueResync {
		t.Errorf("the glue's rules were whole %s after the mend; want within %s", whole.Round(time.Millisecond), bedGlueResync)
	}
	eventually(t, 2*bedGlueResync, func() error {
		code, body := c.httpGet(t, healthzURL)
		failing, reported := c.scrape(t)[glueFailingSeries]
		switch {
		case code != 200:
			return fmt.Errorf("/healthz %d %s after the mend", code, body)
		case reported && failing != 0:
			return fmt.Errorf("%s %v after the mend", glueFailingSeries, failing)
		case !newerEvent(c.nodeEvent(t, "NodeSyncRecovered", "", mended), recoveredBefore):
			return fmt.Errorf("no NodeSyncRecovered Event on Node %s since the mend", nodeName)
		}
		return nil
	})
	recovered := time.Since(mended)
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("%d of %d connections of the live Service failed through the glue's failure: %q", failed, attempted, errs)
	}
	t.Logf("iptables-restore failing for %s: metric after %s, Event after %s, /healthz 503 after %s; glue whole %s after the mend, healthy after %s; %d connections, %d failed",
		bedGlueOutage, seen.metric, seen.event, seen.healthz, whole.Round(time.Millisecond), recovered.Round(time.Millisecond), attempted, failed)
	peaks.record(t, chaos.Row{Case: "glue-restore-fails", TrafficAttempted: attempted, TrafficFailed: failed,
		ConvergeSeconds: seconds(whole), Notes: fmt.Sprintf("iptables-restore failing for %s; reported: metric after %s, Event after %s, /healthz 503 after %s, /livez 200 throughout; "+
			"a Service created in the fault served; glue rules whole %.1f s after the mend, healthy after %.1f s; %d held flows kept",
			bedGlueOutage, seen.metric, seen.event, seen.healthz, seconds(whole), seconds(recovered), len(lt.holds))})
}

// glueFailingSeries is the agent's metric of a failing glue.
const glueFailingSeries = `ipvs_proxy_node_sync_failing{part="iptables glue"}`

// breakRestore makes every restore tool of the VM fail
// (breakRestoreScript), checks that iptables-restore does while
// iptables-save works, and returns the mend (once; later calls return
// nil), also registered as a cleanup: the next test needs a whole glue.
func (c chaosEnv) breakRestore(t *testing.T) (mend func() error) {
	t.Helper()
	ctx := context.Background()
	mended := false
	mend = func() error {
		if mended {
			return nil
		}
		mended = true
		if out, err := c.VM.RunOK(ctx, "sh", "-c", mendRestoreBedScript); err != nil {
			return fmt.Errorf("mend iptables-restore: %w: %s", err, out)
		}
		return nil
	}
	t.Cleanup(func() {
		if err := mend(); err != nil {
			t.Error(err)
		}
	})
	if out, err := c.VM.RunOK(ctx, "sh", "-c", breakRestoreScript); err != nil {
		t.Fatalf("break iptables-restore: %v: %s", err, out)
	}
	if out, err := c.VM.RunOK(ctx, "iptables-restore", "--noflush"); err == nil || !strings.Contains(err.Error(), "failing on purpose") {
		t.Fatalf("iptables-restore after the break: %v: %q; want the failing script", err, out)
	}
	if out := c.iptablesSave(t, "iptables-save"); !strings.Contains(out, "IPVSP-") {
		t.Fatalf("iptables-save after the break has no IPVSP- chain:\n%s", out)
	}
	return mend
}

// bedGlueSeen is when each report of the glue's failure was first seen,
// from the fault's start.
type bedGlueSeen struct{ metric, event, healthz time.Duration }

// watchBedGlueFailure polls the agent every 2 s for bedGlueOutage and
// checks what TestChaosGlueRestoreFails says of the fault; halfway it
// creates a Service, which must be served through IPVS before the end.
func (c chaosEnv) watchBedGlueFailure(t *testing.T, ns string, began time.Time, failedBefore *corev1.Event) bedGlueSeen {
	t.Helper()
	var seen bedGlueSeen
	first := func(d *time.Duration, ok bool) {
		if ok && *d == 0 {
			*d = time.Since(began).Round(time.Second)
		}
	}
	var during *corev1.Service
	for time.Since(began) < bedGlueOutage {
		time.Sleep(2 * time.Second)
		if during == nil && time.Since(began) > bedGlueOutage/2 {
			during = c.createService(t, ns, "during", []corev1.ServicePort{tcpPort("http", 80)})
			c.setSlice(t, during, discoveryv1.AddressTypeIPv4, c.backends(t, 1))
		}
		if !slices.ContainsFunc(c.glueLines(t), func(l string) bool { return strings.Contains(l, "192.0.2.45") }) {
			t.Fatalf("the stray rule is gone %s into the fault: a restore succeeded, the fault did not hold", time.Since(began).Round(time.Second))
		}
		failing := c.scrape(t)[glueFailingSeries]
		if seen.metric != 0 && failing != 1 {
			t.Errorf("%s %v %s into the fault, after 1 from %s", glueFailingSeries, failing, time.Since(began).Round(time.Second), seen.metric)
		}
		first(&seen.metric, failing == 1)
		code, body := c.httpGet(t, healthzURL)
		if seen.healthz != 0 && code != 503 {
			t.Errorf("/healthz %d %s %s into the fault, after 503 from %s: the failure must stay reported until mended",
				code, body, time.Since(began).Round(time.Second), seen.healthz)
		}
		first(&seen.healthz, code == 503 && strings.Contains(body, "iptables glue"))
		if code, body := c.httpGet(t, livezURL); code != 200 {
			t.Errorf("/livez %d %s %s into the fault; want 200 (a restart cannot mend iptables-restore)", code, body, time.Since(began).Round(time.Second))
		}
		if seen.event == 0 {
			first(&seen.event, newerEvent(c.nodeEvent(t, "NodeSyncFailed", "iptables glue", began), failedBefore))
		}
	}
	for what, d := range map[string]time.Duration{glueFailingSeries + " 1": seen.metric,
		"a NodeSyncFailed Event naming the iptables glue": seen.event, "/healthz 503 naming the iptables glue": seen.healthz} {
		if d == 0 {
			t.Errorf("in %s of failing restores, no %s", bedGlueOutage, what)
		}
	}
	if seen.metric != 0 && seen.healthz > seen.metric+healthLimit+4*time.Second { // polled every 2 s
		t.Errorf("/healthz 503 %s after the metric; want within %s", seen.healthz-seen.metric, healthLimit)
	}
	// IPVS is not the glue's: the Service created in the fault is served.
	c.expectTable(t, []string{"TCP  " + hostPort(during.Spec.ClusterIP, 80) + " rr"}, nil)
	if res := c.hit(t, "tcp", hostPort(during.Spec.ClusterIP, 80), 3); len(res.Errors) > 0 {
		t.Errorf("a Service created while the glue failed: %d of 3 connections failed: %q", len(res.Errors), res.Errors)
	}
	return seen
}

// glueLines are the VM's ipvs-proxy lines of iptables-save (ownGlueLines).
func (c chaosEnv) glueLines(t *testing.T) []string {
	t.Helper()
	return ownGlueLines(c.iptablesSave(t, "iptables-save"))
}

// nodeEvent is nodeEventOf on the bed's Node.
func (c chaosEnv) nodeEvent(t *testing.T, reason, msg string, since time.Time) *corev1.Event {
	t.Helper()
	return nodeEventOf(context.Background(), t, c.Client, nodeName, reason, msg, since)
}

// newerEvent reports whether e is an Event that before was not: another
// one, or the same one seen again since (its count or last time moved).
func newerEvent(e, before *corev1.Event) bool {
	switch {
	case e == nil:
		return false
	case before == nil || e.UID != before.UID:
		return true
	}
	return e.Count != before.Count || !e.LastTimestamp.Equal(&before.LastTimestamp)
}
