package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

const (
	// ecmpHolds is how many long-lived connections a phase holds.
	ecmpHolds = 64
	// ecmpHoldTimeout is each held connection's answer timeout: a flow
	// sent nowhere fails within it.
	ecmpHoldTimeout = 10 * time.Second
	ecmpNS          = "ecmp"
)

// ecmpLBIP is the LoadBalancer IP the outside host routes over the nodes.
var ecmpLBIP = cluster.SegmentAddr(220)

// TestDSRSurvivesRehash (make dsr-ecmp): ipvs-proxy with direct server
// return and --sloppy-tcp on three nodes; a LoadBalancer Service with
// ipvs-proxy.io/forwarding: tunnel and the mh scheduler (mh-fallback,
// mh-port), six pods, two a node. The outside host routes the
// LoadBalancer IP over the three nodes with an ECMP route hashed on ports
// (fib_multipath_hash_policy=1) and holds 64 connections, each from a
// source port of its own, each asking every 300 ms and told its pod's name.
// (a) The route's next hops are rotated: every flow enters another node
// (counted at the hub by the frames' destination MAC); none may break and
// none may change pod. (c) The control, the same with rr: flows that moved
// must break (most are scheduled to another pod, which resets them).
// (b) mh again; node-3 goes off the segment (its link down) and its next
// hop is dropped: the connections to pods on node-1 and node-2 must not
// break; those to node-3's pods are counted apart.
func TestDSRSurvivesRehash(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	b := startECMPBed(ctx, t)
	t.Logf("TIMING 3 nodes with ipvs-proxy (direct server return, sloppy_tcp) ready after %s", time.Since(began).Round(time.Millisecond))
	b.pods = b.runPods(t)
	b.createService(t)
	b.waitScheduler(t, "mh")
	n1, n2, n3 := b.c.Nodes[0].IP, b.c.Nodes[1].IP, b.c.Nodes[2].IP

	a := b.phase(t, "(a) mh, rehash", 41000, []string{n1, n2, n3}, func() { b.route(t, n2, n3, n1) })
	a.check(t, b, "")
	b.annotateScheduler(t, "rr")
	ctl := b.phase(t, "(c) control rr, rehash", 42000, []string{n1, n2, n3}, func() { b.route(t, n2, n3, n1) })
	if ctl.broken == 0 || ctl.moved == 0 {
		t.Errorf("control (rr): %d of %d moved flows broke; want breaks: the test cannot tell mh with sloppy_tcp from any scheduler", ctl.broken, ctl.moved)
	}
	b.annotateScheduler(t, "mh")
	lost := b.c.Nodes[2]
	f := b.phase(t, "(b) mh, "+lost.Name+" lost", 43000, []string{n1, n2, n3}, func() {
		if _, err := lost.VM.RunOK(ctx, "ip", "link", "set", cluster.SegmentIface, "down"); err != nil {
			t.Fatal(err)
		}
		b.route(t, n1, n2)
	})
	f.check(t, b, lost.Name)
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// ecmpBed is the test's cluster, its hub watch and its pods (by name).
type ecmpBed struct {
	ctx   context.Context
	c     *cluster.Cluster
	watch *ecmpWatch
	pods  map[string]*corev1.Pod
}

// startECMPBed starts three nodes and the outside host, ipvs-proxy with
// direct server return and sloppy_tcp, and the outside host's ECMP
// hashing on ports.
func startECMPBed(ctx context.Context, t *testing.T) *ecmpBed {
	t.Helper()
	c, err := cluster.Start(ctx, cluster.Options{Assets: vm.Require(t), Log: t.Logf, Nodes: 3, Outside: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The operator's part, as in TestDirectServerReturn: reverse-path
	// filtering off, ipip loaded by hand.
	for _, n := range c.Nodes {
		if _, err := n.VM.RunOK(ctx, "sh", "-c", "echo 0 >/proc/sys/net/ipv4/conf/all/rp_filter && modprobe ipip"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeployIPVSProxyEdited(ctx, deployDir, "directServerReturn:\n  enabled: false", "directServerReturn:\n  enabled: true",
		"sloppyTCP: false", "sloppyTCP: true"); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		waitFor(ctx, t, "net.ipv4.vs.sloppy_tcp=1 on "+n.Name, func() (bool, string) {
			out, err := n.VM.RunOK(ctx, "cat", "/proc/sys/net/ipv4/vs/sloppy_tcp")
			return err == nil && strings.TrimSpace(out) == "1", out + fmt.Sprint(err)
		})
	}
	if _, err := c.Outside.RunOK(ctx, "sh", "-c", "echo 1 >/proc/sys/net/ipv4/fib_multipath_hash_policy"); err != nil {
		t.Fatal(err)
	}
	w := newECMPWatch(c.Hub, ecmpLBIP)
	t.Cleanup(w.stop)
	clusterNamespace(ctx, t, c.Client, ecmpNS)
	return &ecmpBed{ctx: ctx, c: c, watch: w}
}

// runPods starts six backends, two on each node, and returns them once
// ready.
func (b *ecmpBed) runPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	var want []*corev1.Pod
	for i := range 6 {
		name := "ecmp-" + strconv.Itoa(i)
		p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080", "--tcp"})
		p.Spec.NodeName, p.Labels = b.c.Nodes[i%len(b.c.Nodes)].Name, map[string]string{"app": "ecmp"}
		p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
		want = append(want, p)
	}
	return runPods(b.ctx, t, b.c, ecmpNS, want...)
}

// createService creates the LoadBalancer Service "ecmp" (80 to the pods'
// 8080) at ecmpLBIP: tunnelled, mh with mh-fallback and mh-port.
func (b *ecmpBed) createService(t *testing.T) {
	t.Helper()
	obj := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ecmp", Annotations: map[string]string{model.AnnotationForwarding: "tunnel",
			scheduler.AnnotationScheduler: "mh", scheduler.AnnotationFlags: "mh-fallback,mh-port"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "ecmp"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	api := b.c.Client.CoreV1().Services(ecmpNS)
	created, err := api.Create(b.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ecmpLBIP}}
	if _, err := api.UpdateStatus(b.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// annotateScheduler sets the Service's scheduler and waits until every
// node's IPVS has it.
func (b *ecmpBed) annotateScheduler(t *testing.T, sched string) {
	t.Helper()
	flags := ""
	if sched == "mh" {
		flags = "mh-fallback,mh-port"
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q,%q:%q}}}`, scheduler.AnnotationScheduler, sched, scheduler.AnnotationFlags, flags)
	if _, err := b.c.Client.CoreV1().Services(ecmpNS).Patch(b.ctx, "ecmp", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitScheduler(t, sched)
}

// waitScheduler waits until every node's virtual server at ecmpLBIP:80
// has the scheduler sched and the six pods as real servers, those on
// other nodes tunnelled (a node's own pods keep NAT: DSR.md, step 3).
func (b *ecmpBed) waitScheduler(t *testing.T, sched string) {
	t.Helper()
	vs := ecmpLBIP + ":80"
	for _, n := range b.c.Nodes {
		remote := 0
		for _, p := range b.pods {
			if p.Spec.NodeName != n.Name {
				remote++
			}
		}
		waitWithin(b.ctx, t, 2*time.Minute, fmt.Sprintf("%s on %s: %s, %d real servers, %d tunnelled", vs, n.Name, sched, len(b.pods), remote), func() (bool, string) {
			out, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", vs)
			return err == nil && vsScheduler(out) == sched && strings.Count(out, ":8080 ") == len(b.pods) &&
				strings.Count(out, " Tunnel ") == remote, out + fmt.Sprint(err)
		})
	}
}

// vsScheduler is the scheduler of the virtual server `ipvsadm -Ln -t`
// printed ("TCP  VIP:PORT mh (mh-fallback,mh-port)", "TCP  VIP:PORT rr").
func vsScheduler(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "TCP" {
			return f[2]
		}
	}
	return ""
}

// route replaces the outside host's route to ecmpLBIP with one over the
// next hops via, in that order (Linux's hash-threshold ECMP gives each
// next hop a range of the flow hash in route order, so a rotation sends
// every flow to another node).
func (b *ecmpBed) route(t *testing.T, via ...string) {
	t.Helper()
	if out, err := b.c.Outside.RunOK(b.ctx, "vmagent", "ecmp-route", "--dst", ecmpLBIP+"/32", "--via", strings.Join(via, ","), "--dev", cluster.SegmentIface); err != nil {
		t.Fatalf("ecmp-route via %v: %v: %s", via, err, out)
	}
}

// ecmpPhase is what a phase saw.
type ecmpPhase struct {
	label string
	// holds: each held connection's output, by source port.
	holds map[int]string
	// before, after: each source port's ingress node (by MAC) before and
	// after the change.
	before, after map[int]string
	// moved: flows whose ingress node changed; broken: held connections
	// that failed, of them those that had moved.
	moved, broken, brokenMoved int
	// neverOpened: connections refused or timed out at the start.
	neverOpened int
}

// phase holds ecmpHolds connections (one `vmagent holds`) from source
// ports first.. through the route over initial, makes the change, waits
// past the holds' timeout, and counts.
func (b *ecmpBed) phase(t *testing.T, label string, first int, initial []string, change func()) *ecmpPhase {
	t.Helper()
	began := time.Now()
	b.route(t, initial...)
	p := startProc(b.ctx, t, b.c.Outside, "vmagent", "holds", "--addr", ecmpLBIP+":80", "--first", strconv.Itoa(first),
		"--n", strconv.Itoa(ecmpHolds), "--interval", "300ms", "--timeout", ecmpHoldTimeout.String())
	waitWithin(b.ctx, t, 2*time.Minute, fmt.Sprintf("phase %s: %d held connections answered", label, ecmpHolds), func() (bool, string) {
		holds := splitHolds(p.Output())
		for port := first; port < first+ecmpHolds; port++ {
			if !strings.Contains(holds[port], "answer 1 ") && !strings.Contains(holds[port], "error ") {
				return false, fmt.Sprintf("port %d: %q", port, holds[port])
			}
		}
		return true, ""
	})
	ph := &ecmpPhase{label: label}
	b.watch.reset()
	time.Sleep(3 * time.Second)
	ph.before = b.watch.snapshot()
	at := time.Now()
	change()
	time.Sleep(2 * time.Second)
	b.watch.reset()
	time.Sleep(ecmpHoldTimeout + 3*time.Second)
	ph.after = b.watch.snapshot()
	ph.holds = splitHolds(p.Output())
	_ = p.Stop()
	for port, out := range ph.holds {
		if !strings.Contains(out, "answer 1 ") {
			// Never opened: not a held connection (logged, and counted).
			t.Logf("phase %s: connection from port %d never opened: %q", label, port, lastLine(out))
			ph.neverOpened++
			delete(ph.holds, port)
		}
	}
	ph.count()
	b.logConnStates(t, label, first)
	t.Logf("TIMING phase %s: %s (change at +%s)", label, time.Since(began).Round(time.Millisecond), at.Sub(began).Round(time.Millisecond))
	t.Logf("phase %s: held %d (%d never opened); ingress before %v, after %v; moved ingress %d; broken %d (%d of them moved)",
		label, len(ph.holds), ph.neverOpened, b.byNode(ph.before), b.byNode(ph.after), ph.moved, ph.broken, ph.brokenMoved)
	if ph.broken > 0 {
		b.logState(t)
	}
	return ph
}

// count counts the phase's moved and broken flows.
func (ph *ecmpPhase) count() {
	for port, out := range ph.holds {
		was, now := ph.before[port], ph.after[port]
		moved := was != "" && now != "" && was != now
		if moved {
			ph.moved++
		}
		if strings.Contains(out, "error ") {
			ph.broken++
			if moved {
				ph.brokenMoved++
			}
		}
	}
}

// check wants no held connection broken and none that changed pod, but
// for those to a pod on the node lost (its name; "" none), counted apart.
func (ph *ecmpPhase) check(t *testing.T, b *ecmpBed, lost string) {
	t.Helper()
	var survivors, onLost, brokenOnLost, changed, brokenSurvivors int
	intoPodNode, outOfPodNode := ph.podNodeMoves(b)
	for port, out := range ph.holds {
		pods := answeringPods(out)
		if len(pods) > 1 {
			changed++
			t.Errorf("phase %s: connection from port %d answered by %v; want one pod", ph.label, port, pods)
		}
		broken := strings.Contains(out, "error ")
		if len(pods) > 0 && b.pods[pods[0]] != nil && b.pods[pods[0]].Spec.NodeName == lost {
			onLost++
			if broken {
				brokenOnLost++
			}
			continue
		}
		survivors++
		if broken {
			brokenSurvivors++
			t.Errorf("phase %s: connection from port %d (pod %v, ingress %s -> %s) broke: %q", ph.label, port, pods,
				ph.before[port], ph.after[port], lastLine(out))
		}
	}
	t.Logf("phase %s summary: %d held, %d moved ingress (%d into their pod's node, %d out of it); to surviving pods %d, broken %d; to pods on the lost node %d, broken %d; pod changed %d",
		ph.label, len(ph.holds), ph.moved, intoPodNode, outOfPodNode, survivors, brokenSurvivors, onLost, brokenOnLost, changed)
	if ph.moved == 0 {
		t.Errorf("phase %s: no flow moved to another ingress node: the change was no rehash", ph.label)
	}
}

// splitHolds splits the output of `vmagent holds` by source port.
func splitHolds(out string) map[int]string {
	holds := map[int]string{}
	for _, l := range strings.Split(out, "\n") {
		port, rest, ok := strings.Cut(l, " ")
		if p, err := strconv.Atoi(port); ok && err == nil {
			holds[p] += rest + "\n"
		}
	}
	return holds
}

// podNodeMoves counts the flows that moved into their pod's own node and
// out of it: there the pod is a NAT real server, elsewhere tunnelled.
func (ph *ecmpPhase) podNodeMoves(b *ecmpBed) (into, outOf int) {
	macs := map[string]string{}
	for i, n := range b.c.Nodes {
		macs[dsrMAC(11+i)] = n.Name
	}
	for port, out := range ph.holds {
		pods := answeringPods(out)
		if len(pods) == 0 || b.pods[pods[0]] == nil {
			continue
		}
		home := b.pods[pods[0]].Spec.NodeName
		was, now := macs[ph.before[port]], macs[ph.after[port]]
		if was != now && now == home {
			into++
		}
		if was != now && was == home {
			outOf++
		}
	}
	return into, outOf
}

// answeringPods lists the pods that answered a hold, in order of first
// answer ("answer N <pod> <client>").
func answeringPods(out string) []string {
	var pods []string
	seen := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "answer" && !seen[f[2]] {
			seen[f[2]] = true
			pods = append(pods, f[2])
		}
	}
	return pods
}

// byNode counts the flows of an ingress map by node name.
func (b *ecmpBed) byNode(m map[int]string) map[string]int {
	names := map[string]string{}
	for i, n := range b.c.Nodes {
		names[dsrMAC(11+i)] = n.Name
	}
	out := map[string]int{}
	for _, mac := range m {
		name := names[mac]
		if name == "" {
			name = mac
		}
		out[name]++
	}
	return out
}

// logConnStates logs, per node, the IPVS connections of a phase's source
// ports (from first) by state: a flow that moved has one on its new
// ingress node too, made from a packet that was not a SYN.
func (b *ecmpBed) logConnStates(t *testing.T, label string, first int) {
	t.Helper()
	for _, n := range b.c.Nodes {
		out, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Lnc")
		states := map[string]int{}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) < 6 || f[4] != ecmpLBIP+":80" {
				continue
			}
			if ap, err := netip.ParseAddrPort(f[3]); err == nil && int(ap.Port()) >= first && int(ap.Port()) < first+ecmpHolds {
				states[f[2]]++
			}
		}
		t.Logf("phase %s: %s's IPVS connections of the phase's ports by state: %v %v", label, n.Name, states, err)
	}
}

// logState logs each reachable node's IPVS connections to the
// LoadBalancer IP and its conntrack entries for port 80.
func (b *ecmpBed) logState(t *testing.T) {
	t.Helper()
	for _, n := range b.c.Nodes {
		out, err := n.VM.RunOK(b.ctx, "sh", "-c", "ipvsadm -Lnc | grep -c "+ecmpLBIP+"; ipvsadm -Lnc | grep "+ecmpLBIP+" | head -20; vmagent conntrack --port 80 | head -20")
		t.Logf("%s: IPVS connections to %s and conntrack (port 80): %v\n%s", n.Name, ecmpLBIP, err, out)
	}
}

// ecmpWatch records, from the hub, which MAC each TCP flow to the
// LoadBalancer IP was last sent to, by the client's source port.
type ecmpWatch struct {
	unwatch func()
	lbip    netip.Addr
	mu      sync.Mutex
	last    map[int]string
}

func newECMPWatch(h *vm.Hub, lbip string) *ecmpWatch {
	w := &ecmpWatch{lbip: netip.MustParseAddr(lbip), last: map[int]string{}}
	w.unwatch = h.Watch(w.frame)
	return w
}

func (w *ecmpWatch) stop() { w.unwatch() }

func (w *ecmpWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = map[int]string{}
}

func (w *ecmpWatch) snapshot() map[int]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.last)
}

func (w *ecmpWatch) frame(f []byte) {
	if len(f) < 34 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ihl < 20 || len(ip) < ihl+4 || ip[9] != 6 || netip.AddrFrom4([4]byte(ip[16:20])) != w.lbip {
		return
	}
	sport := int(binary.BigEndian.Uint16(ip[ihl : ihl+2]))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last[sport] = macString(f[0:6])
}
