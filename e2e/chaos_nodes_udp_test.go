package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Issue 45's case 7, UDP under load: the bounds and the shape of it.
const (
	// udpBound is how long after the EndpointSlice names the new backend
	// upstream's "Conntrack should be able to preserve UDP traffic when
	// server pod cycles" waits for the client's answer from it.
	udpBound = time.Minute
	// udpCycles is how many times the echo Service's pod is replaced.
	udpCycles = 3
	// udpSourcePort is the echo clients' one source port (upstream's nc
	// -p 12345): every query is the same UDP flow.
	udpSourcePort = 12345
	// stallMargin: a lost query that began this close to a gap of a
	// node's clock (host time) is charged to the stall.
	stallMargin = 6 * time.Second
)

// udpLoad is issue 45's case 7. A UDP echo Service (ClusterIP, one pod)
// and the cluster's DNS, asked from a pod on each node every 500 ms: the
// echo from one source port (upstream's client), DNS from a new one each
// query (a stub resolver), with a 5 s timeout; meanwhile both VMs run two
// busy loops each (their two vCPUs) and the bulk Services' EndpointSlices
// change every 500 ms (both agents sync all the time), and the echo's pod
// is replaced udpCycles times as upstream's test does (the new pod
// Ready, then the old deleted), alternating nodes. A watch (vipWatch)
// samples both Services' ready endpoints and each node's real servers
// every 2 s; each lost query is charged to what it met (udpLosses): no
// ready endpoint, the node's IPVS behind the slice, a gap in a node's
// clock (`vmagent ticks`), or nothing of these. Asserted, as a user
// would check: each client's first answer from each new backend within
// udpBound of the EndpointSlice naming it, no answer from a backend after
// its real server left the client's node, every DNS answer the
// kubernetes Service's address, no node's IPVS behind a slice for longer
// than udpBound, and no conntrack entry of the echo's flows left naming a
// deleted backend.
func (b *nodesBed) udpLoad(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	began := time.Now()
	echo := b.udpEchoService(t)
	vip := netip.MustParseAddr(echo.Spec.ClusterIP)
	old := b.udpServer(t, "udp-1", b.c.Nodes[1], vip)
	clocks := map[string]time.Duration{}
	for _, n := range b.c.Nodes {
		clocks[n.Name] = b.clockOffset(t, n.VM)
	}
	tr := b.udpClients(t, echo)
	watch := b.watchVIPs(watchedVIP{chaosNodesNS, "udp-echo", ktypes.VSKey{Address: vip, Protocol: ktypes.UDP, Port: 80}},
		watchedVIP{metav1.NamespaceSystem, "kube-dns", ktypes.VSKey{Address: netip.MustParseAddr(cluster.DNSServiceIP), Protocol: ktypes.UDP, Port: 53}})
	time.Sleep(10 * time.Second) // answers from udp-1 before the load
	load := b.startLoad(t)
	var cycles []udpCycle
	for i := 2; i <= udpCycles+1; i++ {
		next := b.udpServer(t, fmt.Sprintf("udp-%d", i), b.c.Nodes[i%2], vip)
		cycles = append(cycles, b.cycle(t, vip, old, next))
		old = next
	}
	time.Sleep(10 * time.Second) // answers from the last one
	stalls, loadNotes := load.stop(t)
	watch.stop(t)
	streams := tr.results(t)
	losses := b.judgeUDP(t, streams, cycles, watch, stalls, clocks)
	probes := b.probeFailures(t, began)
	b.agentSyncs(t, began)
	leaks := b.leaks(t)
	attempted := 0
	for _, s := range streams {
		attempted += s.res.Total() + len(s.failures)
	}
	notes := fmt.Sprintf("%d pod cycles of the UDP echo Service (one source port) and DNS asked every 500 ms from a pod on each node, "+
		"2 busy loops in each VM, %d bulk EndpointSlice changes; lost: %v; VM stalls: %s; kubelet probe failures %d; %s; %s; %d Services",
		len(cycles), load.churned, losses, loadNotes, probes, cyclesString(cycles), watch, b.size)
	peaks.record(t, chaos.Row{Case: "nodes-udp-load", TrafficAttempted: attempted, TrafficFailed: losses.total(),
		ConvergeSeconds: slowestCycle(cycles), Leaks: leaks, Notes: notes})
}

