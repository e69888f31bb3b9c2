package e2e

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// lossFollow bounds the agent's part of a lost node: from the
// EndpointSlice marking the node's endpoints not ready to node-1's IPVS
// sending them no new connection (weight 0).
const lossFollow = 5 * time.Second

// lossDrain bounds the time from the kill to node-1's IPVS holding none
// of the lost node's real servers: they stay at weight 0 while IPVS
// counts connections on them, the last answered ones in TIME_WAIT for 2
// minutes.
const lossDrain = 4 * time.Minute

// nodeLost is issue 45's case 1: node-2's VM is killed (a power loss:
// cluster.LoseNode) under traffic from node-1's host and pod and from the
// outside host through node-1, and held connections through node-1 (its
// host to the clusterIP, the outside host to the LoadBalancer IP), then
// booted again as the same node (cluster.RebootNode). Asserted:
//   - connections that fail began between the kill and node-1's IPVS
//     taking node-2's endpoints to weight 0 (sent there before the
//     EndpointSlice said they were gone): counted apart; any other fails
//     the test, and so does a broken held connection to node-1's endpoint;
//   - node-1's agent follows the EndpointSlice within lossFollow, its
//     real servers on node-2 are all gone within lossDrain of the kill,
//     every other line of its IPVS table is unchanged, and its writes are
//     at most two per removed real server (weight 0, delete);
//   - after the reboot node-2's agent pod runs again and node-2's kernel
//     holds what the Services want; node-1 writes no more than the real
//     servers that changed when node-2's endpoints return, its agent is
//     not restarted, and neither node leaks.
func (b *nodesBed) nodeLost(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	server2 := b.serverPod(t, "server-2")
	before := readKernelState(t, n1.VM)
	lost := podCIDRServers(b.ipvsTable(t, n1), n2.PodCIDR)
	if len(lost) == 0 {
		t.Fatalf("%s has no real server on %s's pods (%s) before the loss", n1.Name, n2.Name, n2.PodCIDR)
	}
	writes := b.writes(t, n1)
	restarts := restartCount(ipvsProxyPod(b.ctx, t, b.c, n1))
	tr := b.startTrafficFrom(t, "lost", map[string]string{n1.Name: n1.IP}, n1)
	holds := []*heldSet{b.heldSet(t, n1.VM, n1.Name+"-host-cluster-ip", b.clusterIP(), 43000),
		b.heldSet(t, b.c.Outside, "outside-lb-ip", b.lbIP(), 43100)}
	clocks := vmClocks{node: b.clockOffset(t, n1.VM), outside: b.clockOffset(t, b.c.Outside)}

	killed := time.Now()
	if err := b.c.LoseNode(n2); err != nil {
		t.Fatal(err)
	}
	seen := b.watchLoss(t, n1, n2, server2, killed)
	// The syncs that followed the EndpointSlice (the node's clock).
	b.logAgent(t, n1, killed.Add(seen.sliceUnready-3*time.Second), `"msg":"synced"`, "sync failed", "slow")
	if follow := seen.zero - seen.sliceUnready; follow > lossFollow {
		t.Errorf("%s took %s's real servers to weight 0 %s after their EndpointSlice said not ready; want within %s",
			n1.Name, n2.Name, follow.Round(time.Millisecond), lossFollow)
	}
	lossWrites := int(b.writes(t, n1) - writes)
	if lossWrites > 2*len(lost) {
		t.Errorf("%s's agent made %d writes for the loss; want at most %d (weight 0 and delete of each of %d real servers on %s's pods)",
			n1.Name, lossWrites, 2*len(lost), len(lost), n2.Name)
	}
	afterLoss := readKernelState(t, n1.VM)
	unchangedBut(t, n1.Name+" after the loss", before, afterLoss, n2.PodCIDR)

	back := b.rebootLost(t, n2, server2)
	returnWrites := b.followReturn(t, n1, n2, back, afterLoss, writes+float64(lossWrites))
	restarted := b.agentRestarts(t, n1, restarts)
	// The clocks are known within a second or so (clockOffset).
	window := [2]time.Time{killed.Add(-2 * time.Second), killed.Add(seen.zero + 2*time.Second)}
	expected, unexpected, attempted := splitFailures(t, tr.results(t), clocks, window)
	kept, broken := 0, 0
	for _, h := range holds {
		k, br := h.stop(t, "server-1")
		kept, broken, attempted = kept+k, broken+br, attempted+h.n
	}
	leaks := b.leaks(t)
	notes := fmt.Sprintf("%s's VM killed: Node not Ready after %s, server-2 unready %s, EndpointSlice %s; %s's real servers on %s's pods (%d) at weight 0 %s after the kill "+
		"(%s after the slice), gone %s after; %d connections failed to %s's endpoint between the kill and weight 0 (expected), %d held connections to server-1 kept, %d broken "+
		"(those to server-2 broke, as they must); reboot: %s Ready %s after the kill, its table converged %s after the reboot (%d writes for %d objects); "+
		"%s's writes: %d for the loss, %d for the return; restarts %d; %d Services",
		n2.Name, round(seen.nodeUnready), round(seen.podUnready), round(seen.sliceUnready), n1.Name, n2.Name, len(lost), round(seen.zero),
		round(seen.zero-seen.sliceUnready), round(seen.gone), expected, n2.Name, kept, broken,
		n2.Name, round(back.ready.Sub(killed)), round(back.converged), back.writes, back.objects,
		n1.Name, lossWrites, returnWrites, restarted, b.size)
	peaks.record(t, chaos.Row{Case: "nodes-node-lost", TrafficAttempted: attempted, TrafficFailed: unexpected + broken,
		KernelWrites: lossWrites + returnWrites, ConvergeSeconds: math.Round(back.converged.Seconds()*10) / 10, Leaks: leaks, Notes: notes})
}

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// serverPod is the live Service's pod name, as the apiserver has it now.
func (b *nodesBed) serverPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := b.fast.CoreV1().Pods(chaosNodesNS).Get(b.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ipvsTable is n's IPVS table, one read of /proc/net/ip_vs: `ipvsadm -Ln`
// dumps each virtual server apart, a thousand netlink requests that take
// seconds of the loaded VM and hold the IPVS lock beside the agent's
// writes.
func (b *nodesBed) ipvsTable(t *testing.T, n *cluster.Node) map[ktypes.VSKey][]ktypes.RealServer {
	t.Helper()
	table, err := readIPVSTable(b.ctx, n.VM)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return table
}

// readIPVSTable reads v's /proc/net/ip_vs and parses it as the agent does
// (netlinkutil.ParseProcTable).
func readIPVSTable(ctx context.Context, v *vm.VM) (map[ktypes.VSKey][]ktypes.RealServer, error) {
	out, err := v.RunOK(ctx, "cat", "/proc/net/ip_vs")
	if err != nil {
		return nil, err
	}
	table, err := netlinkutil.ParseProcTable(strings.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("parse /proc/net/ip_vs: %w", err)
	}
	return table, nil
}

// podCIDRServers are the real servers of an IPVS table whose address is
// in cidr ("PROTO VIP:PORT -> RIP:PORT"), with their weights.
func podCIDRServers(table map[ktypes.VSKey][]ktypes.RealServer, cidr string) map[string]int {
	pods := netip.MustParsePrefix(cidr)
	got := map[string]int{}
	for vs, rss := range table {
		for _, rs := range rss {
			if pods.Contains(rs.Address) {
				got[fmt.Sprintf("%s %s -> %s", vs.Protocol, netip.AddrPortFrom(vs.Address, vs.Port), rs.RSKey)] = int(rs.Weight)
			}
		}
	}
	return got
}

// unchangedBut fails the test if a virtual server of was that has no real
// server in cidr, there or in now, differs in now (gone, or its real
// servers changed).
func unchangedBut(t *testing.T, what string, was, now chaos.State, cidr string) {
	t.Helper()
	pods := netip.MustParsePrefix(cidr)
	var changed []string
	for vs, rss := range was.Virtual {
		if anyIn(rss, pods) || anyIn(now.Virtual[vs], pods) {
			continue
		}
		if got, ok := now.Virtual[vs]; !ok || strings.Join(got, ",") != strings.Join(rss, ",") {
			changed = append(changed, fmt.Sprintf("%s: %v -> %v", vs, rss, got))
		}
	}
	if len(changed) > 0 {
		t.Errorf("%s: %d virtual servers without real servers on %s changed: %s", what, len(changed), cidr, sample(changed))
	}
}

// anyIn reports whether an address of rss ("IP:PORT") is in pods.
func anyIn(rss []string, pods netip.Prefix) bool {
	for _, rs := range rss {
		if ap, err := netip.ParseAddrPort(rs); err == nil && pods.Contains(ap.Addr()) {
			return true
		}
	}
	return false
}

// lossSeen is when each sign of a node's loss was first seen, from the
// kill: the apiserver's (Node, pod, EndpointSlice) and node-1's IPVS
// (the lost node's real servers at weight 0, then none).
type lossSeen struct {
	nodeUnready, podUnready, sliceUnready, zero, gone time.Duration
}

// watchLoss polls the apiserver and n1's IPVS table until n1 holds no
// real server on lost's pods (within lossDrain of killed) and returns
// when each sign was first seen.
func (b *nodesBed) watchLoss(t *testing.T, n1, lost *cluster.Node, server *corev1.Pod, killed time.Time) lossSeen {
	t.Helper()
	var s lossSeen
	mark := func(d *time.Duration, ok bool) {
		if ok && *d == 0 {
			*d = time.Since(killed)
		}
	}
	waitWithin(b.ctx, t, lossDrain, n1.Name+" without "+lost.Name+"'s real servers", func() (bool, string) {
		mark(&s.nodeUnready, !b.nodeReady(t, lost))
		mark(&s.podUnready, !podReady(b.serverPod(t, server.Name)))
		mark(&s.sliceUnready, !b.endpointReady(t, server.Status.PodIP))
		rs := podCIDRServers(b.ipvsTable(t, n1), lost.PodCIDR)
		zero := true
		for _, w := range rs {
			zero = zero && w == 0
		}
		mark(&s.zero, zero)
		mark(&s.gone, len(rs) == 0)
		return s.gone > 0 && s.sliceUnready > 0, fmt.Sprintf("%+v; left %v", s, rs)
	})
	t.Logf("the loss of %s, from the kill: %+v", lost.Name, s)
	return s
}

// endpointReady reports whether the live Service's EndpointSlices list ip
// as a ready endpoint.
func (b *nodesBed) endpointReady(t *testing.T, ip string) bool {
	t.Helper()
	sl, err := b.fast.DiscoveryV1().EndpointSlices(chaosNodesNS).List(b.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + b.live.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sl.Items {
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) > 0 && ep.Addresses[0] == ip {
				return ptr.Deref(ep.Conditions.Ready, false)
			}
		}
	}
	return false
}

