package e2e

import (
	corev1 "k8s.io/api/core/v1"

	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
)

// restartWrites bounds what a restart may write: one write per missing or
// leaked virtual server, real server and address of the diff before it.
func restartWrites(d chaos.Diff) int {
	n := 0
	for _, s := range append(append([]string{}, d.Missing...), d.Leaks...) {
		for _, p := range []string{"virtual server ", "real server ", "address "} {
			if strings.HasPrefix(s, p) {
				n++
			}
		}
	}
	return n
}

// countVS counts the virtual servers of the kernel's table whose address
// is one of ips.
func countVS(st chaos.State, ips map[string]bool) (vs, rs int) {
	for k, r := range st.Virtual {
		_, hp, _ := strings.Cut(k, " ")
		if host, _, err := net.SplitHostPort(hp); err == nil && ips[host] {
			vs++
			rs += len(r)
		}
	}
	return vs, rs
}

// TestChaosAgentRestart: CHAOS_SIZE Services plus a live one with TCP and
// UDP traffic and held TCP connections. (1) SIGTERM and a restart: the
// first sync writes nothing, every Service stays exact, no connection
// fails. (2) With the agent stopped, CHAOS_SIZE more Services are created
// and half of the first ones deleted; the agent starts and is SIGKILLed in
// the middle of that large first sync; started again it writes no more
// than what was missing or stale, every Service is exact, nothing leaked
// (the deleted Services' virtual servers and addresses gone), and the live
// Service's connections, whose endpoints never changed, all went through.
func TestChaosAgentRestart(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	n := chaosSize(t)
	ns, live, bulk := c.scaled(t, n)
	ctx := context.Background()

	// (1) SIGTERM, restart.
	lt := c.startLiveTraffic(t, live, 2)
	statsBefore := connCount(t, c.ipvsadm(t, "--stats", "-t", live.tcp))
	time.Sleep(2 * time.Second)
	if err := c.StopAgent(); err != nil {
		t.Fatal(err)
	}
	restart := time.Now()
	if err := c.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	firstSync := time.Since(restart)
	first := firstFullSync(c.AgentOutput())
	writes := syncWrites(first)
	if writes != 0 {
		t.Errorf("the first sync after a SIGTERM restart wrote %d times: %s", writes, first)
	}
	took, d := c.converge(t, "after the SIGTERM restart", c.expected(t, ns), 2*time.Minute)
	time.Sleep(2 * time.Second) // traffic after the restart
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("SIGTERM restart: %d of %d connections failed: %q", failed, attempted, errs)
	}
	if after := connCount(t, c.ipvsadm(t, "--stats", "-t", live.tcp)); after < statsBefore {
		t.Errorf("the live virtual server's connection count went from %d to %d: it was re-created", statsBefore, after)
	}
	peaks.record(t, chaos.Row{Case: "agent-sigterm-restart", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: writes, ConvergeSeconds: seconds(firstSync + took), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d Services; first sync after the restart %.1f s, %d writes; %d held flows kept (TCP and UDP)",
			n+1, seconds(firstSync), writes, len(lt.holds))})

	// (2) SIGKILL in the middle of a large first sync.
	peaks = startPeaks(context.Background(), t, c.bedVM())
	lt = c.startLiveTraffic(t, live, 2)
	if err := c.StopAgent(); err != nil {
		t.Fatal(err)
	}
	var gone []*corev1.Service
	for i := 0; i < n; i += 2 {
		gone = append(gone, bulk[i])
	}
	c.deleteServices(t, gone)
	added := c.bulkServices(t, ns, "bulk2", n, n)
	newIPs := map[string]bool{}
	for _, s := range added {
		newIPs[s.Spec.ClusterIP] = true
	}
	exp := c.expected(t, ns)
	before := c.kernelState(t)
	baseVS := len(before.Virtual)
	p, err := c.LaunchAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	launched := time.Now()
	// Kill (in the VM, without a round trip to this host) as soon as the
	// first new virtual server shows: the sync has begun writing and, with
	// CHAOS_SIZE Services to add, not finished.
	script := fmt.Sprintf(`i=0; while [ $(grep -c '^[TU]' /proc/net/ip_vs) -le %d ]; do i=$((i+1)); [ $i -gt 12000 ] && exit 1; usleep 10000; done; kill -9 $(pidof ipvs-proxy)`, baseVS)
	if _, err := c.VM.RunOK(ctx, "sh", "-c", script); err != nil {
		t.Fatalf("the agent wrote no virtual server within 2 minutes: %v\n%s", err, p.Output())
	}
	if err := c.KillAgent(); err != nil { // (its process group, already dead)
		t.Fatal(err)
	}
	killedAfter := time.Since(launched)
	killedLog := p.Output()
	mid := c.kernelState(t)
	vsAt, rsAt := countVS(mid, newIPs)
	if strings.Contains(killedLog, `"kind":"full"`) {
		t.Errorf("the first sync had finished when the SIGKILL landed (%d of %d new virtual servers written): the case tests nothing",
			vsAt, n)
	}
	dMid := chaos.Compare(mid, exp)
	bound := restartWrites(dMid)
	t.Logf("SIGKILL %v after the start: %d of %d new virtual servers and %d of %d real servers written; %d stale or missing objects",
		killedAfter.Round(time.Millisecond), vsAt, n, rsAt, 2*n, bound)

	restart = time.Now()
	if err := c.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	firstSync = time.Since(restart)
	first = firstFullSync(c.AgentOutput())
	writes = syncWrites(first)
	if writes > bound {
		t.Errorf("the first sync after the SIGKILL wrote %d times, more than the %d objects missing or stale: %s", writes, bound, first)
	}
	took, d = c.converge(t, "after the SIGKILL restart", exp, 3*time.Minute)
	time.Sleep(2 * time.Second)
	attempted, failed, errs = lt.stop(t)
	if failed > 0 {
		t.Errorf("SIGKILL restart: %d of %d connections failed: %q", failed, attempted, errs)
	}
	peaks.record(t, chaos.Row{Case: "agent-sigkill-first-sync", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: writes, ConvergeSeconds: seconds(firstSync + took), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d Services created and %d deleted while stopped; killed %.1f s into its first sync with %d/%d new "+
			"virtual servers, %d/%d real servers; the restart wrote %d (%d missing or stale)",
			n, len(gone), seconds(killedAfter), vsAt, n, rsAt, 2*n, writes, bound)})
}
