package e2e

// Issue 45's cases 1, 3, 4, 5 and 7 on the two-node cluster with the
// outside host (`make chaos-nodes`): the cluster, its Services and live
// traffic from every kind of client. The cases are in
// chaos_nodes_glue_test.go, chaos_nodes_addr_test.go,
// chaos_nodes_stale_test.go, chaos_nodes_rollout_test.go,
// chaos_nodes_udp_test.go and chaos_nodes_lost_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// The namespaces of TestChaosNodes: the live Service and its pods, and
// the bulk Services.
const (
	chaosNodesNS     = "chaos-nodes"
	chaosNodesBulkNS = "chaos-nodes-bulk"
)

// chaosNodesLBIP is the live Service's LoadBalancer IP on the segment,
// routed by the outside host to node-1.
var chaosNodesLBIP = cluster.SegmentAddr(220)

// TestChaosNodes: two nodes (ipvs-proxy's DaemonSet as shipped) and the
// outside host; CHAOS_SIZE bulk Services (ClusterIP, NodePort and
// LoadBalancer in turn, two endpoints each that only the kernel's tables
// see) and a live LoadBalancer Service (policy Cluster) whose two pods
// run one on each node. Through each case, a new TCP connection every
// 200 ms from a pod and the host of each node and from the outside host,
// to the live Service's clusterIP, node port and LoadBalancer IP.
//   - nodes-glue-restore-fails: iptables-restore fails in node-1's agent
//     container for 3 minutes while the glue has drift to repair
//     (chaos_nodes_glue_test.go);
//   - nodes-address-change: node-1's segment address replaced by another
//     (chaos_nodes_addr_test.go);
//   - nodes-stale-agent: a second agent pod started on node-1 beside its
//     agent, refused (chaos_nodes_stale_test.go);
//   - nodes-agent-rollout: the DaemonSet rolled to a new revision on both
//     nodes and rolled back (chaos_nodes_rollout_test.go);
//   - nodes-udp-load: UDP (an echo Service whose pod cycles, and DNS)
//     from a pod on each node while both VMs are loaded
//     (chaos_nodes_udp_test.go);
//   - nodes-node-lost: node-2's VM killed, then booted again as the same
//     node (chaos_nodes_lost_test.go).
func TestChaosNodes(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), nodesBudget(t))
	defer cancel()
	c := shippedCluster(ctx, t, 2)
	dumpAgentsOnFailure(t, c)
	b := newNodesBed(ctx, t, c, chaosSize(t))
	t.Run("nodes-glue-restore-fails", b.persistentGlueFailure)
	t.Run("nodes-address-change", b.nodeAddressChange)
	t.Run("nodes-stale-agent", b.staleAgent)
	t.Run("nodes-agent-rollout", b.agentRollout)
	t.Run("nodes-udp-load", b.udpLoad)
	t.Run("nodes-node-lost", b.nodeLost) // last: it reboots node-2
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// nodesBudget is TestChaosNodes' time: up to 2 minutes before go test's
// own deadline (-timeout; `make chaos-nodes` gives 80m, more for a bigger
// CHAOS_SIZE with E2E_TIMEOUT), so the cases' cleanup and the agents'
// dumps still run; 60 minutes without a deadline.
func nodesBudget(t *testing.T) time.Duration {
	d, ok := t.Deadline()
	if !ok {
		return 60 * time.Minute
	}
	return time.Until(d) - 2*time.Minute
}

// heldPortsFirst and heldPortsN are the source ports the cases' held
// connections bind (holdLive, heldSet).
const heldPortsFirst, heldPortsN = 42000, 2000

// nodesBed is TestChaosNodes' cluster and its Services.
type nodesBed struct {
	ctx  context.Context
	c    *cluster.Cluster
	fast kubernetes.Interface // 500 requests/s, for bulk work
	size int                  // bulk Services
	live *corev1.Service
	// nodePorted are the Services with a node port (the live one and
	// two bulk Services in three, bulkNodePorts at most).
	nodePorted []*corev1.Service
}

