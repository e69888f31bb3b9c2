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

// hashService is one of the hash test's Services: its scheduler and
// flags (annotations), its LoadBalancer IP, the address of its hand-made
// control on the segment, and how many source ports, from hashFirstPort,
// a round opens a connection from, per node.
type hashService struct {
	name, sched, flags string
	lbIP, controlIP    string
	ports              int
}

const (
	hashFirstPort = 40000
	// hashReuse: a connection closed with a reset leaves an IPVS entry
	// (CLOSE, 10 s) that a new connection from the same source port to
	// the same node and address would reuse, with its real server;
	// a node is asked again only after this long.
	hashReuse = 12 * time.Second
	// hashControlIface holds the controls' addresses: not the agent's
	// interface, so the agent leaves their virtual servers alone.
	hashControlIface = "hashctl0"
)

// TestHashSchedulersAgreeAcrossNodes: two LoadBalancer Services with
// externalTrafficPolicy Cluster on a cluster of three nodes, one with the
// mh scheduler (mh-fallback, mh-port; 1,000 source ports a round), one
// with sh (sh-fallback, sh-port; 300 ports: its table is 256 buckets);
// their endpoints five pods spread over the nodes and listed in an
// EndpointSlice the test writes. The outside host routes each
// LoadBalancer IP to one node at a time, as a router would after a rehash
// or a node failure, and opens one connection from each source port: each
// answer names its pod. Every node maps every port to the same pod (a) at
// first, with four endpoints; (b) after node-2's agent restarts (and as in
// (a)); (c) after the fifth pod, the one whose address sorts first, joins
// the slice (mh: about a fifth of the ports move, nearly all to it); (d)
// after node-3's agent restarts on a flushed IPVS table (and as in (c)).
// The bed cannot reboot a node; (d) is what a reboot leaves: an agent that
// programs every real server from scratch, while the other two nodes hold
// the history of (c). In the kernel's plain order the two histories leave
// different lists. The control shows what that does: the same five pods
// behind virtual servers programmed by hand, on node-1 in the list
// order of (c)'s history, on node-3 in that of a fresh start, on node-2 in
// the agent's order: node-1's and node-3's sh maps disagree, and node-2's
// map is the agent's, for both schedulers.
func TestHashSchedulersAgreeAcrossNodes(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c := shippedCluster(ctx, t, 3)
	b := &hashBed{ctx: ctx, c: c, ns: "hash", lastUse: map[string]time.Time{}, svcs: []hashService{
		{name: "hash-mh", sched: "mh", flags: "mh-fallback,mh-port", lbIP: cluster.SegmentAddr(210), controlIP: cluster.SegmentAddr(211), ports: 1000},
		{name: "hash-sh", sched: "sh", flags: "sh-fallback,sh-port", lbIP: cluster.SegmentAddr(212), controlIP: cluster.SegmentAddr(213), ports: 300},
	}}
	clusterNamespace(ctx, t, c.Client, b.ns)
	pods := b.runPods(t)
	for _, svc := range b.svcs {
		b.createService(t, svc)
	}
	b.writeSlices(t, pods[1:])
	b.waitRealServers(t, c.Nodes, pods[1:])

	initial := b.agreeingRound(t, "(a) 4 endpoints")
	b.restartAgent(t, c.Nodes[1], false, pods[1:])
	b.sameAs(t, "(b) "+c.Nodes[1].Name+"'s agent restarted", initial, b.agreeingRound(t, "(b) agent restarted"))

	b.writeSlices(t, pods)
	b.waitRealServers(t, c.Nodes, pods)
	scaled := b.agreeingRound(t, "(c) 5 endpoints")
	b.movedToNew(t, initial, scaled, pods[0].Name)
	b.restartAgent(t, c.Nodes[2], true, pods)
	b.sameAs(t, "(d) "+c.Nodes[2].Name+"'s agent restarted on a flushed table", scaled, b.agreeingRound(t, "(d) table flushed"))

	b.control(t, pods, scaled)
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// shippedCluster starts a cluster of nodes nodes and the outside host
// with ipvs-proxy's DaemonSet from deploy/ as shipped, closed when the
// test ends.
func shippedCluster(ctx context.Context, t *testing.T, nodes int) *cluster.Cluster {
	t.Helper()
	began := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Assets: vm.Require(t), Log: t.Logf, Nodes: nodes, Outside: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.DeployIPVSProxyShipped(ctx, deployDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING %d nodes with ipvs-proxy ready after %s", nodes, time.Since(began).Round(time.Millisecond))
	return c
}

// hashBed is the hash test's cluster and what it keeps between rounds.
type hashBed struct {
	ctx  context.Context
	c    *cluster.Cluster
	ns   string
	svcs []hashService
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
		p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
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

// createService creates svc, a selectorless LoadBalancer Service with
// policy Cluster, with its LoadBalancer IP as its ingress.
func (b *hashBed) createService(t *testing.T, svc hashService) {
	t.Helper()
	obj := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc.name, Annotations: map[string]string{
			scheduler.AnnotationScheduler: svc.sched, scheduler.AnnotationFlags: svc.flags}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	api := b.c.Client.CoreV1().Services(b.ns)
	created, err := api.Create(b.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: svc.lbIP}}
	if _, err := api.UpdateStatus(b.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeSlices makes each Service's only EndpointSlice list pods, ready.
func (b *hashBed) writeSlices(t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	for _, svc := range b.svcs {
		b.writeSlice(t, svc.name, pods)
	}
	t.Logf("EndpointSlices: %d endpoints", len(pods))
}

func (b *hashBed) writeSlice(t *testing.T, name string, pods []*corev1.Pod) {
	t.Helper()
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e.ipvs-proxy.io"}},
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
}

// waitRealServers waits until each Service's virtual server on each of
// nodes holds exactly pods' addresses.
func (b *hashBed) waitRealServers(t *testing.T, nodes []*cluster.Node, pods []*corev1.Pod) {
	t.Helper()
	want := map[string]int{}
	for _, p := range pods {
		want[p.Status.PodIP] = 1
	}
	for _, n := range nodes {
		for _, svc := range b.svcs {
			vs := svc.lbIP + ":80"
			waitFor(b.ctx, t, fmt.Sprintf("%s with %d real servers on %s", vs, len(pods), n.Name), func() (bool, string) {
				out, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", vs)
				got := ipvsWeights(out)
				return err == nil && strings.Contains(out, " "+svc.sched+" ") && len(got) == len(want) && weightsMatch(got, want), out + fmt.Sprint(err)
			})
		}
	}
}

// hashMaps are a round's maps: by Service name, each node's in node order.
type hashMaps map[string][]portMap

// agreeingRound is a round through the Services' LoadBalancer IPs whose
// maps must agree on every port answered through two nodes.
func (b *hashBed) agreeingRound(t *testing.T, label string) hashMaps {
	t.Helper()
	got := b.round(t, label, func(svc hashService) string { return svc.lbIP })
	for _, svc := range b.svcs {
		for _, pr := range b.pairs(got[svc.name]) {
			t.Logf("round %s: %s (%s): %s", label, svc.name, svc.sched, pr)
			if pr.same != pr.both {
				t.Errorf("round %s: %s: %s; want every port answered by the same pod through both nodes", label, svc.name, pr)
			}
		}
	}
	return got
}

// round routes each Service's address (vip: its LoadBalancer IP or its
// control's) from the outside host to each node in turn and opens one
// connection to it, port 80, from each of the Service's source ports. At
// least 99% of the ports must be answered.
func (b *hashBed) round(t *testing.T, label string, vip func(hashService) string) hashMaps {
	t.Helper()
	got := hashMaps{}
	for _, n := range b.c.Nodes {
		for _, svc := range b.svcs {
			got[svc.name] = append(got[svc.name], b.roundVia(t, label, n, vip(svc), svc.ports))
		}
	}
	return got
}

// roundVia is one node's part of a round through vip, over ports source
// ports.
func (b *hashBed) roundVia(t *testing.T, label string, n *cluster.Node, vip string, ports int) portMap {
	t.Helper()
	if _, err := b.c.Outside.RunOK(b.ctx, "ip", "route", "replace", vip+"/32", "via", n.IP, "dev", cluster.SegmentIface); err != nil {
		t.Fatal(err)
	}
	key := n.Name + " " + vip
	if wait := hashReuse - time.Since(b.lastUse[key]); wait > 0 {
		time.Sleep(wait)
	}
	began := time.Now()
	res := b.hitPorts(t, vip+":80", ports)
	b.lastUse[key] = time.Now()
	t.Logf("round %s: %s via %s: %d of %d source ports answered in %s, by %v; %d failed %v",
		label, vip, n.Name, len(res.Answers), ports, time.Since(began).Round(time.Millisecond),
		podCounts(res.Answers), len(res.Errors), firstErrors(res.Errors, 3))
	if len(res.Answers) < ports*99/100 {
		t.Errorf("round %s: %s via %s: %d of %d source ports answered; want at least 99%%", label, vip, n.Name, len(res.Answers), ports)
	}
	return res.Answers
}

// hitPortsResult is what `vmagent hitports` prints.
type hitPortsResult struct {
	Answers portMap        `json:"answers"`
	Errors  map[int]string `json:"errors"`
}

// hitPorts runs `vmagent hitports` on the outside host to addr from ports
// source ports.
func (b *hashBed) hitPorts(t *testing.T, addr string, ports int) hitPortsResult {
	t.Helper()
	out, err := b.c.Outside.RunOK(b.ctx, "vmagent", "hitports", "--addr", addr,
		"--first", strconv.Itoa(hashFirstPort), "--n", strconv.Itoa(ports), "--timeout", "2s")
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

// sameAs checks that a round after a restart maps every port of every
// Service, through every node, to the pod of the round before.
func (b *hashBed) sameAs(t *testing.T, label string, before, now hashMaps) {
	t.Helper()
	for _, svc := range b.svcs {
		for i, n := range b.c.Nodes {
			same, both := samePods(before[svc.name][i], now[svc.name][i])
			t.Logf("%s: %s via %s agrees with the round before on %d/%d ports", label, svc.name, n.Name, same, both)
			if same != both {
				t.Errorf("%s: %s via %s maps %d of %d ports to another pod than the round before; want none moved", label, svc.name, n.Name, both-same, both)
			}
		}
	}
}

// movedToNew reports the scale-up from four endpoints to five (through
// node-1; the nodes agree): for mh, about a fifth of the ports moved,
// nearly all to the new pod (Maglev's promise); sh, not a consistent
// hash, moves most.
func (b *hashBed) movedToNew(t *testing.T, before, after hashMaps, newPod string) {
	t.Helper()
	for _, svc := range b.svcs {
		same, both := samePods(before[svc.name][0], after[svc.name][0])
		moved, toNew := both-same, 0
		for port, pod := range after[svc.name][0] {
			if old, ok := before[svc.name][0][port]; ok && old != pod && pod == newPod {
				toNew++
			}
		}
		frac := float64(moved) / float64(max(both, 1))
		t.Logf("%s (%s), 4 -> 5 endpoints (%s, the lowest address, added): %d of %d ports moved (%.3f), %d of them to %s",
			svc.name, svc.sched, newPod, moved, both, frac, toNew, newPod)
		if svc.sched == "mh" && (frac < 0.1 || frac > 0.35) {
			t.Errorf("%s: 4 -> 5 endpoints: %.3f of the ports moved; want between 0.1 and 0.35 (about 1/5)", svc.name, frac)
		}
	}
}

// restartAgent deletes node n's ipvs-proxy pod and waits until the
// DaemonSet's new pod there is ready (it synced) and the Services' virtual
// servers are back with pods. With flush, the node's IPVS table is flushed
// once the old pod is gone, so the new agent programs it from scratch.
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
	return ipvsProxyPod(b.ctx, t, b.c, n)
}

// ipvsProxyPod is ipvs-proxy's pod on node n (an empty pod when there is
// none).
func ipvsProxyPod(ctx context.Context, t *testing.T, c *cluster.Cluster, n *cluster.Node) *corev1.Pod {
	t.Helper()
	pl, err := c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: cluster.IPVSProxyPods, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Items) == 0 {
		return &corev1.Pod{}
	}
	return &pl.Items[0]
}

// control programs by hand, on each node, a virtual server at each
// Service's control address with the Service's scheduler and flags and
// the five pods (ascending by address), added one by one, each put at the
// list's head by the kernel: on node-1 in the order that leaves the list
// of (c)'s history (four, then the lowest: e1..e4, e0), on node-3 in that
// of a fresh start (e0..e4), on node-2 in reverse (the agent's order,
// ascending from the head). It routes each address to each node in turn:
// node-1's and node-3's sh maps must disagree (mh's are logged: with equal
// weights Maglev's table barely depends on the order), and node-2's maps
// must be the agent's (agent: the last round's maps through the
// LoadBalancer IPs).
func (b *hashBed) control(t *testing.T, pods []*corev1.Pod, agent hashMaps) {
	t.Helper()
	orders := [][]int{{1, 2, 3, 4, 0}, {4, 3, 2, 1, 0}, {0, 1, 2, 3, 4}}
	for i, n := range b.c.Nodes {
		b.programControls(t, n, pods, orders[i%len(orders)])
	}
	got := b.round(t, "control", func(svc hashService) string { return svc.controlIP })
	for _, svc := range b.svcs {
		for _, pr := range b.pairs(got[svc.name]) {
			t.Logf("control %s (%s), the kernel's order after other histories: %s (%d ports differ)", svc.name, svc.sched, pr, pr.both-pr.same)
		}
		if same, both := samePods(got[svc.name][0], got[svc.name][2]); svc.sched == "sh" && same == both {
			t.Errorf("control %s: node-1's and node-3's maps agree on all %d ports with the real servers in the orders of two histories; the test cannot tell the agent's order from the kernel's", svc.name, both)
		}
		same, both := samePods(got[svc.name][1], agent[svc.name][1])
		t.Logf("control %s: %s's list in the agent's order maps as the agent's table on %d/%d ports", svc.name, b.c.Nodes[1].Name, same, both)
		if same != both {
			t.Errorf("control %s: %s's hand-made list in the agent's order maps %d of %d ports unlike the agent's table; want none", svc.name, b.c.Nodes[1].Name, both-same, both)
		}
	}
}

// programControls makes, on n, the controls' virtual servers outside the
// agent's ownership (their addresses are on hashControlIface, not the
// agent's interface), adding pods in the given order, and masquerades
// their connections as the agent does those of a policy Cluster Service.
func (b *hashBed) programControls(t *testing.T, n *cluster.Node, pods []*corev1.Pod, order []int) {
	t.Helper()
	cmds := [][]string{
		{"ip", "link", "add", hashControlIface, "type", "dummy"},
		{"ip", "link", "set", hashControlIface, "up"},
	}
	for _, svc := range b.svcs {
		vs := svc.controlIP + ":80"
		cmds = append(cmds,
			[]string{"ip", "addr", "add", svc.controlIP + "/32", "dev", hashControlIface},
			[]string{"iptables", "-t", "nat", "-I", "POSTROUTING", "-m", "conntrack", "--ctorigdst", svc.controlIP, "-j", "MASQUERADE"},
			[]string{"ipvsadm", "-A", "-t", vs, "-s", svc.sched, "-b", svc.flags})
		for _, k := range order {
			cmds = append(cmds, []string{"ipvsadm", "-a", "-t", vs, "-r", pods[k].Status.PodIP + ":8080", "-m", "-w", "1"})
		}
	}
	for _, argv := range cmds {
		if out, err := n.VM.RunOK(b.ctx, argv...); err != nil {
			t.Fatalf("%s: %v: %s", n.Name, err, out)
		}
	}
	names := make([]string, len(order))
	for i, k := range order {
		names[i] = pods[k].Name
	}
	t.Logf("%s: control virtual servers by hand, real servers added in the order %v (each at the list's head)", n.Name, names)
}
