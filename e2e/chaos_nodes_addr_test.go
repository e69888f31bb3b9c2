package e2e

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// chaosNodesNewIP is node-1's new address in case 4: on the segment (the
// one the outside host reaches), from the tests' own part of it.
var chaosNodesNewIP = cluster.SegmentAddr(241)

// addressFollow bounds the time from an address's change to node ports
// that follow it: the agent hears of it from the kernel at once.
const addressFollow = 10 * time.Second

// addressWait bounds the case's waits for node ports to follow an address
// (the bound that fails the test is addressFollow; these only keep a
// stuck agent from holding the run): 2 minutes up to 2,000 Services, 2
// more per 1,000 above. Each change rebuilds every node-port Service: at
// 5,000 (2,601 of them) one such sync took 64 s on the loaded emulated
// node (build 51 s, the agent at a fifth of one CPU), and the restore's
// add and delete, a second apart, are two of them back to back.
func addressWait(size int) time.Duration {
	return sizedLimit(size, 2*time.Minute, 2*time.Minute)
}

// nodeAddressChange is issue 45's case 4: node-1's address on the segment
// (its kubelet's node IP) is replaced by chaosNodesNewIP: the new one
// added beside it, then the old one removed, as a renumbering does. The
// bed keeps reaching the node: it drives the VM over its other interface
// (QEMU's user network), and the segment stays up with the new address
// promoted (promote_secondaries). The outside host's route to the
// LoadBalancer IP and node-2's route to node-1's pods move to the new
// address before the old one goes, as the network would. Node ports
// follow at once on node-1: within addressFollow of the new address's
// addition node-1's IPVS table has every Service's node port on it (the
// outside host's first answer, which adds its neighbour resolution and
// the bed's polling, is reported and waited for), and within
// addressFollow of the old address's removal no virtual server is left
// on it. The agent is not restarted (its probes ask 127.0.0.1, not the
// pod's IP, which is the old address). Node-2 is untouched (its IPVS table the
// same, no write), and no connection fails meanwhile (node-1's node port
// is not in the streams: its old address is meant to stop answering).
// The Node object keeps the old address (kubelet only logs that it is
// gone), so nothing else changes in the cluster. The old address is put
// back at the end, under the same traffic.
func (b *nodesBed) nodeAddressChange(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	oldIP, newIP := n1.IP, chaosNodesNewIP
	other := b.untouched(t, n2)
	writes := b.writes(t, n1)
	restarts := restartCount(ipvsProxyPod(b.ctx, t, b.c, n1))
	tr := b.startTraffic(t, "address", map[string]string{n2.Name: n2.IP})

	b.run(t, n1.VM, "sysctl", "-qw", "net.ipv4.conf."+cluster.SegmentIface+".promote_secondaries=1")
	syncs := b.syncTimes(t, n1)
	cpu := b.metric(t, n1, "process_cpu_seconds_total")
	added := time.Now()
	b.run(t, n1.VM, "ip", "addr", "add", newIP+"/24", "dev", cluster.SegmentIface)
	busiest := b.busiestLater(t, n1, 5*time.Second)
	defer func() { <-busiest }() // also when the wait below fails the test
	follow := b.waitVirtualServersOn(t, n1, newIP, len(b.nodePorted), added)
	// What the agent had of the CPU meanwhile: a follow of many seconds
	// with little CPU is a starved agent, not slow work.
	cpu = b.metric(t, n1, "process_cpu_seconds_total") - cpu
	t.Logf("%s: the agent used %.1f s of CPU in the %s until the node ports were on the new address (%.0f%% of one CPU)",
		n1.Name, cpu, follow.Round(100*time.Millisecond), 100*cpu/follow.Seconds())
	syncs = b.logSyncs(t, n1, syncs, "the add and its node ports")
	b.waitAnswered(t, b.nodePort(newIP))
	answered := time.Since(added)
	tr.add(t, b.c.Outside, "outside-new-node-port", b.nodePort(newIP))
	newPorts := b.nodePortsAt(t, n1, newIP)

	b.routeNode(t, n1, newIP)
	removed := time.Now()
	b.run(t, n1.VM, "ip", "addr", "del", oldIP+"/24", "dev", cluster.SegmentIface)
	b.keepPodRoute(t, n1, n2)
	dropped := b.waitVirtualServersOn(t, n1, oldIP, 0, removed)
	b.logSyncs(t, n1, syncs, "the delete and the old address's last virtual server")
	time.Sleep(10 * time.Second) // traffic on the new address alone
	if follow > addressFollow {
		t.Errorf("%s: the node ports on the new address %s were all in its IPVS table %s after its addition; want within %s", n1.Name, newIP, follow.Round(time.Millisecond), addressFollow)
	}
	if dropped > addressFollow {
		t.Errorf("%s: virtual servers on the removed address %s left %s after its removal; want within %s", n1.Name, oldIP, dropped.Round(time.Millisecond), addressFollow)
	}
	leaks := b.leaks(t)
	ownWrites := int(b.writes(t, n1) - writes)
	ready := b.nodeReady(t, n1)
	// The old address back before the pods' results are read: the
	// apiserver reaches node-1's kubelet at it.
	tr.stopStream(t, "outside-new-node-port")
	restored := b.restoreAddress(t, n1, oldIP, newIP)
	b.logAgent(t, n1, added, "node-port addresses", `"msg":"synced"`, "iptables glue", "sync failed")
	restarted := b.agentRestarts(t, n1, restarts)
	clocks := vmClocks{node: b.clockOffset(t, n1.VM), outside: b.clockOffset(t, b.c.Outside)}
	inFlight, failed, attempted := splitFailures(t, tr.results(t), clocks, removalWindow(removed), removalWindow(restored))
	otherWrites := other.check(b.ctx, t, b)
	notes := fmt.Sprintf("%s's segment address %s -> %s: its %d node ports in the IPVS table %s after the add (the agent's CPU meanwhile %.1f s), answered from the outside host after %s; "+
		"old address's virtual servers gone %s after the delete; %d connections in flight when an address went failed (the kernel's, below); "+
		"restarts %d; Node Ready throughout: %v; %s untouched (%d writes); %d Services",
		n1.Name, oldIP, newIP, newPorts, follow.Round(100*time.Millisecond), cpu, answered.Round(100*time.Millisecond), dropped.Round(100*time.Millisecond),
		inFlight, restarted, ready, n2.Name, otherWrites, b.size)
	peaks.record(t, chaos.Row{Case: "nodes-address-change", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: ownWrites, ConvergeSeconds: math.Round(follow.Seconds()*10) / 10, Leaks: leaks, Notes: notes})
}

