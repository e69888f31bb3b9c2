package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/ctwatch"
)

// ctTable is the VM's connection tracking table as the kernel shows it.
type ctTable struct {
	entries, max int
	total        ctwatch.Stats
}

// ctTable reads nf_conntrack_count, nf_conntrack_max and the per-CPU
// counters of the VM's root namespace in one round trip.
func (c chaosEnv) ctTable(t *testing.T) ctTable {
	t.Helper()
	out := c.vmRun(t, "sh", "-c", "cat /proc/sys/net/netfilter/nf_conntrack_count /proc/sys/net/netfilter/nf_conntrack_max /proc/net/stat/nf_conntrack")
	lines := strings.SplitN(out, "\n", 3)
	if len(lines) != 3 {
		t.Fatalf("conntrack table: %q", out)
	}
	var ct ctTable
	var err error
	if ct.entries, err = strconv.Atoi(strings.TrimSpace(lines[0])); err != nil {
		t.Fatal(err)
	}
	if ct.max, err = strconv.Atoi(strings.TrimSpace(lines[1])); err != nil {
		t.Fatal(err)
	}
	perCPU, err := ctwatch.ParseStat(strings.NewReader(lines[2]))
	if err != nil {
		t.Fatalf("conntrack counters: %v\n%s", err, lines[2])
	}
	ct.total = ctwatch.Sample{PerCPU: perCPU}.Total()
	return ct
}

// untrackBedControl exempts the bed's own control traffic from connection
// tracking while a case fills the table: the guest agent's port (the
// harness's commands) and the agent's metrics and debug ports on loopback
// (the test's scrapes, status's /statusz). Service traffic, the agent's
// API connection and its Events stay tracked. An nftables table of its own
// (the VM has nft_ct's notrack; iptables' raw table and CT target are not
// in its modules), deleted when the test ends.
func (c chaosEnv) untrackBedControl(t *testing.T) {
	t.Helper()
	agent := strconv.Itoa(agentapi.Port)
	rules := "table ip bed_notrack {\n" +
		" chain pre { type filter hook prerouting priority raw; policy accept; tcp dport " + agent + " notrack; iif \"lo\" tcp dport { 10247, 10249 } notrack; iif \"lo\" tcp sport { 10247, 10249 } notrack; }\n" +
		" chain out { type filter hook output priority raw; policy accept; tcp sport " + agent + " notrack; oif \"lo\" tcp dport { 10247, 10249 } notrack; oif \"lo\" tcp sport { 10247, 10249 } notrack; }\n" +
		"}\n"
	res, err := c.VM.Exec(context.Background(), vm.Command{Argv: []string{"nft", "-f", "-"}, Stdin: []byte(rules)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("nft -f -: %v %s\n%s", err, res.Stderr, rules)
	}
	t.Cleanup(func() { _, _ = c.VM.RunOK(context.Background(), "nft", "delete", "table", "ip", "bed_notrack") })
}

// withSmallTable restarts the agent holding nf_conntrack_max at limit, as a
// node's operator would with kube-proxy's flags (--conntrack-max-per-core
// 1 --conntrack-min limit: limit on a node of fewer CPUs than that), and, when
// the test ends, the bed's agent, which sets the default (131072) back.
func (c chaosEnv) withSmallTable(t *testing.T, limit int) {
	t.Helper()
	if err := c.StopAgent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.StopAgent()
		if err := c.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the bed's agent: %v", err)
			return
		}
		if got := c.ctTable(t).max; got != 131072 {
			t.Errorf("the bed's agent left nf_conntrack_max %d, want its default 131072", got)
		}
	})
	if err := c.StartAgent(context.Background(), "--conntrack-max-per-core", "1", "--conntrack-min", strconv.Itoa(limit)); err != nil {
		t.Fatal(err)
	}
	if got := c.ctTable(t).max; got != limit {
		t.Fatalf("the agent set nf_conntrack_max %d, want %d", got, limit)
	}
}

// probeNew opens n new TCP connections through addr from the client
// namespace, 2 s each, and returns how many failed.
func (c chaosEnv) probeNew(t *testing.T, addr string, n int) int {
	t.Helper()
	res, err := c.VM.Hit(context.Background(), nettest.HitConfig{Netns: bed.ClientNetns, Proto: "tcp", Addr: addr, N: n, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("probe %s: %v", addr, err)
	}
	return len(res.Errors)
}

// timeUntil polls cond every second until it holds or timeout passes, and
// returns how long that took and whether it held.
func timeUntil(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(time.Second)
	}
}

var ctFilled = regexp.MustCompile(`(filled|final) held=(\d+) failed=(\d+)`)