// newNodesBed makes the Services and waits until both nodes have them all.
func newNodesBed(ctx context.Context, t *testing.T, c *cluster.Cluster, size int) *nodesBed {
	t.Helper()
	cfg := rest.CopyConfig(c.CP.RESTConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	fast, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &nodesBed{ctx: ctx, c: c, fast: fast, size: size}
	// The held connections' source ports (42000-42399, 43000-...) are
	// kept from the kernel's own connections before any stream runs:
	// reserved only as a case holds them, one that a stream had used
	// minutes before was still taken (its TIME_WAIT; case 5a at 2,000:
	// `bind: address already in use`).
	vms := []*vm.VM{c.Outside}
	for _, n := range c.Nodes {
		vms = append(vms, n.VM)
	}
	for _, v := range vms {
		reservePorts(ctx, t, v, heldPortsFirst, heldPortsN)
	}
	clusterNamespace(ctx, t, c.Client, chaosNodesNS)
	clusterNamespace(ctx, t, c.Client, chaosNodesBulkNS)
	b.startServers(t)
	start := time.Now()
	bulk := b.bulkServices(t, size)
	created := time.Since(start)
	for _, s := range bulk {
		if s.Spec.Ports[0].NodePort != 0 {
			b.nodePorted = append(b.nodePorted, s)
		}
	}
	for _, n := range c.Nodes {
		took, _ := convergeOn(t, n.VM, n.Name+": the Services", b.expected(t, n), 10*time.Minute)
		ports := b.nodePortsAt(t, n, n.IP)
		t.Logf("%s: %d bulk Services created in %s, programmed %s later (%d node ports)", n.Name, size, created.Round(time.Millisecond), took.Round(time.Millisecond), ports)
	}
	if t.Failed() {
		t.FailNow()
	}
	return b
}

// startServers runs a server pod on each node behind the live Service
// and waits until both are its real servers on both nodes.
func (b *nodesBed) startServers(t *testing.T) {
	t.Helper()
	var pods []*corev1.Pod
	for i, n := range b.c.Nodes {
		name := "server-" + strconv.Itoa(i+1)
		p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080", "--tcp"})
		p.Labels = map[string]string{"app": "chaos-server"}
		p.Spec.NodeName = n.Name
		// Burstable, as in TestChaosRollingUpdate: a BestEffort pod's
		// answers stall for seconds on a node this busy.
		p.Spec.Containers[0].Resources = burstable("200m")
		// A probe for a loaded emulated node: the default 1 s timeout
		// failed dozens of times a run (`dial tcp ...: i/o timeout`),
		// the live Service's endpoints flapped, and node-2's agent,
		// following them as it must, wrote to a table the cases count
		// as untouched (runs 11 and 13).
		p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
		p.Spec.Containers[0].ReadinessProbe.TimeoutSeconds = 5
		// Bound to its node through a loss, as a DaemonSet's pod is:
		// server-2 comes back with node-2 in nodes-node-lost instead of
		// being evicted 5 minutes after the loss (the default toleration).
		for _, taint := range []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady} {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: taint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
		}
		pods = append(pods, p)
	}
	running := runPods(b.ctx, t, b.c, chaosNodesNS, pods...)
	api := b.c.Client.CoreV1().Services(chaosNodesNS)
	live, err := api.Create(b.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "live"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "chaos-server"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: chaosNodesLBIP}}
	if b.live, err = api.UpdateStatus(b.ctx, live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.nodePorted = append(b.nodePorted, b.live)
	want := map[string]int{}
	for _, p := range running {
		want[p.Status.PodIP] = 1
	}
	for _, n := range b.c.Nodes {
		for _, vs := range []string{b.clusterIP(), b.lbIP(), b.nodePort(n.IP)} {
			waitFor(b.ctx, t, fmt.Sprintf("%s with both servers on %s", vs, n.Name), func() (bool, string) {
				out, err := n.VM.RunOK(b.ctx, "ipvsadm", "-Ln", "-t", vs)
				return err == nil && len(ipvsWeights(out)) == 2 && weightsMatch(ipvsWeights(out), want), out + fmt.Sprint(err)
			})
		}
	}
}

// The live Service's addresses.
func (b *nodesBed) clusterIP() string { return hostPort(b.live.Spec.ClusterIP, 80) }
func (b *nodesBed) lbIP() string      { return hostPort(chaosNodesLBIP, 80) }
func (b *nodesBed) nodePort(ip string) string {
	return hostPort(ip, b.live.Spec.Ports[0].NodePort)
}

