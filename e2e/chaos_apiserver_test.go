package e2e

import (
	corev1 "k8s.io/api/core/v1"

	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// apiserverBack restarts the apiserver when the test ends if it is down,
// and waits for the agent's /healthz: the bed is shared.
func (c chaosEnv) apiserverBack(t *testing.T, down *bool) {
	t.Cleanup(func() {
		if *down {
			if err := c.CP.StartAPIServer(context.Background()); err != nil {
				t.Errorf("restart the apiserver: %v", err)
				return
			}
			*down = false
		}
		c.waitHealth(t, healthzURL, 200, 2*time.Minute)
	})
}

// cutOff refuses the agent's connections to the apiserver in the VM (a
// TCP reset: connection refused, as from a stopped apiserver) until the
// returned func is called, or the test ends.
func (c chaosEnv) cutOff(t *testing.T) (reconnect func()) {
	t.Helper()
	host, port, _ := strings.Cut(vm.APIServerGuestAddr, ":")
	return c.withRules(t, []string{"OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-j", "REJECT", "--reject-with", "tcp-reset"})
}

// withRules inserts iptables rules (chain and match, as after -I) in the
// VM until the returned func deletes them, or the test ends.
func (c chaosEnv) withRules(t *testing.T, rules ...[]string) (remove func()) {
	t.Helper()
	for _, r := range rules {
		c.vmRun(t, append([]string{"iptables", "-I"}, r...)...)
	}
	in := true
	t.Cleanup(func() {
		if in {
			for _, r := range rules {
				_, _ = c.VM.RunOK(context.Background(), append([]string{"iptables", "-D"}, r...)...)
			}
		}
	})
	return func() {
		for _, r := range rules {
			c.vmRun(t, append([]string{"iptables", "-D"}, r...)...)
		}
		in = false
	}
}

// changesAfter makes one change of each kind in ns: a Service created, a
// Service's endpoints changed, a Service deleted; it returns when the API
// took them.
func (c chaosEnv) changesAfter(t *testing.T, ns, prefix string, change, remove []*corev1.Service) {
	t.Helper()
	c.bulkServices(t, ns, prefix, 0, len(change))
	err := parallel(len(change), func(i int) error {
		s := change[i]
		old, err := c.fast.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), s.Name+"-ipv4", metav1.GetOptions{})
		if err != nil {
			return err
		}
		eps := slice(s, fakeEndpoints(1000+i, 3))
		eps.ResourceVersion = old.ResourceVersion
		_, err = c.fast.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), eps, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("change endpoints: %v", err)
	}
	c.deleteServices(t, remove)
}

// duringLimit is how soon after the apiserver's return the changes made
// during its outage must be in the kernel: untilReachable's longest wait
// (10 s), a sync period (5 s in the bed) and the test's polling.
const duringLimit = 20 * time.Second