// TestChaosConntrackFull: with live traffic through a Service, the agent
// holds a small nf_conntrack_max and a client namespace fills the table
// with established TCP connections to a backend, then keeps it full. The
// kernel drops new connections (its drop counter and its "table full"
// line); established flows go on; the agent reports it (metrics, a warning
// log line, a Node Event, `ipvs-proxy status`), and still programs a
// Service created meanwhile. When the filling connections are reset, new
// connections succeed again and the report clears.
func TestChaosConntrackFull(t *testing.T) {
	c := chaosSetup(t)
	ctx := context.Background()
	peaks := startPeaks(ctx, t, c.bedVM())
	ns := c.namespace(t)
	c.cleanupNamespace(t, ns)
	live := c.liveService(t, ns)
	sink := c.backends(t, 1)[0] // the filling connections' server, behind no Service
	c.untrackBedControl(t)

	lt := c.startLiveTraffic(t, live, 2)
	time.Sleep(10 * time.Second) // the traffic's own entries reach their level
	base := c.ctTable(t)
	// Room for the filling connections, and a baseline well below 80%.
	limit := (2*base.entries + 1024 + 255) / 256 * 256
	c.withSmallTable(t, limit)
	mark := c.logMark()
	before := c.ctTable(t)

	fill, err := c.VM.Start(ctx, "vmagent", "ctfill", "--netns", bed.ClientNetns, "--addr", hostPort(sink.Addr, backendPort),
		"--n", strconv.Itoa(limit), "--stop", "20", "--timeout", "1s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fill.Stop() })
	fillStart := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := fill.WaitFor(wctx, "filled "); err != nil {
		t.Fatalf("the table did not fill: %v\n%s", err, fill.Output())
	}
	m := ctFilled.FindStringSubmatch(fill.Output())
	t.Logf("table filled in %v: %s; base %d entries, max %d", time.Since(fillStart).Round(time.Millisecond), m[0], base.entries, limit)

	// What the node does.
	probeFailed := c.probeNew(t, live.tcp, 10)
	full := c.ctTable(t)
	drops := full.total.Drop - before.total.Drop
	if drops == 0 {
		t.Errorf("the kernel's drop counter did not grow with the table full (%d of %d entries)", full.entries, full.max)
	}
	if !strings.Contains(c.vmRun(t, "dmesg"), "nf_conntrack: table full, dropping packet") {
		t.Errorf("no \"nf_conntrack: table full, dropping packet\" in the kernel's log")
	}
	if probeFailed == 0 {
		t.Errorf("10 new connections through %s all succeeded with the table full", live.tcp)
	}

	// What the agent reports.
	var scraped map[string]float64
	reportTook, ok := timeUntil(30*time.Second, func() bool {
		scraped = c.scrape(t)
		return scraped["ipvs_proxy_conntrack_pressure"] == 1 && scraped[`ipvs_proxy_conntrack_dropped_total{reason="drop"}`] > 0 &&
			strings.Contains(c.logSince(mark), "connection tracking table full") && c.nodeEvent(t, ctwatch.EventDropping, "", time.Time{}) != nil
	})
	if !ok {
		t.Errorf("the agent did not report the full table within 30 s: pressure %v, drop %v, log %q, Event %v",
			scraped["ipvs_proxy_conntrack_pressure"], scraped[`ipvs_proxy_conntrack_dropped_total{reason="drop"}`],
			grepLines(c.logSince(mark), "connection tracking"), c.nodeEvent(t, ctwatch.EventDropping, "", time.Time{}) != nil)
	}
	if got := scraped["ipvs_proxy_conntrack_max"]; got != float64(limit) {
		t.Errorf("ipvs_proxy_conntrack_max %v, want %d", got, limit)
	}
	status := c.vmRun(t, bed.GuestBinary, "status")
	if !strings.Contains(status, "NEARLY FULL") {
		t.Errorf("ipvs-proxy status does not say the table is full:\n%s", grepLines(status, "conntrack"))
	}

	// The agent's own work goes on: a Service created now is programmed.
	bes := live.bes
	during := c.createService(t, ns, "during", []corev1.ServicePort{tcpPort("http", 80)})
	c.setSlice(t, during, discoveryv1.AddressTypeIPv4, bes)
	programmed, _ := c.converge(t, "a Service created with the table full", c.expected(t, ns), time.Minute)

	// The pressure goes.
	if err := fill.Stop(); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	final := ctFilled.FindAllStringSubmatch(fill.Output(), -1)
	newOK, ok := timeUntil(90*time.Second, func() bool { return c.probeNew(t, live.tcp, 5) == 0 })
	if !ok {
		t.Errorf("new connections through %s still fail 90 s after the pressure went", live.tcp)
	}
	_, ok = timeUntil(90*time.Second, func() bool {
		return c.scrape(t)["ipvs_proxy_conntrack_pressure"] == 0 && strings.Contains(c.logSince(mark), "below 80% again") &&
			c.nodeEvent(t, ctwatch.EventRecovered, "", time.Time{}) != nil
	})
	if !ok {
		t.Errorf("the report did not clear within 90 s: %q", grepLines(c.logSince(mark), "connection tracking"))
	}
	clearedAfter := time.Since(released)
	after := c.ctTable(t)
	t.Logf("the agent's lines on the table:\n%s", grepLines(c.logSince(mark), "connection tracking"))

	attempted, failed, errs := lt.stop(t)
	for _, e := range errs {
		if strings.HasPrefix(e, "held flow") {
			t.Errorf("an established flow broke with the table full: %s", e)
		}
	}
	d := chaos.Compare(c.kernelState(t), c.expected(t, ns))
	if len(d.Leaks) > 0 {
		t.Errorf("leaks: %s", d)
	}
	peaks.record(t, chaos.Row{Case: "conntrack-full", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: syncWrites(c.logSince(mark)), ConvergeSeconds: seconds(clearedAfter), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("nf_conntrack_max %d set by the agent's --conntrack-min (traffic alone: %d entries); %s, then %s; kernel: %d drops, %d early drops, %d of 10 new connections through the VIP failed, held flows kept; the agent reported it (metrics, log, Event %s) within %.1f s, a Service created meanwhile programmed in %.1f s; after the reset: new connections again in %.1f s, report cleared (%s) in %.1f s, %d entries",
			limit, base.entries, m[0], final[len(final)-1][0], drops, full.total.EarlyDrop-before.total.EarlyDrop, probeFailed,
			ctwatch.EventDropping, seconds(reportTook), seconds(programmed), seconds(newOK), ctwatch.EventRecovered, seconds(clearedAfter), after.entries)})
}