// returned is what the reboot of the lost node gave: when its Node was
// Ready, its server pod's address, how long its kernel took to hold what
// the Services want from the reboot's start, and its agent's writes
// against the kernel objects it then held.
type returned struct {
	ready           time.Time
	serverIP        string
	converged       time.Duration
	writes, objects int
}

// rebootLost boots n again, waits for its agent pod and its server pod,
// and for its kernel to hold what the Services want.
func (b *nodesBed) rebootLost(t *testing.T, n *cluster.Node, server *corev1.Pod) returned {
	t.Helper()
	began := time.Now()
	if err := b.c.RebootNode(b.ctx, n); err != nil {
		t.Fatal(err)
	}
	r := returned{ready: time.Now()}
	waitFor(b.ctx, t, n.Name+"'s agent pod Ready again", func() (bool, string) {
		p := ipvsProxyPod(b.ctx, t, b.c, n)
		return podReady(p), cluster.PodSummary(p)
	})
	waitFor(b.ctx, t, server.Name+" Ready again", func() (bool, string) {
		p := b.serverPod(t, server.Name)
		r.serverIP = p.Status.PodIP
		return podReady(p) && p.Status.PodIP != "", cluster.PodSummary(p)
	})
	_, d := convergeOn(t, n.VM, n.Name+": the Services after the reboot", b.expected(t, n), 5*time.Minute)
	r.converged = time.Since(began)
	st := readKernelState(t, n.VM)
	r.objects = len(st.Virtual) + len(st.Addrs) + len(st.Routes)
	for _, rss := range st.Virtual {
		r.objects += len(rss)
	}
	r.writes = int(b.writes(t, n))
	t.Logf("%s rebooted: Ready %s after the reboot's start, %s's address %s (was %s), kernel converged %s after (%d leaks), %d writes for %d IPVS objects, addresses and routes",
		n.Name, r.ready.Sub(began).Round(time.Millisecond), server.Name, r.serverIP, server.Status.PodIP, r.converged.Round(time.Millisecond), len(d.Leaks), r.writes, r.objects)
	if r.writes > r.objects {
		t.Errorf("%s's agent made %d writes to build a kernel of %d objects; want no more", n.Name, r.writes, r.objects)
	}
	return r
}

