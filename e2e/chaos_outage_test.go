package e2e

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// chaosOutage is how long TestChaosAPIServerLongOutage keeps the agent
// from the apiserver: $CHAOS_OUTAGE (a Go duration), else 5 minutes
// (issue 45, case 2).
func chaosOutage(t *testing.T) time.Duration {
	t.Helper()
	return envDuration(t, "CHAOS_OUTAGE", 5*time.Minute, 2*time.Minute)
}

// blackhole drops every packet between the agent and the apiserver in the
// VM, both ways (a host or a path that is gone: nothing tells the agent,
// its connections hang), until the returned func is called, or the test
// ends.
func (c chaosEnv) blackhole(t *testing.T) (reconnect func()) {
	t.Helper()
	host, port, _ := strings.Cut(vm.APIServerGuestAddr, ":")
	return c.withRules(t,
		[]string{"OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-j", "DROP"},
		[]string{"INPUT", "-p", "tcp", "-s", host, "--sport", port, "-j", "DROP"})
}

// netlinkWrites is the agent's count of netlink writes and of syncs since
// it started (ipvs_proxy_sync_netlink_writes' sum and count).
func (c chaosEnv) netlinkWrites(t *testing.T) (writes, syncs float64) {
	t.Helper()
	m := c.scrape(t)
	return m["ipvs_proxy_sync_netlink_writes_sum"], m["ipvs_proxy_sync_netlink_writes_count"]
}

// outageKind is how the agent loses the apiserver in a long outage.
type outageKind struct {
	name string
	// cut starts the outage; the returned func ends it.
	cut func(c chaosEnv, t *testing.T) (reconnect func())
	// stopAPIServer: the apiserver itself stops at the outage's start and
	// starts again (the agent still cut off) before the changes.
	stopAPIServer bool
	what          string
}

var outageKinds = []outageKind{
	{name: "refused", cut: chaosEnv.cutOff, stopAPIServer: true,
		what: "the apiserver stopped, then started with the agent's connections still refused in the VM"},
	{name: "blackhole", cut: chaosEnv.blackhole,
		what: "every packet between the agent and a live apiserver dropped in the VM, both ways"},
}

// TestChaosAPIServerLongOutage is issue 45's case 2 on the one-node bed:
// the agent loses the apiserver for CHAOS_OUTAGE (5 minutes), with
// CHAOS_SIZE Services and live traffic, in two ways (outageKinds). During
// the outage the agent writes nothing (its netlink write counter) and the
// kernel does not change; a minute before its end 5 Services are created,
// 5 changed and 5 deleted. After its end they reach the kernel within
// duringLimit (the figure of the case: the change latency after the
// return), changes made then reach it too, and no connection fails, held
// ones included. `make chaos-outage` runs it (10 minutes of outages); no
// other target does.
func TestChaosAPIServerLongOutage(t *testing.T) {
	for _, k := range outageKinds {
		t.Run(k.name, func(t *testing.T) { longOutage(t, k) })
	}
}