// TestChaosAPIServerDown: with CHAOS_SIZE Services and live traffic, the
// apiserver stops for 60 s while the agent runs: no connection fails, the
// kernel does not change (no write at all), /livez and /healthz stay 200
// (the rules are in sync: kube-proxy's rule), /healthz reporting the
// outage (apiserverUnreachableSince) within 2 × --sync-period. Services
// created, changed and deleted during the outage reach the kernel within
// duringLimit of the apiserver's return (the agent's own backoff,
// untilReachable, waits 10 s at most; client-go's reflector waited up to
// 60 s); the report clears, and changes made then reach the kernel too.
func TestChaosAPIServerDown(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	n := chaosSize(t)
	if n < 30 {
		t.Fatalf("CHAOS_SIZE=%d: this case changes 30 of its Services", n)
	}
	ns, live, bulk := c.scaled(t, n)
	c.waitHealth(t, healthzURL, 200, time.Minute)

	lt := c.startLiveTraffic(t, live, 2)
	before := c.kernelState(t)
	exp := c.expected(t, ns)
	mark := c.logMark()
	down := true
	c.apiserverBack(t, &down)
	// The outage starts when the stop is called: the apiserver closes its
	// listener first and then drains for about a second, and the agent's
	// probe fails from the listener's close (TestOpsServe measures so too).
	stopped := time.Now()
	c.CP.StopAPIServer()
	const outage = 60 * time.Second
	var reportedAfter time.Duration
	// Health every 2 s; the kernel, whose read is heavier, every 10 s and
	// at the end.
	checks := 0
	var kernelChecked time.Time
	for time.Since(stopped) < outage {
		if code, b := c.healthOf(t, livezURL); code != 200 {
			t.Errorf("/livez %d %v %v into the outage", code, b, time.Since(stopped).Round(time.Second))
		}
		code, b := c.healthOf(t, healthzURL)
		if code != 200 {
			t.Errorf("/healthz %d %v %v into the outage", code, b, time.Since(stopped).Round(time.Second))
		}
		if b["apiserverUnreachableSince"] != nil && reportedAfter == 0 {
			reportedAfter = time.Since(stopped)
		}
		if time.Since(kernelChecked) > 10*time.Second || time.Since(stopped) > outage-5*time.Second {
			if st := c.kernelState(t); !reflect.DeepEqual(st, before) {
				t.Errorf("the kernel changed %v into the outage: %s", time.Since(stopped).Round(time.Second), chaos.Compare(st, exp))
			}
			kernelChecked = time.Now()
			checks++
		}
		time.Sleep(2 * time.Second)
	}
	writes := syncWrites(c.logSince(mark))
	if writes != 0 {
		t.Errorf("the agent wrote %d times while the apiserver was down", writes)
	}
	if reportedAfter == 0 || reportedAfter > healthLimit+2*time.Second { // polled every 2 s
		t.Errorf("/healthz reported the outage after %v, want within %v", reportedAfter, healthLimit)
	}

	// Changes made during the outage: the apiserver starts again with the
	// agent still cut off from it (its connections refused in the VM, as
	// while the apiserver was stopped); Services are created, changed and
	// deleted; then the agent's path comes back, the apiserver's return
	// as the agent sees it.
	reconnect := c.cutOff(t)
	if err := c.CP.StartAPIServer(context.Background()); err != nil {
		t.Fatalf("restart the apiserver: %v", err)
	}
	down = false
	c.changesAfter(t, ns, "during", bulk[20:25], bulk[25:30])
	agentOutage := time.Since(stopped)
	reconnect()
	back := time.Now()
	_, d := c.converge(t, "changes made during the outage", c.expected(t, ns), 2*time.Minute)
	duringTook := time.Since(back)
	t.Logf("changes made during the outage (the agent cut off %.0f s): in the kernel %.1f s after the apiserver's return (limit %v)",
		seconds(agentOutage), seconds(duringTook), duringLimit)
	if duringTook > duringLimit {
		t.Errorf("changes made during the outage reached the kernel %.1f s after the apiserver's return, want within %v",
			seconds(duringTook), duringLimit)
	}
	eventually(t, 2*time.Minute, func() error {
		if code, b := c.healthOf(t, healthzURL); code != 200 || b["apiserverUnreachableSince"] != nil {
			return fmt.Errorf("/healthz %d %v after the apiserver's return", code, b)
		}
		return nil
	})
	healthyAfter := time.Since(back)
	changed := time.Now()
	c.changesAfter(t, ns, "after", bulk[:10], bulk[10:20])
	_, d = c.converge(t, "changes after the apiserver returned", c.expected(t, ns), 2*time.Minute)
	took := time.Since(changed) // from the first change
	time.Sleep(2 * time.Second)
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("%d of %d connections failed: %q", failed, attempted, errs)
	}
	peaks.record(t, chaos.Row{Case: "apiserver-down-60s", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: writes, ConvergeSeconds: seconds(duringTook), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d Services; 0 writes and the kernel unchanged over %d checks in the outage; /livez and /healthz 200 throughout; "+
			"the outage reported after %.0f s (limit %v); 5 Services created, 5 changed, 5 deleted during it (the agent cut off %.0f s): "+
			"in the kernel %.1f s after the apiserver's return (limit %v); the report cleared %.1f s after it; 10 created, 10 changed, "+
			"10 deleted after it: in the kernel %.1f s later", n+1, checks, seconds(reportedAfter), healthLimit, seconds(agentOutage),
			seconds(duringTook), duringLimit, seconds(healthyAfter), seconds(took))})
}