// udpEchoService creates the echo Service: ClusterIP, UDP 80 to 8080 of
// the pods labelled app=udp-echo.
func (b *nodesBed) udpEchoService(t *testing.T) *corev1.Service {
	t.Helper()
	svc, err := b.c.Client.CoreV1().Services(chaosNodesNS).Create(b.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "udp-echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "udp-echo"},
			Ports: []corev1.ServicePort{{Name: "udp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolUDP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// udpServer runs the echo's pod name on n (`vmagent serve`, UDP and TCP:
// kubelet probes its TCP port) and waits until it is Ready and a real
// server of vip:80 on both nodes; it returns the pod.
func (b *nodesBed) udpServer(t *testing.T, name string, n *cluster.Node, vip netip.Addr) *corev1.Pod {
	t.Helper()
	p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080"})
	p.Labels = map[string]string{"app": "udp-echo"}
	p.Spec.NodeName = n.Name
	p.Spec.Containers[0].Resources = burstable("200m")
	p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
	pod := runPods(b.ctx, t, b.c, chaosNodesNS, p)[name]
	ip := netip.MustParseAddr(pod.Status.PodIP)
	for _, node := range b.c.Nodes {
		waitFor(b.ctx, t, fmt.Sprintf("%s a real server of UDP %s:80 on %s", name, vip, node.Name), func() (bool, string) {
			rss := b.udpRealServers(t, node, vip)
			return slices.Contains(rss, ip), fmt.Sprint(rss)
		})
	}
	return pod
}

// udpRealServers are the real servers' addresses of UDP vip:80 on n.
func (b *nodesBed) udpRealServers(t *testing.T, n *cluster.Node, vip netip.Addr) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, rs := range b.ipvsTable(t, n)[ktypes.VSKey{Address: vip, Protocol: ktypes.UDP, Port: 80}] {
		out = append(out, rs.Address)
	}
	return out
}

// udpClients starts a pod on each node asking the echo Service from
// udpSourcePort and the cluster's DNS for the kubernetes Service, each
// every 500 ms with a 5 s timeout (upstream's nc -w 5).
func (b *nodesBed) udpClients(t *testing.T, echo *corev1.Service) *nodesTraffic {
	t.Helper()
	tr := &nodesTraffic{b: b, procs: map[string]*vm.Proc{}}
	for i, n := range b.c.Nodes {
		name := fmt.Sprintf("udp-client-%d", i+1)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName: n.Name, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](1)}}
		for _, c := range []struct{ name, argv string }{
			{"echo", fmt.Sprintf("/vmagent hit --proto udp --source-port %d --addr %s --n 1000000 --interval 500ms --timeout 5s",
				udpSourcePort, hostPort(echo.Spec.ClusterIP, 80))},
			{"dns", fmt.Sprintf("/vmagent dns --server %s --name kubernetes.default.svc.%s. --n 1000000 --interval 500ms --timeout 5s",
				hostPort(cluster.DNSServiceIP, 53), cluster.ClusterDomain)},
		} {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c.name, Image: cluster.ServerImage,
				ImagePullPolicy: corev1.PullIfNotPresent, Command: strings.Fields(c.argv), Resources: burstable("50m")})
		}
		runPods(b.ctx, t, b.c, chaosNodesNS, p)
		tr.pods = append(tr.pods, name)
	}
	return tr
}

// nodesLoad is the case's load: busy loops and a clock watch in each VM,
// and the churn of the bulk EndpointSlices.
type nodesLoad struct {
	b       *nodesBed
	busy    []*vm.Proc
	ticks   map[string]*vm.Proc
	done    chan struct{}
	wg      sync.WaitGroup
	churned int
}