// bulkServices creates bulk-<i> for i in [0, n) in the bulk namespace
// (fakeServices).
func (b *nodesBed) bulkServices(t *testing.T, n int) []*corev1.Service {
	t.Helper()
	out, err := b.fakeServices(chaosNodesBulkNS, "bulk-", 0, n)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bulkNodePorts is how many Services of one fakeServices call have a
// node port at most: the range (30000-32767, 2,768 ports) less room for
// the live Service and the soak's batches. At 5,000 Services two in three
// would need 3,334 (the apiserver: "failed to allocate a nodePort: range
// is full").
const bulkNodePorts = 2600

// nodePortedBefore is how many of the indices [0, k) are not multiples of
// 3: fakeServices' NodePort and LoadBalancer slots.
func nodePortedBefore(k int) int { return k - (k+2)/3 }

// fakeServiceType is the type of fakeServices' Service i of a call from
// first, and whether it has a node port.
func fakeServiceType(first, i int) (corev1.ServiceType, bool) {
	switch {
	case i%3 == 0:
		return corev1.ServiceTypeClusterIP, false
	case nodePortedBefore(i)-nodePortedBefore(first) >= bulkNodePorts:
		return corev1.ServiceTypeLoadBalancer, false
	case i%3 == 1:
		return corev1.ServiceTypeNodePort, true
	}
	return corev1.ServiceTypeLoadBalancer, true
}

// fakeServices creates <prefix><i> for i in [first, first+n) in ns:
// ClusterIP, NodePort and LoadBalancer (no ingress) in turn, TCP port 80,
// each with an EndpointSlice of two endpoints nothing answers on
// (fakeEndpoints(i, 2)). Past bulkNodePorts Services with a node port (a
// CHAOS_SIZE above 3,900) the NodePort and LoadBalancer slots are
// LoadBalancers without node ports (allocateLoadBalancerNodePorts
// false), as a cluster whose load balancers reach the pods directly has.
func (b *nodesBed) fakeServices(ns, prefix string, first, n int) ([]*corev1.Service, error) {
	out := make([]*corev1.Service, n)
	err := parallel(n, func(j int) error {
		i := first + j
		typ, nodePorts := fakeServiceType(first, i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prefix + strconv.Itoa(i)},
			Spec: corev1.ServiceSpec{Type: typ, Ports: []corev1.ServicePort{tcpPort("http", 80)}}}
		if !nodePorts && typ == corev1.ServiceTypeLoadBalancer {
			svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		}
		created, err := b.fast.CoreV1().Services(ns).Create(b.ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create service %s: %w", svc.Name, err)
		}
		if _, err := b.fast.DiscoveryV1().EndpointSlices(ns).Create(b.ctx, slice(created, fakeEndpoints(i, 2)),
			metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice of %s: %w", svc.Name, err)
		}
		out[j] = created
		return nil
	})
	return out, err
}

// expected is the state node n should hold: the case's Services exactly,
// every other as allowed, node ports on every address n has now.
func (b *nodesBed) expected(t *testing.T, n *cluster.Node) chaos.Expected {
	t.Helper()
	return expectedState(t, b.fast, cluster.ServiceCIDR, b.nodeAddrs(t, n), chaosNodesNS, chaosNodesBulkNS)
}