// followReturn waits until n1's IPVS has lost's server back at weight 1
// in the live Service's virtual servers, and returns n1's writes since
// was and writes were read (before the reboot); writes beyond the real
// servers that changed since fail the test.
func (b *nodesBed) followReturn(t *testing.T, n1, lost *cluster.Node, r returned, was chaos.State, writes float64) int {
	t.Helper()
	want := []string{b.clusterIP(), b.lbIP()}
	for _, a := range b.nodeAddrs(t, n1) {
		want = append(want, b.nodePort(a))
	}
	waitWithin(b.ctx, t, 2*time.Minute, n1.Name+" with "+r.serverIP+" back", func() (bool, string) {
		rs := podCIDRServers(b.ipvsTable(t, n1), lost.PodCIDR)
		for _, vs := range want {
			if w, ok := rs["TCP "+vs+" -> "+hostPort(r.serverIP, 8080)]; !ok || w != 1 {
				return false, fmt.Sprintf("%s: %v", vs, rs)
			}
		}
		return true, ""
	})
	now := readKernelState(t, n1.VM)
	unchangedBut(t, n1.Name+" after the return", was, now, lost.PodCIDR)
	changed := 0
	for vs, rss := range now.Virtual {
		missing, extra := lineDiff(was.Virtual[vs], rss)
		changed += len(missing) + len(extra)
	}
	got := int(b.writes(t, n1) - writes)
	if got > changed {
		t.Errorf("%s's agent made %d writes when %s's endpoints returned; %d real servers changed", n1.Name, got, lost.Name, changed)
	}
	return got
}