// apiserverRequests counts the apiserver's requests of a verb on Services
// and EndpointSlices answered with code, since it started
// (apiserver_request_total).
func (c chaosEnv) apiserverRequests(t *testing.T, verb, code string) int {
	t.Helper()
	body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("apiserver metrics: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `verb="`+verb+`"`) ||
			!strings.Contains(l, `code="`+code+`"`) ||
			!(strings.Contains(l, `resource="services"`) || strings.Contains(l, `resource="endpointslices"`)) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
			n += int(v)
		}
	}
	return n
}

// TestChaosWatchGap: the agent loses the apiserver (its connections are
// refused in the VM) while the apiserver restarts; Services are created,
// changed and deleted meanwhile; etcd is compacted and the apiserver
// restarts again, so the agent's watches cannot resume ("too old resource
// version") and must list again. When the agent reaches the apiserver
// again, every change is in the kernel, deletions included, nothing
// leaked, and the live Service's connections never failed.
func TestChaosWatchGap(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	ns := c.namespace(t)
	c.cleanupNamespace(t, ns)
	live := c.liveService(t, ns)
	gap := c.bulkServices(t, ns, "gap", 0, 40)
	c.converge(t, "the Services", c.expected(t, ns), 2*time.Minute)
	if t.Failed() {
		t.FailNow()
	}
	lt := c.startLiveTraffic(t, live, 2)
	mark := c.logMark()

	reconnect := c.cutOff(t)
	down := false
	c.apiserverBack(t, &down)
	restartAPIServer := func() {
		down = true
		c.CP.StopAPIServer()
		if err := c.CP.StartAPIServer(context.Background()); err != nil {
			t.Fatalf("restart the apiserver: %v", err)
		}
		down = false
	}
	restartAPIServer() // ends the agent's watches; it cannot reconnect
	c.changesAfter(t, ns, "gap-new", gap[:10], gap[10:20])
	rev, err := c.CP.CompactEtcd(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	restartAPIServer()
	reconnect()
	took, d := c.converge(t, "after the watch gap", c.expected(t, ns), 3*time.Minute)
	time.Sleep(2 * time.Second)
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("%d of %d connections failed: %q", failed, attempted, errs)
	}
	log := c.logSince(mark)
	// client-go lists again when a watch ends with an error (an apiserver
	// that went away); the compaction leaves it no way to resume one. The
	// count includes the test's own two lists (expected).
	relist := fmt.Sprintf("%d lists of Services/EndpointSlices since the apiserver's restart, the test's 2 included; "+
		"%d \"watch ended with error\" in the agent's log", c.apiserverRequests(t, "LIST", "200"),
		strings.Count(log, "watch ended with error"))
	t.Logf("etcd compacted at revision %d; %s", rev, relist)
	// One log format: client-go's lines (its reflectors' errors while the
	// apiserver was away) come through the agent's logger, as JSON.
	whole := c.AgentOutput()
	bad, clientGo := notJSONLines(whole)
	if len(bad) > 0 {
		t.Errorf("%d lines of the agent's output are not JSON, the first:\n%s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	t.Logf("the agent's whole output: %d bytes, %d lines not JSON, %d lines of client-go's reflectors", len(whole), len(bad), clientGo)
	c.waitHealth(t, healthzURL, 200, 2*time.Minute)
	peaks.record(t, chaos.Row{Case: "watch-gap-compaction", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: syncWrites(log), ConvergeSeconds: seconds(took), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("41 Services; cut off from the apiserver: 10 Services created, 10 changed, 10 deleted; etcd compacted, "+
			"apiserver restarted; all in the kernel %.1f s after the agent's path came back (%s)", seconds(took), relist)})
}