// logAgent logs the lines of n's agent since since that contain one of
// what (the last 100). Bounded (a cleanup calls it) and never fatal.
func (b *nodesBed) logAgent(t *testing.T, n *cluster.Node, since time.Time, what ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	pl, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: cluster.IPVSProxyPods, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil || len(pl.Items) == 0 {
		t.Logf("%s: no agent pod for its log (%v)", n.Name, err)
		return
	}
	raw, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).GetLogs(pl.Items[0].Name,
		&corev1.PodLogOptions{SinceTime: &metav1.Time{Time: since.Add(-time.Second)}}).DoRaw(ctx)
	if err != nil {
		t.Logf("%s: the agent's log: %v", n.Name, err)
		return
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if slices.ContainsFunc(what, func(w string) bool { return strings.Contains(l, w) }) {
			lines = append(lines, l)
		}
	}
	t.Logf("%s: the agent's lines since %s (%d):\n%s", n.Name, since.Format("15:04:05.000"), len(lines),
		strings.Join(lines[max(0, len(lines)-100):], "\n"))
}

// busiestLater logs, after d, n's load and busiest processes (busybox
// top): what shares the VM's CPUs with the agent while it follows a
// change. The channel closes when it is logged.
func (b *nodesBed) busiestLater(t *testing.T, n *cluster.Node, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(d)
		out, err := n.VM.RunOK(b.ctx, "top", "-b", "-n", "1")
		lines := strings.Split(out, "\n")
		t.Logf("%s: %s after the change, top (%v):\n%s", n.Name, d, err, strings.Join(lines[:min(len(lines), 16)], "\n"))
		weights, err := n.VM.RunOK(b.ctx, "sh", "-c", cgroupWeights)
		t.Logf("%s: CPU weights of the cgroups of the agent and of the hosts' processes, leaf first (%v):\n%s", n.Name, err, weights)
	}()
	return done
}