// heldSet is one `vmagent holds`: n held connections from source ports
// first on.
type heldSet struct {
	name  string
	p     *vm.Proc
	first int
	n     int
}

// heldConns is how many connections each heldSet holds.
const heldConns = 10

// heldSet holds heldConns connections from v to addr, each asking every
// second, once each has its first answer.
func (b *nodesBed) heldSet(t *testing.T, v *vm.VM, name, addr string, first int) *heldSet {
	t.Helper()
	return &heldSet{name: name, first: first, n: heldConns, p: holdConnections(b.ctx, t, v, addr, first, heldConns, time.Second)}
}

// stop ends the held connections and counts those answered by keep
// (kept whole, or broken: an error line); a broken one fails the test, and
// so does a set with none on keep.
func (h *heldSet) stop(t *testing.T, keep string) (kept, broken int) {
	t.Helper()
	if err := h.p.Stop(); err != nil {
		t.Fatal(err)
	}
	other := 0
	for port, out := range splitHolds(h.p.Output()) {
		pods := answeringPods(out)
		switch {
		case len(pods) == 0 || pods[0] != keep:
			other++
		case strings.Contains(out, "error "):
			broken++
			t.Errorf("%s: the held connection from port %d to %s broke: %s", h.name, port, keep, tailLines(out, 3))
		default:
			kept++
		}
	}
	t.Logf("%s: %d held connections to %s kept, %d broken; %d to the other endpoint", h.name, kept, keep, broken, other)
	if kept+broken == 0 {
		t.Errorf("%s: no held connection reached %s: nothing was shown", h.name, keep)
	}
	return kept, broken
}