// startLoad starts two busy loops and `vmagent ticks` in each VM, and a
// change of a random bulk Service's EndpointSlice every 500 ms.
func (b *nodesBed) startLoad(t *testing.T) *nodesLoad {
	t.Helper()
	l := &nodesLoad{b: b, ticks: map[string]*vm.Proc{}, done: make(chan struct{})}
	for _, n := range b.c.Nodes {
		l.ticks[n.Name] = startProc(b.ctx, t, n.VM, "vmagent", "ticks", "--every", "100ms", "--gap", "1s")
		for range 2 {
			l.busy = append(l.busy, startProc(b.ctx, t, n.VM, "sh", "-c", "while :; do :; done"))
		}
	}
	l.wg.Add(1)
	go l.churn(t)
	return l
}

// churn gives a random bulk Service new endpoints every 500 ms until
// stopped.
func (l *nodesLoad) churn(t *testing.T) {
	defer l.wg.Done()
	api := l.b.fast.DiscoveryV1().EndpointSlices(chaosNodesBulkNS)
	for round := 1; ; round++ {
		select {
		case <-l.done:
			return
		case <-time.After(500 * time.Millisecond):
		}
		i := rand.IntN(l.b.size)
		s, err := api.Get(l.b.ctx, fmt.Sprintf("bulk-%d-ipv4", i), metav1.GetOptions{})
		if err != nil {
			t.Logf("churn: %v", err)
			continue
		}
		s.Endpoints = slice(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, fakeEndpoints(i+l.b.size*round, 2)).Endpoints
		if _, err := api.Update(l.b.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Logf("churn: %v", err)
			continue
		}
		l.churned++
	}
}

// vmGap is a gap of a node's clock, on the host's clock.
type vmGap struct {
	node string
	at   time.Time
	gap  time.Duration
}

// stop ends the load and returns the nodes' clock gaps (host time) and
// what the clock watches saw.
func (l *nodesLoad) stop(t *testing.T) ([]vmGap, string) {
	t.Helper()
	for _, n := range l.b.c.Nodes {
		t.Logf("%s: threads under the load, by command (threads, processes, command): %s", n.Name, l.b.threadCensus(n))
	}
	close(l.done)
	l.wg.Wait()
	for _, p := range l.busy {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	}
	var gaps []vmGap
	var notes []string
	for _, n := range l.b.c.Nodes {
		if err := l.ticks[n.Name].Stop(); err != nil {
			t.Fatal(err)
		}
		var res struct {
			Ticks   int           `json:"ticks"`
			Longest time.Duration `json:"longest"`
			LoadAvg string        `json:"loadavg"`
			Gaps    []struct {
				At  time.Time     `json:"at"`
				Gap time.Duration `json:"gap"`
			} `json:"gaps"`
		}
		if err := json.Unmarshal([]byte(lastLine(l.ticks[n.Name].Output())), &res); err != nil {
			t.Fatalf("%s: ticks: %v: %q", n.Name, err, l.ticks[n.Name].Output())
		}
		offset := l.b.clockOffset(t, n.VM)
		var total time.Duration
		for _, g := range res.Gaps {
			gaps = append(gaps, vmGap{n.Name, g.At.Add(-offset), g.Gap})
			total += g.Gap
		}
		notes = append(notes, fmt.Sprintf("%s %d gaps over 1 s (%s in all, longest %s), load average %s",
			n.Name, len(res.Gaps), total.Round(100*time.Millisecond), res.Longest.Round(100*time.Millisecond), res.LoadAvg))
		t.Logf("%s: clock gaps over 1 s: %v", n.Name, res.Gaps)
	}
	return gaps, strings.Join(notes, "; ")
}

// censusScript counts a node's threads by command (each process's Name
// and Threads from /proc), the most first: what makes up the thread
// count of its load average (477 on node-1 against node-2's 377 in
// f327c19's run at 5,000, not explained then).
const censusScript = `cat /proc/[0-9]*/status 2>/dev/null | awk '/^Name:/ {n = $2} /^Threads:/ {t[n] += $2; p[n]++; all += $2; np++}
END {for (k in t) print t[k], p[k], k; print all, np, "(all)"}' | sort -rn | head -16 | tr '\n' ';'`