// nodeAddrs are n's IPv4 addresses that carry node ports as shipped:
// every one but loopback's and the proxy interface's.
func (b *nodesBed) nodeAddrs(t *testing.T, n *cluster.Node) []string {
	t.Helper()
	out, err := n.VM.RunOK(b.ctx, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	var addrs []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[1] != "lo" && f[1] != proxyIface {
			a, _, _ := strings.Cut(f[3], "/")
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// nodePortsAt fails the test unless n has, within 30 s, a virtual server
// on addr for each node port of the case's Services, and returns how many
// it has.
func (b *nodesBed) nodePortsAt(t *testing.T, n *cluster.Node, addr string) int {
	t.Helper()
	var missing []string
	for start := time.Now(); ; time.Sleep(time.Second) {
		st := readKernelState(t, n.VM)
		missing = missing[:0]
		for _, s := range b.nodePorted {
			if vs := "TCP " + hostPort(addr, s.Spec.Ports[0].NodePort); st.Virtual[vs] == nil {
				missing = append(missing, s.Namespace+"/"+s.Name+" "+vs)
			}
		}
		if len(missing) == 0 || time.Since(start) > 30*time.Second {
			break
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s: %d of %d node ports have no virtual server on %s: %s", n.Name, len(missing), len(b.nodePorted), addr, sample(missing))
	}
	return len(b.nodePorted) - len(missing)
}

// ipvsLines is a node's `ipvsadm -Ln`, sorted: its whole IPVS table with
// schedulers, forwarding methods and weights.
func ipvsLines(ctx context.Context, t *testing.T, n *cluster.Node) []string {
	t.Helper()
	out, err := n.VM.RunOK(ctx, "ipvsadm", "-Ln")
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		// A real server's line without its connection counts.
		if f := strings.Fields(l); len(f) >= 4 && f[0] == "->" {
			l = strings.Join(f[:4], " ")
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return lines
}

// agentRestarts fails the test if n's agent restarted since restarts, and
// logs what kubelet said of its pod (probe failures, kills); it returns
// the restarts since.
func (b *nodesBed) agentRestarts(t *testing.T, n *cluster.Node, restarts int32) int32 {
	t.Helper()
	p := ipvsProxyPod(b.ctx, t, b.c, n)
	logPodWarnings(b.ctx, t, b.c, n, p)
	got := restartCount(p)
	if got != restarts {
		t.Errorf("%s: the agent's container restarted %d times during the case (%s%s); want 0: kubelet's probes must not restart an agent whose IPVS serves",
			n.Name, got-restarts, cluster.PodSummary(p), lastTermination(p))
	}
	return got - restarts
}

// logPodWarnings logs kubelet's Warning and Killing Events on p, n's
// agent pod.
func logPodWarnings(ctx context.Context, t *testing.T, c *cluster.Cluster, n *cluster.Node, p *corev1.Pod) {
	t.Helper()
	list, err := c.Client.CoreV1().Events(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + p.Name})
	if err != nil {
		t.Logf("%s: agent pod %s: Events: %v", n.Name, p.Name, err)
		return
	}
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning || e.Reason == "Killing" {
			t.Logf("%s: agent pod %s: %s %s x%d: %s", n.Name, p.Name, e.LastTimestamp.Format("15:04:05"), e.Reason, e.Count, e.Message)
		}
	}
}

// lastTermination tells how p's first container last ended, if it did.
func lastTermination(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	term := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
	if term == nil {
		return ""
	}
	return fmt.Sprintf("; last ended %s: %s, exit code %d, signal %d: %s",
		term.FinishedAt.Format("15:04:05"), term.Reason, term.ExitCode, term.Signal, term.Message)
}

// agentLogTail is how many of each agent's last log lines a failed run
// shows.
const agentLogTail = 200

// dumpAgentsOnFailure registers a cleanup that, if t failed, logs for each
// node its agent pod's state, how its container last ended, kubelet's
// warnings on it and the last agentLogTail lines of its log (and of the
// previous container's after a restart), so that a failure explains
// itself. It is bounded: a cleanup must never hang.
func dumpAgentsOnFailure(t *testing.T, c *cluster.Cluster) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, n := range c.Nodes {
			dumpAgent(ctx, t, c, n)
		}
	})
}