// clockOffset is v's clock less the host's, within about half a second:
// busybox's `date +%s` in v (whole seconds: busybox has no %N), taken as
// the middle of its second, against the host's clock at the read's
// midpoint (0, logged, when it cannot be read).
func (b *nodesBed) clockOffset(t *testing.T, v *vm.VM) time.Duration {
	t.Helper()
	began := time.Now()
	out, err := v.RunOK(b.ctx, "date", "-u", "+%s")
	took := time.Since(began)
	secs, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || perr != nil {
		t.Logf("a VM's clock: %q, %v, %v: taken as the host's", out, err, perr)
		return 0
	}
	return time.Unix(secs, int64(time.Second/2)).Sub(began.Add(took / 2))
}

// vmClocks are the clocks of the streams' VMs less the host's: the
// outside host's (streams named outside-*) and the node's (the rest).
type vmClocks struct{ node, outside time.Duration }

// splitFailures sorts the streams' failed connections: those that began
// within one of windows (host clock) are expected; the others fail the
// test. It returns both counts and the attempts in all.
func splitFailures(t *testing.T, streams []streamResult, clocks vmClocks, windows ...[2]time.Time) (expected, unexpected, attempted int) {
	t.Helper()
	for _, s := range streams {
		attempted += s.res.Total() + len(s.failures)
		offset := clocks.node
		if strings.HasPrefix(s.name, "outside") {
			offset = clocks.outside
		}
		var odd []hitFailure
		for _, f := range s.failures {
			at := f.at.Add(-offset)
			if !slices.ContainsFunc(windows, func(w [2]time.Time) bool { return !at.Before(w[0]) && !at.After(w[1]) }) {
				odd = append(odd, f)
				continue
			}
			expected++
		}
		unexpected += len(odd)
		if len(odd) > 0 {
			t.Errorf("stream %s: %d connections failed outside the windows %s (host clock; the VM's is %s off): %v",
				s.name, len(odd), windowsString(windows), offset.Round(time.Millisecond), odd)
		}
	}
	return expected, unexpected, attempted
}

// windowsString renders windows as "15:04:05.0-15:04:05.0, ...".
func windowsString(windows [][2]time.Time) string {
	parts := make([]string, len(windows))
	for i, w := range windows {
		parts[i] = w[0].Format("15:04:05.0") + "-" + w[1].Format("15:04:05.0")
	}
	return strings.Join(parts, ", ")
}

// TestPodCIDRServers: the real servers in a pod range, by virtual server,
// with their weights, from the kernel's table; others and fwmark services
// left out.
func TestPodCIDRServers(t *testing.T) {
	proc := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr
  -> 0AF40005:1F90      Masq    1      0          3
  -> 0AF40107:1F90      Masq    0      2          40
UDP  0A60000A:0035 rr
  -> 0AF40109:0035      Masq    1      0          0
FWM  00000007 rr
  -> 0AF40108:0050      Masq    1      0          0
`
	table, err := netlinkutil.ParseProcTable(strings.NewReader(proc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"TCP 10.96.0.10:80 -> 10.244.1.7:8080": 0, "UDP 10.96.0.10:53 -> 10.244.1.9:53": 1}
	if got := podCIDRServers(table, "10.244.1.0/24"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("podCIDRServers = %v; want %v", got, want)
	}
}