// threadCensus is n's threads by command (censusScript), or why not.
func (b *nodesBed) threadCensus(n *cluster.Node) string {
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	out, err := n.VM.RunOK(ctx, "sh", "-c", censusScript)
	if err != nil {
		return fmt.Sprintf("not read: %v", err)
	}
	return strings.TrimSpace(out)
}

// udpCycle is one replacement of the echo's pod, on the host's clock:
// the old pod's deletion, the EndpointSlice naming only the new one, and
// each node's IPVS holding only the new one.
type udpCycle struct {
	old, next  *corev1.Pod
	deleted    time.Time
	slice      time.Time
	programmed map[string]time.Time
}

// cycle deletes old (next is Ready and served already) and follows the
// EndpointSlice and both nodes' IPVS until only next is left; 20 s later
// it checks that no conntrack entry of the echo's flows names old.
func (b *nodesBed) cycle(t *testing.T, vip netip.Addr, old, next *corev1.Pod) udpCycle {
	t.Helper()
	c := udpCycle{old: old, next: next, deleted: time.Now(), programmed: map[string]time.Time{}}
	if err := b.c.Client.CoreV1().Pods(chaosNodesNS).Delete(b.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr(next.Status.PodIP)}
	waitWithin(b.ctx, t, 3*time.Minute, "only "+next.Name+" in the slice and both nodes' IPVS", func() (bool, string) {
		now := time.Now()
		ready, err := readyAddrs(b.ctx, b, chaosNodesNS, "udp-echo")
		if err != nil {
			t.Fatal(err)
		}
		if c.slice.IsZero() && slices.Equal(ready, want) {
			c.slice = now
		}
		var state []string
		for _, n := range b.c.Nodes {
			rss := b.udpRealServers(t, n, vip)
			if _, ok := c.programmed[n.Name]; !ok && slices.Equal(rss, want) {
				c.programmed[n.Name] = now
			}
			state = append(state, fmt.Sprintf("%s %v", n.Name, rss))
		}
		return !c.slice.IsZero() && len(c.programmed) == len(b.c.Nodes), strings.Join(state, "; ")
	})
	t.Logf("cycle %s -> %s: %s", old.Name, next.Name, c)
	time.Sleep(20 * time.Second)
	for _, n := range b.c.Nodes {
		b.staleEntries(t, n, vip, netip.MustParseAddr(old.Status.PodIP))
	}
	return c
}

func (c udpCycle) String() string {
	s := fmt.Sprintf("%s->%s: slice %s after the delete", c.old.Name, c.next.Name, round(c.slice.Sub(c.deleted)))
	for _, n := range slices.Sorted(maps.Keys(c.programmed)) {
		s += fmt.Sprintf(", %s IPVS %s", n, round(c.programmed[n].Sub(c.deleted)))
	}
	return s
}

// staleEntries fails the test for a conntrack entry on n of a UDP flow to
// vip:80 answered by gone (the agent clears them as it deletes the real
// server), and logs IPVS's own connections to gone (/proc/net/ip_vs_conn:
// they end at their next packet, expire_nodest_conn).
func (b *nodesBed) staleEntries(t *testing.T, n *cluster.Node, vip, gone netip.Addr) {
	t.Helper()
	out, err := n.VM.RunOK(b.ctx, "vmagent", "conntrack", "--port", "80")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	var stale []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "udp") && strings.Contains(l, "dst="+vip.String()) && strings.Contains(l, "src="+gone.String()+" ") {
			stale = append(stale, l)
		}
	}
	if len(stale) > 0 {
		t.Errorf("%s: %d conntrack entries of UDP %s:80 still name the deleted backend %s: %v", n.Name, len(stale), vip, gone, stale)
	}
	conns, err := n.VM.RunOK(b.ctx, "cat", "/proc/net/ip_vs_conn")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	a := gone.As4()
	hex := fmt.Sprintf("%02X%02X%02X%02X", a[0], a[1], a[2], a[3])
	var ipvs []string
	for _, l := range strings.Split(conns, "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[0] == "UDP" && f[5] == hex {
			ipvs = append(ipvs, l)
		}
	}
	t.Logf("%s: conntrack entries of UDP %s:80 naming %s: %d; IPVS connections to it: %d %v", n.Name, vip, gone, len(stale), len(ipvs), ipvs)
}