func dumpAgent(ctx context.Context, t *testing.T, c *cluster.Cluster, n *cluster.Node) {
	pods := c.Client.CoreV1().Pods(metav1.NamespaceSystem)
	pl, err := pods.List(ctx, metav1.ListOptions{LabelSelector: cluster.IPVSProxyPods, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil || len(pl.Items) == 0 {
		t.Logf("%s: no agent pod to dump (%v)", n.Name, err)
		return
	}
	p := &pl.Items[0]
	t.Logf("%s: agent pod %s%s", n.Name, cluster.PodSummary(p), lastTermination(p))
	logPodWarnings(ctx, t, c, n, p)
	for _, previous := range []bool{true, false} {
		if previous && restartCount(p) == 0 {
			continue
		}
		raw, err := pods.GetLogs(p.Name, &corev1.PodLogOptions{Container: p.Spec.Containers[0].Name, Previous: previous,
			TailLines: ptr.To[int64](agentLogTail)}).DoRaw(ctx)
		t.Logf("%s: the agent's last %d log lines (previous container: %v; %v):\n%s", n.Name, agentLogTail, previous, err, raw)
	}
}

// untouched is what a case must leave alone on a node: its IPVS table and
// the agent's count of netlink writes.
type untouched struct {
	n      *cluster.Node
	ipvs   []string
	writes float64
}

func (b *nodesBed) untouched(t *testing.T, n *cluster.Node) untouched {
	t.Helper()
	return untouched{n: n, ipvs: ipvsLines(b.ctx, t, n), writes: b.writes(t, n)}
}

// check fails the test if the table changed or the agent wrote; it
// returns the writes.
func (u untouched) check(ctx context.Context, t *testing.T, b *nodesBed) int {
	t.Helper()
	now := ipvsLines(ctx, t, u.n)
	if missing, extra := lineDiff(u.ipvs, now); len(missing)+len(extra) > 0 {
		t.Errorf("%s's IPVS table changed: lines gone %s; new %s", u.n.Name, sample(missing), sample(extra))
	}
	writes := int(b.writes(t, u.n) - u.writes)
	if writes != 0 {
		t.Errorf("%s's agent made %d netlink writes; want 0", u.n.Name, writes)
	}
	return writes
}

// agentHTTP is a GET of the agent's own endpoint on n (the metrics on
// 127.0.0.1:10249, health on 10256), from n's host: up to 3 attempts of
// 20 s (a scrape dumps the IPVS table for the per-Service series, which
// took over 5 s in the emulated node under the case's traffic), each
// failure logged.
func (b *nodesBed) agentHTTP(t *testing.T, n *cluster.Node, url string) agentapi.HTTPResult {
	t.Helper()
	var err error
	for try := 1; try <= 3; try++ {
		began := time.Now()
		var out string
		out, err = n.VM.RunOK(b.ctx, "vmagent", "http", "--timeout", "20s", url)
		var res agentapi.HTTPResult
		if err == nil {
			if err = json.Unmarshal([]byte(out), &res); err == nil {
				return res
			}
		}
		t.Logf("%s: GET %s, attempt %d, %s: %v", n.Name, url, try, time.Since(began).Round(time.Millisecond), err)
	}
	t.Fatalf("%s: GET %s: %v", n.Name, url, err)
	return agentapi.HTTPResult{}
}

// metric is the value of the sample named series (name and labels as the
// text format writes them) of n's agent; 0 when absent.
func (b *nodesBed) metric(t *testing.T, n *cluster.Node, series string) float64 {
	t.Helper()
	v, _ := b.sample(t, n, series)
	return v
}

// writes is the netlink writes n's agent has made since it started.
func (b *nodesBed) writes(t *testing.T, n *cluster.Node) float64 {
	t.Helper()
	v, ok := b.sample(t, n, "ipvs_proxy_sync_netlink_writes_sum")
	if !ok {
		t.Fatalf("%s: the agent's metrics have no ipvs_proxy_sync_netlink_writes_sum", n.Name)
	}
	return v
}

// sample reads series from n's agent's metrics.
func (b *nodesBed) sample(t *testing.T, n *cluster.Node, series string) (float64, bool) {
	t.Helper()
	res := b.agentHTTP(t, n, "http://127.0.0.1:10249/metrics")
	v, ok, err := metricValue(res.Body, series)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	return v, ok
}

// metricValue is the value of the sample named series in body, the
// Prometheus text format; ok is false when it is absent.
func metricValue(body, series string) (v float64, ok bool, err error) {
	for _, l := range strings.Split(body, "\n") {
		if s, found := strings.CutPrefix(l, series+" "); found {
			v, err = strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return 0, false, fmt.Errorf("metric line %q: %w", l, err)
			}
			return v, true, nil
		}
	}
	return 0, false, nil
}

// hitTarget is one stream of live traffic: its name and address.
type hitTarget struct{ name, addr string }

// nodesTraffic is a case's live traffic: `vmagent hit` in the hosts' root
// namespaces and in one pod per node (a container per address), each a
// new TCP connection every 200 ms with a 5 s timeout.
type nodesTraffic struct {
	b     *nodesBed
	procs map[string]*vm.Proc
	pods  []string       // the pods' names
	done  []streamResult // streams stopped early
	// drops are each node's kernel drop counters as the streams began;
	// syns watches their IPVS connections left unanswered.
	drops map[string]dropCounters
	syns  *synWatch
}

// hitArgv is the command of one stream.
func hitArgv(addr string) []string {
	return []string{"vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", "1000000", "--interval", "200ms", "--timeout", "5s"}
}

// startTraffic starts the streams: from each node's host and its pods (one
// per target) to the clusterIP and the LoadBalancer IP, and to the node ports of nodePort
// (node name to the address its node port is reached at, from its own
// host and the outside host; the pods use node-2's); from the outside host
// to the LoadBalancer IP, routed to node-1.
func (b *nodesBed) startTraffic(t *testing.T, label string, nodePort map[string]string) *nodesTraffic {
	t.Helper()
	return b.startTrafficFrom(t, label, nodePort, b.c.Nodes...)
}

// startTrafficFrom is startTraffic from the hosts and pods of the nodes
// from only (node-1 first); the pods use the node port of from's last.
func (b *nodesBed) startTrafficFrom(t *testing.T, label string, nodePort map[string]string, from ...*cluster.Node) *nodesTraffic {
	t.Helper()
	n1, last := b.c.Nodes[0], from[len(from)-1]
	if _, err := b.c.Outside.RunOK(b.ctx, "ip", "route", "replace", chaosNodesLBIP+"/32", "via", n1.IP, "dev", cluster.SegmentIface); err != nil {
		t.Fatal(err)
	}
	tr := &nodesTraffic{b: b, procs: map[string]*vm.Proc{}}
	for i, n := range from {
		targets := []hitTarget{{"cluster-ip", b.clusterIP()}, {"lb-ip", b.lbIP()}}
		if a, ok := nodePort[n.Name]; ok {
			tr.add(t, n.VM, n.Name+"-host-node-port", b.nodePort(a))
			tr.add(t, b.c.Outside, "outside-"+n.Name+"-node-port", b.nodePort(a))
		}
		for _, tg := range targets {
			tr.add(t, n.VM, n.Name+"-host-"+tg.name, tg.addr)
		}
		// A pod per target: streams in one network namespace may share
		// a source port, and a node-2 IPVS entry of node-1's pod's
		// node-port stream (masqueraded, to server-2) then takes the
		// replies of its clusterIP stream to server-2 from that port,
		// for 2 minutes (TestIPVSTakesForwardedReplyOfAnotherFlow): the
		// kernel's, not the case's.
		for _, tg := range append(targets, hitTarget{"node-port", b.nodePort(last.IP)}) {
			tr.startPod(t, fmt.Sprintf("hit-%s-%d-%s", label, i+1, tg.name), n, []hitTarget{tg})
		}
	}
	tr.add(t, b.c.Outside, "outside-lb-ip", b.lbIP())
	for _, name := range tr.pods {
		waitFor(b.ctx, t, "pod "+name+" Running", func() (bool, string) {
			p, err := b.c.Client.CoreV1().Pods(chaosNodesNS).Get(b.ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, fmt.Sprint(err)
		})
	}
	tr.drops = b.dropCountersOf(t)
	tr.syns = b.watchSYNs(netip.MustParsePrefix(cluster.ClusterCIDR), netip.MustParsePrefix(cluster.SegmentCIDR))
	time.Sleep(2 * time.Second) // traffic before the event
	return tr
}

// add starts a stream in v's root namespace.
func (tr *nodesTraffic) add(t *testing.T, v *vm.VM, name, addr string) {
	t.Helper()
	tr.procs[name] = startProc(tr.b.ctx, t, v, hitArgv(addr)...)
}

// startPod creates a pod on n with one stream per target.
func (tr *nodesTraffic) startPod(t *testing.T, name string, n *cluster.Node, targets []hitTarget) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		NodeName: n.Name, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	for _, tg := range targets {
		argv := hitArgv(tg.addr)
		argv[0] = "/vmagent"
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: tg.name, Image: cluster.ServerImage,
			ImagePullPolicy: corev1.PullIfNotPresent, Command: argv, Resources: burstable("50m")})
	}
	if _, err := tr.b.c.Client.CoreV1().Pods(chaosNodesNS).Create(tr.b.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr.pods = append(tr.pods, name)
}