// cgroupWeights prints, for the agent, a process of the VM's own (the
// test's agent, which runs the hosts' traffic clients) and the kubelet, each cgroup
// from its leaf to the root with its cpu.weight, and how many processes
// sit in the root cgroup: under contention the agent's CPU share follows
// them.
const cgroupWeights = `for name in ipvs-proxy vmagent kubelet; do p=$(pidof $name | awk '{print $NF}'); c=$(cut -d: -f3 /proc/$p/cgroup); echo "$name $p:"; ` +
	`while [ -n "$c" ] && [ "$c" != "/" ]; do echo "  $c $(cat /sys/fs/cgroup$c/cpu.weight 2>/dev/null)"; c=$(dirname $c); done; done; ` +
	`echo "root cgroup: $(wc -l < /sys/fs/cgroup/cgroup.procs) processes"`

// run runs argv in v and fails the test if it fails.
func (b *nodesBed) run(t *testing.T, v *vm.VM, argv ...string) {
	t.Helper()
	if out, err := v.RunOK(b.ctx, argv...); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// waitVirtualServersOn polls n's IPVS table (readIPVSTable, one read of
// /proc/net/ip_vs) until it holds at least want TCP virtual servers on
// addr (want 0: none), and returns the time from since to the read that
// saw it: the agent's part of an address change, without the outside
// host's neighbour resolution. The whole table is read only once the
// live Service's node port on addr has come (or gone): at 2,000 Services
// each read of it took a fifth of the node's CPU, five times the agent's
// share while it rebuilt its plans (issue 45, case 4), and the agent
// writes the node ports of one change in one batch.
func (b *nodesBed) waitVirtualServersOn(t *testing.T, n *cluster.Node, addr string, want int, since time.Time, extra ...func() string) time.Duration {
	t.Helper()
	on := netip.MustParseAddr(addr)
	waitEvery(b.ctx, t, addressWait(b.size), time.Second, fmt.Sprintf("the live Service's node port on %s on %s", addr, n.Name), func() (bool, string) {
		_, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", b.nodePort(addr))
		return (err == nil) == (want > 0), fmt.Sprint(err)
	}, extra...)
	var took time.Duration
	waitEvery(b.ctx, t, addressWait(b.size), 2*time.Second, fmt.Sprintf("%d virtual servers on %s on %s", want, addr, n.Name), func() (bool, string) {
		table, err := readIPVSTable(b.ctx, n.VM)
		took = time.Since(since)
		if err != nil {
			return false, err.Error()
		}
		got := 0
		for vs := range table {
			if vs.Protocol == ktypes.TCP && vs.Address == on {
				got++
			}
		}
		return (want == 0 && got == 0) || (want > 0 && got >= want), fmt.Sprintf("%d after %s", got, took.Round(time.Millisecond))
	}, extra...)
	return took
}

// syncSeries are the agent's sync-duration histograms, partial and full.
var syncSeries = []string{"kubeproxy_sync_partial_proxy_rules_duration_seconds", "kubeproxy_sync_full_proxy_rules_duration_seconds"}

// syncTimes reads the count and sum of each of n's syncSeries.
func (b *nodesBed) syncTimes(t *testing.T, n *cluster.Node) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range syncSeries {
		for _, part := range []string{"_count", "_sum"} {
			out[s+part] = b.metric(t, n, s+part)
		}
	}
	return out
}

// logSyncs logs the syncs n's agent made since before (syncTimes) and
// their time, and returns the new reading: what an address change cost.
func (b *nodesBed) logSyncs(t *testing.T, n *cluster.Node, before map[string]float64, between string) map[string]float64 {
	t.Helper()
	now := b.syncTimes(t, n)
	var parts []string
	for _, s := range syncSeries {
		parts = append(parts, fmt.Sprintf("%s: %.0f syncs, %.1f s", strings.TrimPrefix(s, "kubeproxy_sync_"),
			now[s+"_count"]-before[s+"_count"], now[s+"_sum"]-before[s+"_sum"]))
	}
	t.Logf("%s: the agent's syncs between %s: %s", n.Name, between, strings.Join(parts, "; "))
	return now
}

