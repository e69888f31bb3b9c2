package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// The hash test's addresses on the segment: the Service's LoadBalancer IP
// and the control's virtual server, which the test programs by hand.
var (
	hashLBIP      = cluster.SegmentAddr(210)
	hashControlIP = cluster.SegmentAddr(211)
)

const (
	// hashPorts source ports from hashFirstPort, one connection each,
	// per node and round.
	hashPorts     = 1000
	hashFirstPort = 40000
	// hashReuse: a connection closed with a reset leaves an IPVS entry
	// (CLOSE, 10 s) that a new connection from the same source port to
	// the same node and address would reuse, with its real server;
	// a node is asked again only after this long.
	hashReuse = 12 * time.Second
	// hashControlIface holds the control's address: not the agent's
	// interface, so the agent leaves its virtual server alone.
	hashControlIface = "hashctl0"
)

// TestHashSchedulersAgreeAcrossNodes: a LoadBalancer Service with the mh
// scheduler (mh-fallback, mh-port) and externalTrafficPolicy Cluster on a
// cluster of three nodes, its endpoints five pods spread over them and
// listed in an EndpointSlice the test writes. The outside host routes the
// LoadBalancer IP to one node at a time, as a router would after a
// rehash or a node failure, and opens one connection from each of 1,000
// source ports: each answer names its pod. Every node maps every port to
// the same pod (i) at first, with four endpoints; (ii) after one node's
// agent restarts; (iii) after another node's agent restarts with the
// node's IPVS table flushed (the bed cannot reboot a node; this is what a
// reboot leaves: an agent that programs every real server from scratch);
// (iv) after the fifth pod, the one whose address sorts first, joins the
// slice: then about a fifth of the ports move, and only to it. The
// control: the same five pods behind a virtual server programmed by hand
// on each node in another order, as the kernel keeps them after another
// history (the behaviour before the agent kept one order): the nodes'
// maps disagree; the one programmed in the agent's order maps as the
// agent's table.
func TestHashSchedulersAgreeAcrossNodes(t *testing.T) {
	assets := vm.Require(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Assets: assets, Log: t.Logf, Nodes: 3, Outside: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeployIPVSProxyShipped(ctx, deployDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING 3 nodes with ipvs-proxy ready after %s", time.Since(began).Round(time.Millisecond))
	b := &hashBed{ctx: ctx, c: c, ns: "hash", lastUse: map[string]time.Time{}}
	clusterNamespace(ctx, t, c.Client, b.ns)
	pods := b.runPods(t)
	b.createService(t)
	b.writeSlice(t, pods[1:])
	b.waitRealServers(t, c.Nodes, pods[1:])

	initial := b.agreeingRound(t, "(a) 4 endpoints")
	b.restartAgent(t, c.Nodes[1], false, pods[1:])
	b.sameAs(t, "(b) after "+c.Nodes[1].Name+"'s agent restarted", initial, b.agreeingRound(t, "(b) agent restarted"))
	b.restartAgent(t, c.Nodes[2], true, pods[1:])
	b.sameAs(t, "(c) after "+c.Nodes[2].Name+"'s agent restarted on a flushed table", initial, b.agreeingRound(t, "(c) table flushed"))

	b.writeSlice(t, pods)
	b.waitRealServers(t, c.Nodes, pods)
	scaled := b.agreeingRound(t, "(d) 5 endpoints")
	b.movedToNew(t, initial, scaled, pods[0].Name)

	b.control(t, pods, scaled)
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// hashBed is the hash test's cluster and what it keeps between rounds.
type hashBed struct {
	ctx context.Context
	c   *cluster.Cluster
	ns  string
	// lastUse: when the source ports were last used through a node
	// (by node name and address).
	lastUse map[string]time.Time
}

// portMap is which pod answered each source port.
type portMap map[int]string

// runPods starts the five backends, spread over the nodes, and returns
// them once ready, ascending by address: the agent's order.
func (b *hashBed) runPods(t *testing.T) []*corev1.Pod {
	t.Helper()
	var want []*corev1.Pod
	for i := range 5 {
		name := "hash-" + strconv.Itoa(i)
		p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080", "--tcp"})
		p.Spec.NodeName = b.c.Nodes[i%len(b.c.Nodes)].Name
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
			PeriodSeconds: 1,
		}
		want = append(want, p)
	}
	running := runPods(b.ctx, t, b.c, b.ns, want...)
	var pods []*corev1.Pod
	for _, p := range want {
		waitFor(b.ctx, t, "pod "+p.Name+" ready", func() (bool, string) {
			got, err := b.c.Client.CoreV1().Pods(b.ns).Get(b.ctx, p.Name, metav1.GetOptions{})
			return err == nil && podReady(got), fmt.Sprint(err)
		})
		pods = append(pods, running[p.Name])
	}
	slices.SortFunc(pods, func(x, y *corev1.Pod) int {
		return netip.MustParseAddr(x.Status.PodIP).Compare(netip.MustParseAddr(y.Status.PodIP))
	})
	for _, p := range pods {
		t.Logf("backend %s %s on %s", p.Name, p.Status.PodIP, p.Spec.NodeName)
	}
	return pods
}

// podReady reports whether p's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// createService creates the selectorless LoadBalancer Service "hash-lb"
// (mh, mh-fallback and mh-port; policy Cluster) with hashLBIP as its
// ingress.
func (b *hashBed) createService(t *testing.T) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hash-lb", Annotations: map[string]string{
			scheduler.AnnotationScheduler: "mh", scheduler.AnnotationFlags: "mh-fallback,mh-port"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	svcs := b.c.Client.CoreV1().Services(b.ns)
	created, err := svcs.Create(b.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: hashLBIP}}
	if _, err := svcs.UpdateStatus(b.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeSlice makes the Service's only EndpointSlice list pods, ready.
func (b *hashBed) writeSlice(t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "hash-lb", Labels: map[string]string{
			discoveryv1.LabelServiceName: "hash-lb", discoveryv1.LabelManagedBy: "e2e.ipvs-proxy.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for _, p := range pods {
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(p.Spec.NodeName)})
	}
	api := b.c.Client.DiscoveryV1().EndpointSlices(b.ns)
	old, err := api.Get(b.ctx, eps.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(b.ctx, eps, metav1.CreateOptions{})
	case err == nil:
		eps.ResourceVersion = old.ResourceVersion
		_, err = api.Update(b.ctx, eps, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("EndpointSlice hash-lb: %d endpoints", len(pods))
}

// waitRealServers waits until each node's virtual server hashLBIP:80
// holds exactly pods' addresses, and logs its list.
func (b *hashBed) waitRealServers(t *testing.T, nodes []*cluster.Node, pods []*corev1.Pod) {
	t.Helper()
	want := map[string]int{}
	for _, p := range pods {
		want[p.Status.PodIP] = 1
	}
	for _, n := range nodes {
		var out string
		waitFor(b.ctx, t, fmt.Sprintf("%s:80 with %d real servers on %s", hashLBIP, len(pods), n.Name), func() (bool, string) {
			var err error
			out, err = n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", hashLBIP+":80")
			got := ipvsWeights(out)
			return err == nil && len(got) == len(want) && weightsMatch(got, want), out + fmt.Sprint(err)
		})
		t.Logf("%s: ipvsadm -Ln -t %s:80:\n%s", n.Name, hashLBIP, out)
	}
}

// agreeingRound is a round through the agent's LoadBalancer IP whose
// maps must agree on every port answered through both nodes.
func (b *hashBed) agreeingRound(t *testing.T, label string) []portMap {
	t.Helper()
	got := b.round(t, label, hashLBIP)
	for _, pr := range b.pairs(got) {
		t.Logf("round %s: %s", label, pr)
		if pr.same != pr.both {
			t.Errorf("round %s: %s; want every port answered by the same pod through both nodes", label, pr)
		}
	}
	return got
}

// round routes vip from the outside host to each node in turn and opens
// one connection to vip:80 from each source port through it: the nodes'
// maps, in node order. At least 99% of the ports must be answered.
func (b *hashBed) round(t *testing.T, label, vip string) []portMap {
	t.Helper()
	got := make([]portMap, len(b.c.Nodes))
	for i, n := range b.c.Nodes {
		if _, err := b.c.Outside.RunOK(b.ctx, "ip", "route", "replace", vip+"/32", "via", n.IP, "dev", cluster.SegmentIface); err != nil {
			t.Fatal(err)
		}
		key := n.Name + " " + vip
		if wait := hashReuse - time.Since(b.lastUse[key]); wait > 0 {
			time.Sleep(wait)
		}
		began := time.Now()
		res := b.hitPorts(t, vip+":80")
		b.lastUse[key] = time.Now()
		t.Logf("round %s: %s via %s: %d of %d source ports answered in %s, by %v; %d failed %v",
			label, vip, n.Name, len(res.Answers), hashPorts, time.Since(began).Round(time.Millisecond),
			podCounts(res.Answers), len(res.Errors), firstErrors(res.Errors, 3))
		if len(res.Answers) < hashPorts*99/100 {
			t.Errorf("round %s: %s via %s: %d of %d source ports answered; want at least 99%%", label, vip, n.Name, len(res.Answers), hashPorts)
		}
		got[i] = res.Answers
	}
	return got
}

// hitPortsResult is what `vmagent hitports` prints.
type hitPortsResult struct {
	Answers portMap        `json:"answers"`
	Errors  map[int]string `json:"errors"`
}

// hitPorts runs `vmagent hitports` on the outside host to addr over the
// test's source ports.
func (b *hashBed) hitPorts(t *testing.T, addr string) hitPortsResult {
	t.Helper()
	out, err := b.c.Outside.RunOK(b.ctx, "vmagent", "hitports", "--addr", addr,
		"--first", strconv.Itoa(hashFirstPort), "--n", strconv.Itoa(hashPorts), "--timeout", "2s")
	if err != nil {
		t.Fatalf("hitports %s: %v", addr, err)
	}
	var res hitPortsResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("hitports %s: %q: %v", addr, out, err)
	}
	return res
}

// podCounts counts the ports of m by pod.
func podCounts(m portMap) map[string]int {
	n := map[string]int{}
	for _, pod := range m {
		n[pod]++
	}
	return n
}

// firstErrors is up to k of errs, lowest ports first.
func firstErrors(errs map[int]string, k int) []string {
	ports := slices.Sorted(maps.Keys(errs))
	var out []string
	for _, p := range ports[:min(k, len(ports))] {
		out = append(out, fmt.Sprintf("%d: %s", p, errs[p]))
	}
	return out
}

// hashPair compares two nodes' maps: the ports answered through both, and
// how many of them by the same pod.
type hashPair struct {
	a, b       string
	same, both int
}

func (p hashPair) String() string {
	return fmt.Sprintf("%s/%s agree %d/%d", p.a, p.b, p.same, p.both)
}

// pairs compares the maps of every pair of nodes, in node order.
func (b *hashBed) pairs(got []portMap) []hashPair {
	var out []hashPair
	for i := range got {
		for j := i + 1; j < len(got); j++ {
			same, both := samePods(got[i], got[j])
			out = append(out, hashPair{a: b.c.Nodes[i].Name, b: b.c.Nodes[j].Name, same: same, both: both})
		}
	}
	return out
}

// samePods counts the ports that both maps have, and those of them that
// map to the same pod.
func samePods(x, y portMap) (same, both int) {
	for port, pod := range x {
		if other, ok := y[port]; ok {
			both++
			if other == pod {
				same++
			}
		}
	}
	return same, both
}

// sameAs checks that a round after a restart maps every port, through
// every node, to the pod of the first round.
func (b *hashBed) sameAs(t *testing.T, label string, initial, now []portMap) {
	t.Helper()
	for i, n := range b.c.Nodes {
		same, both := samePods(initial[i], now[i])
		t.Logf("%s: %s agrees with round (a) on %d/%d ports", label, n.Name, same, both)
		if same != both {
			t.Errorf("%s: %s maps %d of %d ports to another pod than in round (a); want none moved", label, n.Name, both-same, both)
		}
	}
}

// movedToNew checks the scale-up from four endpoints to five: about a
// fifth of the ports moved (through every node alike), each to the new
// pod.
func (b *hashBed) movedToNew(t *testing.T, before, after []portMap, newPod string) {
	t.Helper()
	same, both := samePods(before[0], after[0])
	moved, toNew := both-same, 0
	for port, pod := range after[0] {
		if old, ok := before[0][port]; ok && old != pod && pod == newPod {
			toNew++
		}
	}
	frac := float64(moved) / float64(max(both, 1))
	t.Logf("4 -> 5 endpoints (%s, the lowest address, added): %d of %d ports moved (%.3f), %d of them to %s",
		newPod, moved, both, frac, toNew, newPod)
	if frac < 0.1 || frac > 0.35 {
		t.Errorf("4 -> 5 endpoints: %.3f of the ports moved; want between 0.1 and 0.35 (about 1/5)", frac)
	}
}

// restartAgent deletes node n's ipvs-proxy pod and waits until the
// DaemonSet's new pod there is ready (it synced) and the Service's virtual
// server is back with pods. With flush, the node's IPVS table is flushed once the
// old pod is gone, so the new agent programs it from scratch.
func (b *hashBed) restartAgent(t *testing.T, n *cluster.Node, flush bool, pods []*corev1.Pod) {
	t.Helper()
	agents := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem)
	old := b.agentPod(t, n)
	if err := agents.Delete(b.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(b.ctx, t, "ipvs-proxy pod "+old.Name+" gone", func() (bool, string) {
		_, err := agents.Get(b.ctx, old.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if flush {
		if _, err := n.VM.RunOK(b.ctx, "ipvsadm", "-C"); err != nil {
			t.Fatal(err)
		}
		out, _ := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln")
		t.Logf("%s: IPVS table flushed (ipvsadm -C) after its agent's pod was gone: %d virtual servers left",
			n.Name, strings.Count(out, "\nTCP ")+strings.Count(out, "\nUDP "))
	}
	waitFor(b.ctx, t, "a new ipvs-proxy pod ready on "+n.Name, func() (bool, string) {
		p := b.agentPod(t, n)
		return p.UID != old.UID && podReady(p), cluster.PodSummary(p)
	})
	b.waitRealServers(t, []*cluster.Node{n}, pods)
}

// agentPod is ipvs-proxy's pod on node n.
func (b *hashBed) agentPod(t *testing.T, n *cluster.Node) *corev1.Pod {
	t.Helper()
	pl, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(b.ctx, metav1.ListOptions{
		LabelSelector: cluster.IPVSProxyPods, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Items) == 0 {
		return &corev1.Pod{}
	}
	return &pl.Items[0]
}

// control programs on each node, by hand, a virtual server hashControlIP:80
// (mh, mh-fallback, mh-port) with the five pods added in another order on
// each node, as the kernel keeps them after another history, and routes
// it to each node in turn: the maps must disagree somewhere. Node-2's
// list is in the agent's order (ascending from the head, where the kernel
// puts each new real server): its map must be the agent's (agent: the
// last round's maps through the LoadBalancer IP).
func (b *hashBed) control(t *testing.T, pods []*corev1.Pod, agent []portMap) {
	t.Helper()
	orders := [][]int{{0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {2, 4, 1, 3, 0}}
	for i, n := range b.c.Nodes {
		b.programControl(t, n, pods, orders[i%len(orders)])
	}
	got := b.round(t, "control", hashControlIP)
	differ := 0
	for _, pr := range b.pairs(got) {
		t.Logf("control, the kernel's order after another history: %s (%d ports differ)", pr, pr.both-pr.same)
		differ += pr.both - pr.same
	}
	if differ == 0 {
		t.Errorf("control: the nodes' maps agree on every port with the real servers in another order on each node; the test cannot tell the agent's order from the kernel's")
	}
	same, both := samePods(got[1], agent[1])
	t.Logf("control: %s's list in the agent's order maps as the agent's table on %d/%d ports", b.c.Nodes[1].Name, same, both)
	if same != both {
		t.Errorf("control: %s's hand-made list in ascending order maps %d of %d ports unlike the agent's table; want none", b.c.Nodes[1].Name, both-same, both)
	}
}

// programControl makes the control's virtual server on n, outside the
// agent's ownership (its address is on hashControlIface, not the agent's
// interface), adding pods in the given order, and masquerades its
// connections as the agent does those of a policy Cluster Service.
func (b *hashBed) programControl(t *testing.T, n *cluster.Node, pods []*corev1.Pod, order []int) {
	t.Helper()
	vs := hashControlIP + ":80"
	cmds := [][]string{
		{"ip", "link", "add", hashControlIface, "type", "dummy"},
		{"ip", "link", "set", hashControlIface, "up"},
		{"ip", "addr", "add", hashControlIP + "/32", "dev", hashControlIface},
		{"iptables", "-t", "nat", "-I", "POSTROUTING", "-m", "conntrack", "--ctorigdst", hashControlIP, "-j", "MASQUERADE"},
		{"ipvsadm", "-A", "-t", vs, "-s", "mh", "-b", "mh-fallback,mh-port"},
	}
	for _, k := range order {
		cmds = append(cmds, []string{"ipvsadm", "-a", "-t", vs, "-r", pods[k].Status.PodIP + ":8080", "-m", "-w", "1"})
	}
	for _, argv := range cmds {
		if out, err := n.VM.RunOK(b.ctx, argv...); err != nil {
			t.Fatalf("%s: %v: %s", n.Name, err, out)
		}
	}
	out, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", vs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: control virtual server by hand:\n%s", n.Name, out)
}