// stopStream stops one host's stream before the others.
func (tr *nodesTraffic) stopStream(t *testing.T, name string) {
	t.Helper()
	res, fails := stopHit(t, tr.procs[name])
	tr.done = append(tr.done, streamResult{name, res, fails})
	delete(tr.procs, name)
}

// burstable asks for cpu and 16 MiB: a pod's container above BestEffort.
func burstable(cpu string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("16Mi")}}
}

// streamResult is one stream's figures.
type streamResult struct {
	name     string
	res      nettest.HitResult
	failures []hitFailure
}

// stop ends every stream; it returns the attempts and failures in all,
// and fails the test for a failed connection or a stream that barely ran.
func (tr *nodesTraffic) stop(t *testing.T) (attempted, failed int) {
	t.Helper()
	for _, s := range tr.results(t) {
		attempted += s.res.Total() + len(s.failures)
		failed += len(s.failures)
		if len(s.failures) > 0 {
			t.Errorf("stream %s: %d of %d connections failed: %v", s.name, len(s.failures), s.res.Total()+len(s.failures), s.failures)
		}
	}
	return attempted, failed
}

// results ends every stream and returns their results by name, each
// logged; a stream that barely ran fails the test.
func (tr *nodesTraffic) results(t *testing.T) []streamResult {
	t.Helper()
	all := tr.done
	for name, p := range tr.procs {
		res, fails := stopHit(t, p)
		all = append(all, streamResult{name, res, fails})
	}
	for _, name := range tr.pods {
		all = append(all, tr.stopPod(t, name)...)
	}
	tr.syns.stop(t)
	for name, now := range tr.b.dropCountersOf(t) {
		if before, ok := tr.drops[name]; ok {
			t.Logf("%s: kernel drop counters during the streams: %s", name, now.since(before))
		}
	}
	slices.SortFunc(all, func(a, b streamResult) int { return strings.Compare(a.name, b.name) })
	for _, s := range all {
		t.Logf("stream %s: %d answered (%v), %d failed %v", s.name, s.res.Total(), s.res.Answers, len(s.failures), s.failures[:min(3, len(s.failures))])
		if s.res.Total() < 20 {
			t.Errorf("stream %s: only %d answers: the traffic did not run", s.name, s.res.Total())
		}
	}
	return all
}