// udpLosses counts the lost queries by cause: the Service had no ready
// endpoint (unready), the client's node's IPVS differed from the
// EndpointSlice (behind: the agent's lag), the VM stood still (stall),
// or none of these (other: the kernel was right and the VM ran; the
// server or the client too starved to answer or wait).
type udpLosses struct{ unready, behind, stall, other int }

func (l udpLosses) total() int { return l.unready + l.behind + l.stall + l.other }

func (l *udpLosses) add(o udpLosses) {
	l.unready, l.behind, l.stall, l.other = l.unready+o.unready, l.behind+o.behind, l.stall+o.stall, l.other+o.other
}

func (l udpLosses) String() string {
	return fmt.Sprintf("%d (%d with no ready endpoint, %d with the node's IPVS behind the EndpointSlice, %d in a VM stall, %d other)",
		l.total(), l.unready, l.behind, l.stall, l.other)
}

// judgeUDP checks the clients' streams against the cycles (see udpLoad)
// and counts their losses by cause; clocks are the nodes' clocks less the
// host's.
func (b *nodesBed) judgeUDP(t *testing.T, streams []streamResult, cycles []udpCycle, w *vipWatch, stalls []vmGap, clocks map[string]time.Duration) udpLosses {
	t.Helper()
	var all udpLosses
	for _, s := range streams {
		pod, kind, _ := strings.Cut(s.name, "/")
		var node string
		for i, n := range b.c.Nodes {
			if pod == fmt.Sprintf("udp-client-%d", i+1) {
				node = n.Name
			}
		}
		offset := clocks[node]
		hostAt := func(d time.Duration) time.Time { return s.res.Started.Add(d).Add(-offset) }
		if kind == "echo" {
			b.judgeEcho(t, s, node, cycles, hostAt)
		} else {
			b.judgeDNS(t, s)
		}
		svc := "udp-echo"
		if kind == "dns" {
			svc = "kube-dns"
		}
		var l udpLosses
		for _, f := range s.failures {
			at := f.at.Add(-offset)
			switch w.cause(at, node, svc) {
			case "unready":
				l.unready++
			case "behind":
				l.behind++
			default:
				if nearStall(at, stalls) {
					l.stall++
				} else {
					l.other++
				}
			}
		}
		t.Logf("stream %s: lost %s", s.name, l)
		all.add(l)
	}
	return all
}

// judgeEcho fails the test unless, for each cycle, the stream's first
// answer from the new backend came within udpBound of the EndpointSlice
// naming it, and no answer from the old one began after its real server
// left node's IPVS.
func (b *nodesBed) judgeEcho(t *testing.T, s streamResult, node string, cycles []udpCycle, hostAt func(time.Duration) time.Time) {
	t.Helper()
	for _, c := range cycles {
		first, ok := s.res.FirstAt[c.next.Name]
		if !ok {
			t.Errorf("stream %s: no answer from %s at all (its cycle: %s)", s.name, c.next.Name, c)
			continue
		}
		if took := hostAt(first).Sub(c.slice); took > udpBound {
			t.Errorf("stream %s: first answer from %s %s after the EndpointSlice named it; want within %s (upstream's bound)",
				s.name, c.next.Name, round(took), udpBound)
		}
		if last, ok := s.res.LastAt[c.old.Name]; ok && hostAt(last).After(c.programmed[node].Add(2*time.Second)) {
			t.Errorf("stream %s: %s answered at %s, after its real server left %s (%s)", s.name, c.old.Name,
				hostAt(last).Format("15:04:05.000"), node, c.programmed[node].Format("15:04:05.000"))
		}
		t.Logf("stream %s: %s first answered %s after the EndpointSlice named it", s.name, c.next.Name, round(hostAt(first).Sub(c.slice)))
	}
}