// waitAnswered waits until the outside host's connection to addr is
// answered (one attempt every half second, each with a 1 s timeout).
func (b *nodesBed) waitAnswered(t *testing.T, addr string) {
	t.Helper()
	waitWithin(b.ctx, t, 2*time.Minute, "outside host -> "+addr+" answered", func() (bool, string) {
		hit := vmHit(b.ctx, t, b.c.Outside, addr, 1, "--timeout", "1s")
		if hit.Total() == 1 {
			return true, ""
		}
		time.Sleep(500 * time.Millisecond)
		return false, fmt.Sprint(hit.Errors)
	})
}

// routeNode points what reaches node-1 over the segment at addr: the
// outside host's route to the LoadBalancer IP, node-2's to node-1's pods.
func (b *nodesBed) routeNode(t *testing.T, n1 *cluster.Node, addr string) {
	t.Helper()
	b.run(t, b.c.Outside, "ip", "route", "replace", chaosNodesLBIP+"/32", "via", addr, "dev", cluster.SegmentIface)
	b.run(t, b.c.Nodes[1].VM, "ip", "route", "replace", n1.PodCIDR, "via", addr, "dev", cluster.SegmentIface)
}

// keepPodRoute checks that n still routes other's pods over the segment
// after an address change, and puts the route back if the kernel took it
// away (bed plumbing, logged).
func (b *nodesBed) keepPodRoute(t *testing.T, n, other *cluster.Node) {
	t.Helper()
	out, err := n.VM.RunOK(b.ctx, "ip", "-4", "route", "show", other.PodCIDR)
	if err == nil && strings.Contains(out, "via "+other.IP) {
		return
	}
	t.Logf("%s: the route to %s's pods went with the address (%q, %v); put back", n.Name, other.Name, out, err)
	b.run(t, n.VM, "ip", "route", "replace", other.PodCIDR, "via", other.IP, "dev", cluster.SegmentIface)
}

// removalWindow is when a connection that failed was in flight as an
// address of the node went (at): begun at most the streams' 5 s timeout
// before it, and up to 2 s after (the prefix route's move to the promoted
// address), with 2 s more each side for the VMs' clocks, read in whole
// seconds. Such failures are the kernel's, not the agent's: removing an
// address deletes the conntrack entries masqueraded to it (netfilter's
// masquerade address notifier), so the node's own and forwarded flows to
// other nodes' endpoints that left through it end, and until the promoted
// address has its prefix route the segment is unreachable.
func removalWindow(at time.Time) [2]time.Time {
	return [2]time.Time{at.Add(-7 * time.Second), at.Add(4 * time.Second)}
}

// restoreAddress gives n1 its old address back and takes the new one
// away, routes first, and waits for the old address's node ports; it
// returns when the new address went.
func (b *nodesBed) restoreAddress(t *testing.T, n1 *cluster.Node, oldIP, newIP string) time.Time {
	t.Helper()
	b.run(t, n1.VM, "ip", "addr", "add", oldIP+"/24", "dev", cluster.SegmentIface)
	b.routeNode(t, n1, oldIP)
	removed := time.Now()
	b.run(t, n1.VM, "ip", "addr", "del", newIP+"/24", "dev", cluster.SegmentIface)
	b.keepPodRoute(t, n1, b.c.Nodes[1])
	logged := func() string {
		b.logAgent(t, n1, removed, "node-port addresses", `"msg":"synced"`, "sync failed", "resync")
		return "(the agent's lines above)"
	}
	b.waitVirtualServersOn(t, n1, newIP, 0, removed, logged)
	b.waitVirtualServersOn(t, n1, oldIP, len(b.nodePorted), removed, logged)
	b.nodePortsAt(t, n1, oldIP)
	return removed
}

// nodeReady reports n's Ready condition.
func (b *nodesBed) nodeReady(t *testing.T, n *cluster.Node) bool {
	t.Helper()
	node, err := b.c.Client.CoreV1().Nodes().Get(b.ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