// stopPod ends a traffic pod's streams (SIGTERM to each container's
// process through containerd: the hit prints its result and exits) and
// reads their results from the containers' logs.
func (tr *nodesTraffic) stopPod(t *testing.T, name string) []streamResult {
	t.Helper()
	ctx, api := tr.b.ctx, tr.b.c.Client.CoreV1().Pods(chaosNodesNS)
	p, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := tr.b.c.Node(p.Spec.NodeName)
	for _, cs := range p.Status.ContainerStatuses {
		if _, err := n.Ctr(ctx, "task", "kill", "--signal", "SIGTERM", strings.TrimPrefix(cs.ContainerID, "containerd://")); err != nil {
			t.Errorf("pod %s, container %s: %v", name, cs.Name, err)
		}
	}
	waitFor(ctx, t, "pod "+name+" done", func() (bool, string) {
		p, err := api.Get(ctx, name, metav1.GetOptions{})
		return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), cluster.PodSummary(p)
	})
	var out []streamResult
	for _, c := range p.Spec.Containers {
		b, err := api.GetLogs(name, &corev1.PodLogOptions{Container: c.Name}).DoRaw(ctx)
		var res nettest.HitResult
		if err == nil {
			err = json.Unmarshal([]byte(lastLine(string(b))), &res)
		}
		if err != nil {
			t.Errorf("pod %s, container %s: result %q: %v", name, c.Name, b, err)
			continue
		}
		out = append(out, streamResult{name + "/" + c.Name, res, hitFailures(res)})
	}
	if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete pod %s: %v", name, err)
	}
	return out
}

// leaks compares each node's kernel with what it should hold and returns
// the leaks in all; something missing after a minute fails the test. What
// it should hold is read again before each read of the kernel: the live
// Service's endpoints follow its pods' readiness probes, which fail now
// and then on a loaded node.
func (b *nodesBed) leaks(t *testing.T) int {
	t.Helper()
	leaks := 0
	for _, n := range b.c.Nodes {
		_, d := convergeOnLive(t, n.VM, n.Name+": the Services after the case", func() chaos.Expected { return b.expected(t, n) }, time.Minute)
		leaks += len(d.Leaks)
	}
	return leaks
}