// judgeDNS fails the test for a DNS answer other than the kubernetes
// Service's address.
func (b *nodesBed) judgeDNS(t *testing.T, s streamResult) {
	t.Helper()
	k, err := b.c.Client.CoreV1().Services(metav1.NamespaceDefault).Get(b.ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for answer, n := range s.res.Answers {
		if answer != k.Spec.ClusterIP {
			t.Errorf("stream %s: %d answers %q; want %s, the kubernetes Service's address", s.name, n, answer, k.Spec.ClusterIP)
		}
	}
}

// nearStall reports whether at is within stallMargin of a node's clock
// gap (which ends gap after it began).
func nearStall(at time.Time, stalls []vmGap) bool {
	return slices.ContainsFunc(stalls, func(g vmGap) bool {
		return at.After(g.at.Add(-stallMargin)) && at.Before(g.at.Add(g.gap+stallMargin))
	})
}

// cyclesString is the cycles' timings, for the row's notes.
func cyclesString(cycles []udpCycle) string {
	parts := make([]string, len(cycles))
	for i, c := range cycles {
		parts[i] = c.String()
	}
	return "cycles: " + strings.Join(parts, "; ")
}

// slowestCycle is the longest time from a delete to the last node's IPVS
// holding only the new backend, in seconds.
func slowestCycle(cycles []udpCycle) float64 {
	var slowest time.Duration
	for _, c := range cycles {
		for _, at := range c.programmed {
			slowest = max(slowest, at.Sub(c.deleted))
		}
	}
	return seconds(slowest)
}

// probeFailures logs and counts kubelet's probe failures (Unhealthy
// Events) in every namespace since since: the nodes too slow for their
// own probes.
func (b *nodesBed) probeFailures(t *testing.T, since time.Time) int {
	t.Helper()
	list, err := b.c.Client.CoreV1().Events(metav1.NamespaceAll).List(b.ctx, metav1.ListOptions{FieldSelector: "reason=Unhealthy"})
	if err != nil {
		t.Logf("Unhealthy Events: %v", err)
		return 0
	}
	n := 0
	for _, e := range list.Items {
		if e.LastTimestamp.Time.Before(since.Add(-time.Second)) {
			continue
		}
		n += int(e.Count)
		t.Logf("probe failure: %s/%s x%d, last %s: %s", e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Count, e.LastTimestamp.Format("15:04:05"), e.Message)
	}
	return n
}

// agentSyncs logs each agent's syncs since since that took a second or
// more (logged at info) and its conntrack warnings: what the agent did
// while the echo's pods cycled.
func (b *nodesBed) agentSyncs(t *testing.T, since time.Time) {
	t.Helper()
	for _, n := range b.c.Nodes {
		p := ipvsProxyPod(b.ctx, t, b.c, n)
		raw, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).GetLogs(p.Name, &corev1.PodLogOptions{
			Container: p.Spec.Containers[0].Name, SinceTime: &metav1.Time{Time: since}}).DoRaw(b.ctx)
		if err != nil {
			t.Logf("%s: the agent's log: %v", n.Name, err)
			continue
		}
		var warnings []string
		var syncs []timedLine // the syncs logged (a second or more), longest first below
		for _, l := range strings.Split(string(raw), "\n") {
			var line struct {
				Msg   string  `json:"msg"`
				Level string  `json:"level"`
				Took  float64 `json:"took"`
			}
			if json.Unmarshal([]byte(l), &line) != nil {
				continue
			}
			if line.Msg == "synced" {
				syncs = append(syncs, timedLine{line.Took, l})
			}
			if line.Level == "warn" || line.Level == "error" {
				warnings = append(warnings, l)
			}
		}
		slices.SortStableFunc(syncs, func(a, b timedLine) int { return cmp.Compare(b.took, a.took) })
		var longest float64
		if len(syncs) > 0 {
			longest = syncs[0].took
		}
		t.Logf("%s: the agent's syncs of a second or more during the case: %d, the longest %.1f s; warnings and errors %d: %s",
			n.Name, len(syncs), longest, len(warnings), sample(warnings))
		// What the longest were (their kind, Services, writes and the
		// time of each part): what a change waited behind.
		for _, s := range syncs[:min(len(syncs), 3)] {
			t.Logf("%s: a long sync: %s", n.Name, s.line)
		}
	}
}

// timedLine is an agent's log line and the time it reports (took).
type timedLine struct {
	took float64
	line string
}