func longOutage(t *testing.T, k outageKind) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	n := chaosSize(t)
	if n < 30 {
		t.Fatalf("CHAOS_SIZE=%d: this case changes 30 of its Services", n)
	}
	outage := chaosOutage(t)
	ns, live, bulk := c.scaled(t, n)
	c.waitHealth(t, healthzURL, 200, time.Minute)
	lt := c.startLiveTraffic(t, live, 2)
	before := c.kernelState(t)
	exp := c.expected(t, ns)
	writes0, syncs0 := c.netlinkWrites(t)
	mark := c.logMark()
	down := false
	c.apiserverBack(t, &down)

	start := time.Now()
	reconnect := k.cut(c, t)
	if k.stopAPIServer {
		down = true
		c.CP.StopAPIServer()
	}
	// The kernel and /livez once a minute; the apiserver back (if stopped)
	// and the changes made a minute before the outage ends.
	changed := false
	checks := 0
	for time.Since(start) < outage {
		if code, b := c.healthOf(t, livezURL); code != 200 {
			t.Errorf("/livez %d %v %v into the outage", code, b, time.Since(start).Round(time.Second))
		}
		if st := c.kernelState(t); !reflect.DeepEqual(st, before) {
			t.Errorf("the kernel changed %v into the outage: %s", time.Since(start).Round(time.Second), chaos.Compare(st, exp))
		}
		checks++
		if !changed && time.Since(start) > outage-90*time.Second {
			if down {
				if err := c.CP.StartAPIServer(context.Background()); err != nil {
					t.Fatalf("restart the apiserver: %v", err)
				}
				down = false
			}
			c.changesAfter(t, ns, "during", bulk[20:25], bulk[25:30])
			changed = true
		}
		time.Sleep(min(time.Minute, time.Until(start.Add(outage))))
	}
	writes, syncs := c.netlinkWrites(t)
	if writes != writes0 {
		t.Errorf("the agent made %.0f netlink writes during the outage (%.0f syncs)", writes-writes0, syncs-syncs0)
	}
	backMark := c.logMark()
	reconnect()
	back := time.Now()
	agentOutage := back.Sub(start)
	_, d := c.converge(t, "changes made during the outage", c.expected(t, ns), 3*time.Minute)
	duringTook := time.Since(back)
	t.Logf("the agent from the outage's end to the kernel's convergence:\n%s", returnLines(c.logSince(backMark)))
	t.Logf("%s: changes made during the outage (%.0f s) in the kernel %.1f s after its end (limit %v)",
		k.name, seconds(agentOutage), seconds(duringTook), duringLimit)
	if duringTook > duringLimit {
		t.Errorf("changes made during the outage reached the kernel %.1f s after its end, want within %v", seconds(duringTook), duringLimit)
	}
	after := time.Now()
	c.changesAfter(t, ns, "after", bulk[:10], bulk[10:20])
	_, d = c.converge(t, "changes after the outage", c.expected(t, ns), 2*time.Minute)
	afterTook := time.Since(after)
	time.Sleep(2 * time.Second)
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("%d of %d connections failed: %q", failed, attempted, errs)
	}
	agentLog := c.logSince(mark)
	peaks.record(t, chaos.Row{Case: "apiserver-gone-5m-" + k.name, TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: int(writes - writes0), ConvergeSeconds: seconds(duringTook), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d Services; %s, %.0f s; %.0f netlink writes and %.0f syncs in it (the agent's metrics), the kernel unchanged over %d checks; "+
			"5 Services created, 5 changed, 5 deleted a minute before its end: in the kernel %.1f s after it (limit %v); "+
			"10 created, 10 changed, 10 deleted after it: in the kernel %.1f s later; the informers' waits for the apiserver: %d begun, %d ended",
			n+1, k.what, seconds(agentOutage), writes-writes0, syncs-syncs0, checks, seconds(duringTook), duringLimit, seconds(afterTook),
			strings.Count(agentLog, "trying again every"), strings.Count(agentLog, `"tries":`))})
}

// returnLines are the agent's lines about the apiserver, its lists and
// watches (by their message: the case's namespace names the apiserver
// too), and its first syncs that wrote, at most 40: what it did after an
// outage, in order.
func returnLines(log string) string {
	var out []string
	wrote := 0
	for _, l := range strings.Split(log, "\n") {
		m := logMessage.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		msg := strings.ToLower(m[1])
		synced := msg == "synced"
		if synced && (strings.Contains(l, `"writes":0,`) || wrote >= 3) {
			continue
		}
		if !synced && !strings.Contains(msg, "apiserver") && !strings.Contains(msg, "watch") && !strings.Contains(l, `"reflector"`) {
			continue
		}
		if synced {
			wrote++
		}
		out = append(out, l)
	}
	return strings.Join(out[:min(len(out), 40)], "\n")
}

// logMessage is the message of a line of the agent's JSON log.
var logMessage = regexp.MustCompile(`"msg":"([^"]*)"`)
