package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// Addresses of the two-node tests on the nodes' segment.
var (
	twoNodeExternalIP = cluster.SegmentAddr(201)
	twoNodeLBIP       = cluster.SegmentAddr(202)
	twoNodeRangesLBIP = cluster.SegmentAddr(203)
	// notOutside is an address on the segment that no host has: a
	// source range that excludes the outside host.
	notOutside = cluster.SegmentAddr(99) + "/32"
)

// TestTwoNodes: a real cluster of two nodes (each a VM with kubelet,
// containerd, crun and the CNI bridge; the control plane on the host) on
// a private segment, and a host outside the cluster on that segment, with
// no kube-proxy: ipvs-proxy's DaemonSet from deploy/ with the shipped
// ConfigMap (no cluster CIDR). First, on the fresh cluster, the upstream
// core: Kubernetes' own [Conformance] tests of the proxy's hardest paths
// (upstream.NarrowToCore; report in bin/conformance/core). Then exec and
// logs go through the apiserver to either node; the `kubernetes` Service is programmed on both nodes and
// answers a pod. The only backend runs on node-2; what each client
// reaches, and which address the backend sees, is what a user of a real
// cluster would check:
//   - connection tracking is set as kube-proxy sets it (table size,
//     established and close-wait timeouts) on both nodes;
//   - a pod on node-1 reaches the clusterIP, seen with its own address;
//   - node-1's host reaches the clusterIP (the reply must come back to a
//     node address, not to the VIP that node-2 also owns);
//   - the outside host reaches a NodePort (externalTrafficPolicy Cluster)
//     on node-1, masqueraded to node-1's address;
//   - externalTrafficPolicy Local: the node port is not answered on
//     node-1, answered on node-2 with the outside host's own address; the
//     health-check node port says 503 on node-1 and 200 on node-2; a
//     LoadBalancer IP routed to node-2 is answered with the client's
//     address, routed to node-1 it is not;
//   - internalTrafficPolicy Local with the only endpoint on node-2: no
//     connection from node-1 (pod or host), answered on node-2;
//   - loadBalancerSourceRanges hold on both nodes, and follow a change;
//   - the only endpoint of another Service moves from node-1 to node-2
//     (new pod, old one deleted) under traffic from node-1's host: no new
//     connection fails, a held one stays on the old pod while it
//     terminates; then, while node-2's only endpoint terminates, node-2's
//     health check says 503 and its node port is still answered by it;
//   - ARP on the segment for the LoadBalancer IP: every node answers
//     without strict ARP (as shipped), none with it (no announcer runs),
//     nor for the addresses of the Service range, routed as local
//     through the agent's interface as shipped;
//   - with the agents told the pods' bridge (detectLocalMode
//     BridgeInterface), a pod on node-1 reaches that Local Service's
//     externalIP and LoadBalancer IP (in-cluster traffic is not
//     "external"; without a way to tell pods' traffic, it is dropped as
//     the ConfigMap says).
//
// The cluster is dual-stack (IPv4 the primary family): the same server
// and client behind IPv6-only Services, over the nodes' and the outside
// host's IPv6 addresses on the segment, show the clusterIP from a pod and
// from node-1's host, both NodePort policies with the address the server
// sees, the health-check node port, a Local LoadBalancer IP routed to
// each node, internalTrafficPolicy Local and source ranges on both nodes
// (twoNodesIPv6).
func TestTwoNodes(t *testing.T) {
	assets := vm.Require(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	suite, images := upstreamCoreSuite(ctx, t)
	c, err := cluster.Start(ctx, cluster.Options{Assets: assets, Log: t.Logf, Nodes: 2, Outside: true, DualStack: true, Images: images})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("TIMING 2 nodes Ready: %s", c.NodeReady.Round(time.Millisecond))
	if err := c.DeployIPVSProxyShipped(ctx, deployDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING ipvs-proxy ready on both nodes after %s", time.Since(began).Round(time.Millisecond))
	// Kubernetes' own tests first, on the fresh cluster; the rest of the
	// test runs whatever they found.
	t.Run("upstream core", func(t *testing.T) { runUpstreamCore(ctx, t, c, suite) })
	cs := c.Client
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]

	ns := "two-nodes"
	clusterNamespace(ctx, t, cs, ns)
	server := agentPod("server", []string{"/vmagent", "serve", "--name", "server", "--port", "8080", "--tcp"})
	server.Labels = map[string]string{"app": "server"}
	server.Spec.NodeName = nodeB.Name
	client := agentPod("client", []string{"/vmagent", "serve", "--name", "client", "--port", "8081", "--tcp"})
	client.Labels = map[string]string{"app": "client"}
	client.Spec.NodeName = nodeA.Name
	pods := runPods(ctx, t, c, ns, server, client)
	serverIP, clientIP := pods["server"].Status.PodIP, pods["client"].Status.PodIP
	t.Logf("server %s on %s, client %s on %s", serverIP, nodeB.Name, clientIP, nodeA.Name)

	port := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
	sel := map[string]string{"app": "server"}
	mk := func(svc *corev1.Service) *corev1.Service {
		svc.Spec.Selector, svc.Spec.Ports = sel, port
		got, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	clusterIP := mk(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "cluster-ip"}})
	npCluster := mk(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "np-cluster"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}})
	lbLocal := mk(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lb-local"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			ExternalIPs: []string{twoNodeExternalIP}}})
	lbLocal.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: twoNodeLBIP}}
	if lbLocal, err = cs.CoreV1().Services(ns).UpdateStatus(ctx, lbLocal, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	itpLocal := mk(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "itp-local"},
		Spec: corev1.ServiceSpec{InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal)}})
	lbRanges := mk(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lb-ranges"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerSourceRanges: []string{notOutside}}})
	lbRanges.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: twoNodeRangesLBIP}}
	if lbRanges, err = cs.CoreV1().Services(ns).UpdateStatus(ctx, lbRanges, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip := clusterIP.Spec.ClusterIP + ":80"
	npPort := strconv.Itoa(int(npCluster.Spec.Ports[0].NodePort))
	localPort := strconv.Itoa(int(lbLocal.Spec.Ports[0].NodePort))
	hcPort := strconv.Itoa(int(lbLocal.Spec.HealthCheckNodePort))

	// Both agents programmed: the clusterIP and the LoadBalancer IP with
	// the server on node-2 as their real server on both nodes (a Local
	// Service keeps every endpoint for in-cluster clients).
	for _, n := range c.Nodes {
		for _, addr := range []string{vip, twoNodeLBIP + ":80", twoNodeRangesLBIP + ":80"} {
			waitFor(ctx, t, addr+" in IPVS on "+n.Name, func() (bool, string) {
				out, err := n.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", addr)
				return err == nil && strings.Contains(out, serverIP+":8080"), out + fmt.Sprint(err)
			})
		}
	}

	t.Run("exec and logs through the apiserver", func(t *testing.T) {
		// No fallback to ctr here: the exec path itself is under test.
		out, err := podExecAPIServer(ctx, t, c, ns, "client", contains("refused"), "/vmagent", "http", "--timeout", "2s", "http://127.0.0.1:1/")
		if err == nil || !strings.Contains(out, "refused") {
			t.Errorf("exec in pod client on %s: %q, %v; want the agent's connection-refused error", nodeA.Name, out, err)
		}
		// The server on node-2 printed READY once it listened.
		waitFor(ctx, t, "pod server's log", func() (bool, string) {
			b, err := cs.CoreV1().Pods(ns).GetLogs("server", &corev1.PodLogOptions{}).DoRaw(ctx)
			return err == nil && strings.Contains(string(b), "READY"), fmt.Sprintf("%q %v", b, err)
		})
	})
	t.Run("the kubernetes Service on every node", func(t *testing.T) {
		for _, n := range c.Nodes {
			waitFor(ctx, t, "the kubernetes Service in IPVS on "+n.Name, func() (bool, string) {
				out, err := n.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", cluster.KubernetesIP+":443")
				return err == nil && strings.Contains(out, c.APIServerAddr()), out + fmt.Sprint(err)
			})
		}
		// From a pod, verified with the pod's service-account CA.
		out, err := podExec(ctx, t, c, ns, "client", contains("v1.36.3"), "/vmagent", "http", "--cacert", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
			"https://"+cluster.KubernetesIP+"/version")
		if err != nil || !strings.Contains(out, `"status":200`) || !strings.Contains(out, "v1.36.3") {
			t.Errorf("pod client -> https://%s/version: %q, %v", cluster.KubernetesIP, out, err)
		}
	})
	t.Run("connection tracking set as kube-proxy sets it on every node", func(t *testing.T) {
		// kube-proxy's defaults: 32768 entries per CPU, at least 131072.
		for _, n := range c.Nodes {
			out, err := n.VM.RunOK(ctx, "nproc", "--all")
			cpus, cerr := strconv.Atoi(strings.TrimSpace(out))
			if err != nil || cerr != nil {
				t.Fatalf("%s: nproc: %q, %v", n.Name, out, err)
			}
			size := max(32768*cpus, 131072)
			want := map[string]string{
				"net/netfilter/nf_conntrack_max":                     strconv.Itoa(size),
				"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
				"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
			}
			if out, err := n.VM.RunOK(ctx, "cat", "/proc/sys/net/netfilter/nf_conntrack_buckets"); err != nil {
				t.Errorf("%s: nf_conntrack_buckets: %v", n.Name, err)
			} else if b, _ := strconv.Atoi(strings.TrimSpace(out)); b < size/4 {
				t.Errorf("%s: nf_conntrack_buckets = %d; want at least %d (a quarter of the table)", n.Name, b, size/4)
			}
			for name, w := range want {
				out, err := n.VM.RunOK(ctx, "cat", "/proc/sys/"+name)
				if got := strings.TrimSpace(out); err != nil || got != w {
					t.Errorf("%s: %s = %q, %v; want %s", n.Name, name, got, err, w)
				}
			}
		}
	})
	clusterIPAcrossNodes(ctx, t, c, ns, "", vip, clusterIP.Spec.ClusterIP, clientIP)
	t.Run("outside to NodePort with policy Cluster on the node without the endpoint", func(t *testing.T) {
		hit := vmHit(ctx, t, c.Outside, nodeA.IP+":"+npPort, 3)
		if hit.Answers["server"] != 3 || hit.Clients[nodeA.IP] != 3 {
			t.Errorf("outside -> %s:%s: %+v; want 3 answers, masqueraded to %s", nodeA.IP, npPort, hit, nodeA.IP)
		}
	})
	t.Run("outside to NodePort with policy Local", func(t *testing.T) {
		if hit := vmHit(ctx, t, c.Outside, nodeA.IP+":"+localPort, 2, "--timeout", "2s"); hit.Total() != 0 {
			t.Errorf("outside -> %s:%s (no local endpoint): %+v; want no answer", nodeA.IP, localPort, hit)
		}
		hit := vmHit(ctx, t, c.Outside, nodeB.IP+":"+localPort, 3)
		if hit.Answers["server"] != 3 || hit.Clients[cluster.OutsideIP] != 3 {
			t.Errorf("outside -> %s:%s: %+v; want 3 answers seen from the outside host's own %s", nodeB.IP, localPort, hit, cluster.OutsideIP)
		}
	})
	t.Run("health-check node port", func(t *testing.T) {
		for _, tc := range []struct {
			node *cluster.Node
			want int
		}{{nodeA, 503}, {nodeB, 200}} {
			if got, out := healthCheck(ctx, c, tc.node, hcPort); got != tc.want {
				t.Errorf("outside GET %s:%s: %s; want status %d", tc.node.IP, hcPort, out, tc.want)
			}
		}
	})
	lbIPRoutedPerNode(ctx, t, c, segmentIPv4, twoNodeLBIP)
	t.Run("internalTrafficPolicy Local with the only endpoint on the other node", func(t *testing.T) {
		addr := itpLocal.Spec.ClusterIP + ":80"
		if hit := podHit(ctx, t, c, ns, "client", addr, 1); hit.Total() != 0 {
			t.Errorf("pod client on %s -> %s: %+v; want no answer", nodeA.Name, addr, hit)
		}
		if hit := vmHit(ctx, t, nodeA.VM, addr, 1, "--timeout", "2s"); hit.Total() != 0 {
			t.Errorf("%s's host -> %s: %+v; want no answer", nodeA.Name, addr, hit)
		}
		if hit := vmHit(ctx, t, nodeB.VM, addr, 2); hit.Answers["server"] != 2 {
			t.Errorf("%s's host -> %s: %+v; want 2 answers from its local endpoint", nodeB.Name, addr, hit)
		}
	})
	sourceRangesOnEveryNode(ctx, t, c, segmentIPv4, lbRanges, twoNodeRangesLBIP, notOutside)
	npPort6, hcPort6 := twoNodesIPv6(ctx, t, c, ns, pods["server"], pods["client"])
	var moving *corev1.Service
	t.Run("endpoint moving from node-1 to node-2 under traffic", func(t *testing.T) {
		moving = moveEndpointAcrossNodes(ctx, t, c, ns, segmentIPv4, clientIP)
	})
	if moving != nil { // else the subtest above failed
		t.Run("health check while the only endpoint terminates", func(t *testing.T) {
			onlyEndpointTerminating(ctx, t, c, ns, moving)
		})
	}
	t.Run("ARP for the LoadBalancer IP without strict ARP: every node answers", func(t *testing.T) {
		// And for an address of the routed Service range: the control
		// of the strict-ARP case below.
		for _, ip := range []string{twoNodeLBIP, "10.96.255.254"} {
			if got := arpAnswers(ctx, t, c, ip); len(got) != len(c.Nodes) {
				t.Errorf("ARP answers for %s on the segment (strictARP: false, as shipped): from %v; want one from each of the %d nodes", ip, got, len(c.Nodes))
			}
		}
	})

	// The agents learn how to tell pods' traffic (the ConfigMap as an
	// operator changes it: detectLocalMode BridgeInterface, the CNI's
	// bridge, still no cluster CIDR) and serve IPv4 node ports on the
	// segment only, restarted as a rollout would.
	restartAgentsWithConfig(ctx, t, c,
		"strictARP: false", "strictARP: true",
		"detectLocalMode: ClusterCIDR", "detectLocalMode: BridgeInterface",
		`bridgeInterface: ""`, "bridgeInterface: cni0",
		"nodePortAddresses: []", "nodePortAddresses: ["+cluster.SegmentCIDR+"]")
	ipv6NodePortsKept(ctx, t, c, npPort6, hcPort6, npPort)
	t.Run("pod to a Local Service's external addresses on the other node", func(t *testing.T) {
		for _, addr := range []string{twoNodeExternalIP + ":80", twoNodeLBIP + ":80"} {
			hit := podHit(ctx, t, c, ns, "client", addr, 2)
			if hit.Answers["server"] != 2 {
				t.Errorf("pod client on %s -> %s (Local, endpoint on %s): %+v; want 2 answers", nodeA.Name, addr, nodeB.Name, hit)
			}
		}
	})
	t.Run("ARP with strict ARP: no node answers for Service addresses", func(t *testing.T) {
		// As shipped, the Service range is one local route through the
		// agent's interface on each node, no clusterIP bound: the
		// clusterIP and an address of the range that is no Service's
		// are local yet configured on no interface.
		for _, n := range c.Nodes {
			out, err := n.VM.RunOK(ctx, "ip", "-4", "route", "show", "table", "local", "dev", proxyIface)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "local "+cluster.ServiceCIDR+" ") {
				t.Errorf("%s: local routes through %s:\n%s\nwant %s (routeServiceCIDRs: true, as shipped)", n.Name, proxyIface, out, cluster.ServiceCIDR)
			}
		}
		for _, ip := range []string{twoNodeLBIP, twoNodeExternalIP, clusterIP.Spec.ClusterIP, "10.96.255.254"} {
			if got := arpAnswers(ctx, t, c, ip); len(got) != 0 {
				t.Errorf("ARP answers for %s on the segment (strictARP: true): from %v; want none (no announcer runs)", ip, got)
			}
		}
	})
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// arpAnswers sends ARP requests for ip from the outside host and returns
// the MACs that answered, as the segment's hub saw them.
func arpAnswers(ctx context.Context, t *testing.T, c *cluster.Cluster, ip string) map[string]bool {
	t.Helper()
	target := net.ParseIP(ip).To4()
	// Ethernet type ARP, opcode 2 (reply), sender IP = ip: the
	// sender's MAC.
	return segmentAnswers(ctx, t, c, func(f []byte) (net.HardwareAddr, bool) {
		ok := len(f) >= 42 && f[12] == 0x08 && f[13] == 0x06 && f[20] == 0 && f[21] == 2 && net.IP(f[28:32]).Equal(target)
		return net.HardwareAddr(f[22:28]), ok
	}, "arping", "-c", "2", "-w", "3", "-I", cluster.SegmentIface, ip)
}

// ndpAnswers has the outside host resolve ip, an address of the segment's
// IPv6 prefix, by neighbour discovery (a ping, which solicits it) and
// returns the MACs that advertised it, as the segment's hub saw them.
func ndpAnswers(ctx context.Context, t *testing.T, c *cluster.Cluster, ip string) map[string]bool {
	t.Helper()
	target := net.ParseIP(ip)
	// Ethernet type IPv6, next header ICMPv6 (no extension header:
	// the kernel adds none to a neighbour advertisement), ICMPv6 type
	// 136 (neighbour advertisement), target = ip: the frame's sender.
	return segmentAnswers(ctx, t, c, func(f []byte) (net.HardwareAddr, bool) {
		ok := len(f) >= 78 && f[12] == 0x86 && f[13] == 0xdd && f[20] == 58 && f[54] == 136 && net.IP(f[62:78]).Equal(target)
		return net.HardwareAddr(f[6:12]), ok
	}, "ping6", "-c", "2", "-w", "3", "-I", cluster.SegmentIface, ip)
}

// segmentAnswers runs argv on the outside host and returns the MACs of the
// frames on the segment that answer matches, while it runs.
func segmentAnswers(ctx context.Context, t *testing.T, c *cluster.Cluster, answer func(frame []byte) (net.HardwareAddr, bool), argv ...string) map[string]bool {
	t.Helper()
	var mu sync.Mutex
	macs := map[string]bool{}
	stop := c.Hub.Watch(func(f []byte) {
		if mac, ok := answer(f); ok {
			mu.Lock()
			macs[mac.String()] = true
			mu.Unlock()
		}
	})
	defer stop()
	// arping and ping exit 1 when nothing answers: the hub's count is
	// the result.
	r, err := c.Outside.Run(ctx, argv...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	time.Sleep(200 * time.Millisecond) // the last answer through the hub
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s: answered by %v (%s)", strings.Join(argv, " "), macs, strings.TrimSpace(r.Stdout))
	return maps.Clone(macs)
}

// vmHit runs `vmagent hit` over TCP to addr n times in v's root namespace
// (extra: more flags) and returns its result; failed attempts are in the
// result, not an error.
func vmHit(ctx context.Context, t *testing.T, v *vm.VM, addr string, n int, extra ...string) nettest.HitResult {
	t.Helper()
	out, err := v.RunOK(ctx, append([]string{"vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", strconv.Itoa(n)}, extra...)...)
	if err != nil {
		t.Fatalf("hit %s: %v: %s", addr, err, out)
	}
	var hit nettest.HitResult
	if err := json.Unmarshal([]byte(out), &hit); err != nil {
		t.Fatalf("hit %s: %q: %v", addr, out, err)
	}
	return hit
}

// unexcusedOnNodes is unexcusedFailures for a move between two nodes: a
// failed connection whose real server (dests: by local address) is
// remoteIP, on the second node, is excused by that node's control
// (remoteControl) failing; any other (on the client's node, or whose
// real server is not known: a failed connect names no local port) by the
// client node's control (localControl).
func unexcusedOnNodes(t *testing.T, failures []hitFailure, dests map[string]string, remoteIP string, localControl, remoteControl []hitFailure) []string {
	t.Helper()
	var unexcused []string
	for _, fl := range failures {
		dest, excuse := dests[localAddr(fl.err)], localControl
		if dest == remoteIP {
			excuse = remoteControl
		}
		t.Logf("failed connection %s: its real server %q", fl, dest)
		unexcused = append(unexcused, unexcusedFailures(t, []hitFailure{fl}, excuse)...)
	}
	return unexcused
}

// ipvsConnDestinations maps each client address ("ip:port", as Go
// writes it) of v's IPVS connection table (`ipvsadm -Lnc`) to the real
// server's IP that IPVS sent it to. An entry outlives its connection by
// its state's timeout (a minute or two), so a failed attempt's is there
// just after it.
func ipvsConnDestinations(ctx context.Context, t *testing.T, v *vm.VM) map[string]string {
	t.Helper()
	out, err := v.RunOK(ctx, "ipvsadm", "-Lnc")
	if err != nil {
		t.Logf("ipvsadm -Lnc: %v", err)
		return nil
	}
	dests := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		src, err1 := netip.ParseAddrPort(f[3])
		dst, err2 := netip.ParseAddrPort(f[5])
		if err1 == nil && err2 == nil {
			dests[src.String()] = dst.Addr().String()
		}
	}
	return dests
}

// localAddr is the local address of a connection in a Go network error
// ("read tcp 10.96.0.5:41432->10.96.0.5:80: i/o timeout"), "" if it names
// none (a failed connect).
func localAddr(err string) string {
	m := localAddrRE.FindStringSubmatch(err)
	if m == nil {
		return ""
	}
	a, perr := netip.ParseAddrPort(m[1])
	if perr != nil {
		return ""
	}
	return a.String()
}

var localAddrRE = regexp.MustCompile(`(\S+)->\S+: `)

// restartAgentsWithConfig changes ipvs-proxy's ConfigMap's config.yaml
// (oldNew: pairs of a text it holds and its replacement), deletes the
// DaemonSet's pods and waits until a new pod is ready on every node.
func restartAgentsWithConfig(ctx context.Context, t *testing.T, c *cluster.Cluster, oldNew ...string) {
	t.Helper()
	cms := c.Client.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	cm, err := cms.Get(ctx, "ipvs-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := cm.Data["config.yaml"]
	for i := 0; i+1 < len(oldNew); i += 2 {
		if !strings.Contains(cfg, oldNew[i]) {
			t.Fatalf("no %q in ipvs-proxy's config.yaml to change:\n%s", oldNew[i], cfg)
		}
		cfg = strings.Replace(cfg, oldNew[i], oldNew[i+1], 1)
	}
	cm.Data["config.yaml"] = cfg
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	const sel = cluster.IPVSProxyPods
	pods := c.Client.CoreV1().Pods(metav1.NamespaceSystem)
	old, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	for _, p := range old.Items {
		gone[string(p.UID)] = true
	}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "a new ipvs-proxy pod ready on every node", func() (bool, string) {
		pl, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, err.Error()
		}
		ready, last := 0, ""
		for i := range pl.Items {
			p := &pl.Items[i]
			last += cluster.PodSummary(p) + "; "
			if gone[string(p.UID)] {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == len(c.Nodes), last
	})
}

// moveEndpointAcrossNodes moves a Service's only endpoint from node-1 to
// node-2, as a rescheduled pod does, while node-1's host opens a new
// connection every 100 ms and holds one: no new connection may fail
// (unless a control Service failed too: a stalled VM), the held one stays
// on the old pod while it terminates (it serves 10 s after SIGTERM) and
// ends with it, and new connections reach the new pod. On a failure the
// test shows the timeline: the EndpointSlice's changes, node-1's IPVS
// table sampled every 300 ms, and its agent's log. f is the family of the
// Services and of the addresses used (the IPv6 run's pods and Services
// are named with its suffix); clientIP is the client pod's address of
// that family, the control Service's endpoint.
func moveEndpointAcrossNodes(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, f segmentFamily, clientIP string) *corev1.Service {
	cs := c.Client
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	oldName, newName, app := "old"+f.suffix, "new"+f.suffix, "moving"+f.suffix
	// drain: how long the pod serves after SIGTERM.
	pod := func(name string, on *cluster.Node, drain time.Duration) *corev1.Pod {
		p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080", "--tcp", "--drain", drain.String()})
		p.Labels = map[string]string{"app": app}
		p.Spec.NodeName = on.Name
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(drain/time.Second) + 30)
		// Ready only once it accepts connections: without a probe the
		// kubelet calls a pod ready when its container starts, before
		// the server listens, and the proxy rightly sends it traffic
		// (one refused connection in five runs, at the moment the new
		// real server was added).
		p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
		return p
	}
	svc := func(name string, sel map[string]string, target int32, spec corev1.ServiceSpec) *corev1.Service {
		spec.Selector, spec.Ports = sel, []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(target), Protocol: corev1.ProtocolTCP}}
		spec.IPFamilies, spec.IPFamilyPolicy = []corev1.IPFamily{f.ipFamily}, ptr.To(corev1.IPFamilyPolicySingleStack)
		s, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// weightsOn waits until node-1's IPVS gives the virtual server addr's
	// real servers (pod IPs) the weights in want, -1 for "absent or 0"
	// (a real server that drains stays, at weight 0, while the kernel
	// counts connections on it: up to 2 minutes of TIME_WAIT).
	weightsOn := func(addr string, want map[string]int) {
		waitFor(ctx, t, fmt.Sprintf("%s in IPVS on %s with weights %v", addr, nodeA.Name, want), func() (bool, string) {
			out, err := nodeA.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", addr)
			if err != nil {
				return false, err.Error()
			}
			return weightsMatch(ipvsWeights(out), want), out
		})
	}
	oldIP := f.podIP(t, runPods(ctx, t, c, ns, pod(oldName, nodeA, 10*time.Second))[oldName])
	// A LoadBalancer (no ingress IP: its node port and health-check node
	// port are what is used) with externalTrafficPolicy Local, so that
	// its health check follows the endpoint too.
	moving := svc(app, map[string]string{"app": app}, 8080, corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal})
	vip := net.JoinHostPort(moving.Spec.ClusterIP, "80")
	// The controls, which do not change: the client pod on node-1, and
	// the server pod on node-2 (a stall of node-2 alone fails
	// connections to the new pod and not the first control).
	control := net.JoinHostPort(svc("control"+f.suffix, map[string]string{"app": "client"}, 8081, corev1.ServiceSpec{}).Spec.ClusterIP, "80")
	controlB := net.JoinHostPort(svc("control-b"+f.suffix, map[string]string{"app": "server"}, 8080, corev1.ServiceSpec{}).Spec.ClusterIP, "80")
	serverPod, err := cs.CoreV1().Pods(ns).Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	weightsOn(vip, map[string]int{oldIP: 1})
	weightsOn(control, map[string]int{clientIP: 1})
	weightsOn(controlB, map[string]int{f.podIP(t, serverPod): 1})
	timeline := watchMove(ctx, t, c, ns, app, nodeA, vip)

	hit, controlHit, hold := startTraffic(ctx, t, nodeA.VM, vip, control)
	controlHitB := startHit(ctx, t, nodeA.VM, controlB)
	time.Sleep(2 * time.Second) // traffic before the move

	// The new pod serves 60 s after its SIGTERM: the next subtest's window.
	newIP := f.podIP(t, runPods(ctx, t, c, ns, pod(newName, nodeB, time.Minute))[newName])
	weightsOn(vip, map[string]int{oldIP: 1, newIP: 1})
	timeline.mark("deleting pod " + oldName)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, oldName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	answersAtDelete := strings.Count(hold.Output(), "answer ")
	waitWithin(ctx, t, 3*time.Minute, "pod "+oldName+" gone", func() (bool, string) {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, oldName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	weightsOn(vip, map[string]int{newIP: 1, oldIP: -1})
	time.Sleep(2 * time.Second) // traffic after the move

	res, failures := stopHit(t, hit)
	_, controlFailures := stopHit(t, controlHit)
	_, controlFailuresB := stopHit(t, controlHitB)
	t.Logf("endpoint moved from %s (%s) to %s (%s): new connections %d, failed %d; answers %v; control failed %d on %s, %d on %s",
		nodeA.Name, oldIP, nodeB.Name, newIP, res.Total()+len(failures), len(failures), res.Answers,
		len(controlFailures), nodeA.Name, len(controlFailuresB), nodeB.Name)
	unexcused := unexcusedOnNodes(t, failures, ipvsConnDestinations(ctx, t, nodeA.VM), newIP, controlFailures, controlFailuresB)
	if len(unexcused) > 0 {
		t.Errorf("%d new connections failed while the endpoint moved across nodes and the control answered: %v", len(unexcused), unexcused)
	}
	if res.Answers[newName] == 0 || res.Answers[oldName] == 0 {
		t.Errorf("new connections answered by %v; want both the old pod (before) and the new one (after)", res.Answers)
	}
	if err := hold.WaitFor(ctx, "error "); err != nil {
		t.Errorf("the held connection did not end with its pod: %v", err)
	}
	// One connection, hence one backend: that it answered while the old
	// pod drained and ended with it is what shows the drain.
	total := strings.Count(hold.Output(), "answer ")
	// It asks every 200 ms: 10 answers are 2 s of the pod's 10 s drain.
	if total-answersAtDelete < 10 {
		t.Errorf("the held connection got %d answers while the old pod terminated (%d in all); want 10 or more", total-answersAtDelete, total)
	}
	t.Logf("held connection: %d answers, %d after the old pod's deletion; ended with %q", total, total-answersAtDelete, lastLine(hold.Output()))
	return moving
}

// onlyEndpointTerminating deletes the pod "new" on node-2, the only
// endpoint of moving (a LoadBalancer with externalTrafficPolicy Local, its
// server serves 60 s after SIGTERM): while it terminates, node-2's health
// check node port says 503 (load balancers must drain the node: it has no
// ready endpoint) and its node port is still answered by that pod (the
// serving-terminating fallback); node-1 says 503 throughout.
func onlyEndpointTerminating(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, moving *corev1.Service) {
	cs := c.Client
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	hcPort := strconv.Itoa(int(moving.Spec.HealthCheckNodePort))
	npAddr := nodeB.IP + ":" + strconv.Itoa(int(moving.Spec.Ports[0].NodePort))
	waitFor(ctx, t, "health check 200 on "+nodeB.Name, func() (bool, string) {
		got, out := healthCheck(ctx, c, nodeB, hcPort)
		return got == 200, out
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// The pod serves 60 s after its SIGTERM: the health check must turn,
	// and the node port be tried, well within that.
	var out string
	waitWithin(ctx, t, 30*time.Second, "health check 503 on "+nodeB.Name+" while its only endpoint terminates", func() (bool, string) {
		var got int
		got, out = healthCheck(ctx, c, nodeB, hcPort)
		return got == 503, out
	})
	t.Logf("%s's health check said 503 %s after the deletion: %s", nodeB.Name, time.Since(deleted).Round(time.Millisecond), out)
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "new", metav1.GetOptions{}); err != nil {
		t.Fatalf("pod new already gone (%v): the check above did not see it terminating", err)
	}
	hit := vmHit(ctx, t, c.Outside, npAddr, 2)
	if hit.Answers["new"] != 2 || hit.Clients[cluster.OutsideIP] != 2 {
		t.Errorf("outside -> %s while its only endpoint terminates (%s after its deletion, it serves 60 s): %+v; want 2 answers from pod new (serving, terminating), seen from %s",
			npAddr, time.Since(deleted).Round(time.Millisecond), hit, cluster.OutsideIP)
	}
	if got, out := healthCheck(ctx, c, nodeA, hcPort); got != 503 {
		t.Errorf("%s's health check: %s; want 503 (no endpoint there)", nodeA.Name, out)
	}
}

// healthCheck GETs a node's health-check node port from the outside host
// and returns the HTTP status (0 when there was no answer) and what it
// printed.
func healthCheck(ctx context.Context, c *cluster.Cluster, n *cluster.Node, port string) (int, string) {
	return healthCheckAt(ctx, c, n.IP, port)
}

// clusterIPAcrossNodes: the pod "client" on node-1 and node-1's host reach
// vip (clusterIP ip), whose only endpoint, "server", is on node-2; the
// server sees the pod's own clientIP, and never the clusterIP (a reply to
// it would stay on node-2). prefix names the family in the subtests.
// segmentFamily is one address family of the two-node segment: the
// prefix of its subtests' names, a node's address, the outside host's and
// a host route's length.
type segmentFamily struct {
	prefix  string
	nodeIP  func(*cluster.Node) string
	outside string
	host    string // "/32" or "/128"
	// ipFamily, suffix, podIP: the family of a Service, the suffix of the
	// names of a subtest's objects, a pod's address of the family.
	ipFamily corev1.IPFamily
	suffix   string
	podIP    func(*testing.T, *corev1.Pod) string
}

var (
	segmentIPv4 = segmentFamily{prefix: "", nodeIP: func(n *cluster.Node) string { return n.IP }, outside: cluster.OutsideIP, host: "/32",
		ipFamily: corev1.IPv4Protocol, podIP: func(_ *testing.T, p *corev1.Pod) string { return p.Status.PodIP }}
	segmentIPv6 = segmentFamily{prefix: "IPv6: ", nodeIP: func(n *cluster.Node) string { return n.IP6 }, outside: cluster.OutsideIP6, host: "/128",
		ipFamily: corev1.IPv6Protocol, suffix: "-6", podIP: podIPv6}
)

// lbIPRoutedPerNode: the outside host routes lbIP (the ingress IP of a
// LoadBalancer Service whose policy is Local and whose only endpoint is
// on node-2, port 80) to one node at a time, as a router fed by a BGP
// speaker would: node-2 answers, the server seeing the outside host's own
// address; node-1 does not.
func lbIPRoutedPerNode(ctx context.Context, t *testing.T, c *cluster.Cluster, f segmentFamily, lbIP string) {
	t.Run(f.prefix+"outside to LoadBalancer IP with policy Local, routed to each node", func(t *testing.T) {
		addr := net.JoinHostPort(lbIP, "80")
		for _, tc := range []struct {
			node   *cluster.Node
			answer bool
		}{{c.Nodes[0], false}, {c.Nodes[1], true}} {
			if _, err := c.Outside.RunOK(ctx, "ip", "route", "replace", lbIP+f.host, "via", f.nodeIP(tc.node), "dev", cluster.SegmentIface); err != nil {
				t.Fatal(err)
			}
			hit := vmHit(ctx, t, c.Outside, addr, 2, "--timeout", "2s")
			switch {
			case tc.answer && (hit.Answers["server"] != 2 || hit.Clients[f.outside] != 2):
				t.Errorf("outside -> %s via %s: %+v; want 2 answers seen from %s", addr, tc.node.Name, hit, f.outside)
			case !tc.answer && hit.Total() != 0:
				t.Errorf("outside -> %s via %s (no local endpoint): %+v; want no answer", addr, tc.node.Name, hit)
			}
		}
	})
}

// sourceRangesOnEveryNode: svc is a LoadBalancer (ingress lbIP, port 80)
// whose source ranges are only notOutside: routed through either node,
// the outside host gets no answer; once its address joins the ranges,
// both nodes answer it.
func sourceRangesOnEveryNode(ctx context.Context, t *testing.T, c *cluster.Cluster, f segmentFamily, svc *corev1.Service, lbIP, notOutside string) {
	t.Run(f.prefix+"loadBalancerSourceRanges on every node", func(t *testing.T) {
		addr := net.JoinHostPort(lbIP, "80")
		via := func(n *cluster.Node) nettest.HitResult {
			t.Helper()
			if _, err := c.Outside.RunOK(ctx, "ip", "route", "replace", lbIP+f.host, "via", f.nodeIP(n), "dev", cluster.SegmentIface); err != nil {
				t.Fatal(err)
			}
			return vmHit(ctx, t, c.Outside, addr, 1, "--timeout", "2s")
		}
		for _, n := range c.Nodes {
			if hit := via(n); hit.Total() != 0 {
				t.Errorf("outside (%s) -> %s via %s, source ranges %v: %+v; want no answer", f.outside, addr, n.Name,
					svc.Spec.LoadBalancerSourceRanges, hit)
			}
		}
		svc = svc.DeepCopy()
		svc.Spec.LoadBalancerSourceRanges = []string{notOutside, f.outside + f.host}
		if _, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			waitWithin(ctx, t, time.Minute, "outside -> "+addr+" via "+n.Name+" answered once the outside host is in the ranges", func() (bool, string) {
				hit := via(n)
				return hit.Answers["server"] == 1, fmt.Sprintf("%+v", hit)
			})
		}
	})
}

func clusterIPAcrossNodes(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, prefix, vip, ip, clientIP string) {
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	t.Run(prefix+"pod to clusterIP on the other node", func(t *testing.T) {
		hit := podHit(ctx, t, c, ns, "client", vip, 3)
		if hit.Answers["server"] != 3 || hit.Clients[clientIP] != 3 {
			t.Errorf("pod client on %s -> %s: %+v; want 3 answers, seen from the pod's own %s", nodeA.Name, vip, hit, clientIP)
		}
	})
	t.Run(prefix+"node to clusterIP whose only endpoint is on the other node", func(t *testing.T) {
		hit := vmHit(ctx, t, nodeA.VM, vip, 3)
		if hit.Answers["server"] != 3 {
			t.Errorf("%s's host -> %s: %+v; want 3 answers (the shipped ConfigMap: no cluster CIDR)", nodeA.Name, vip, hit)
		}
		if hit.Clients[ip] != 0 {
			t.Errorf("the server saw the clusterIP %s as the client: a reply to it stays on %s", ip, nodeB.Name)
		}
		t.Logf("%s's host -> %s: %+v", nodeA.Name, vip, hit)
	})
}

// healthCheckAt is healthCheck at one of a node's addresses.
func healthCheckAt(ctx context.Context, c *cluster.Cluster, ip, port string) (int, string) {
	out, err := c.Outside.RunOK(ctx, "vmagent", "http", "http://"+net.JoinHostPort(ip, port)+"/")
	var res agentapi.HTTPResult
	if err == nil {
		err = json.Unmarshal([]byte(out), &res)
	}
	if err != nil {
		return 0, fmt.Sprintf("%q, %v", out, err)
	}
	return res.Status, strings.TrimSpace(out)
}

// ipvsWeights reads the real servers of `ipvsadm -Ln` output: their
// addresses (without the port) and weights.
// weightsMatch reports whether the real servers' weights got (IP ->
// weight) are those of want, -1 in want meaning "absent or 0".
func weightsMatch(got, want map[string]int) bool {
	for ip, w := range want {
		if g, ok := got[ip]; w >= 0 && (!ok || g != w) || w < 0 && g != 0 {
			return false
		}
	}
	return true
}

func ipvsWeights(out string) map[string]int {
	got := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != "->" {
			continue
		}
		host, _, err := net.SplitHostPort(f[1])
		w, werr := strconv.Atoi(f[3])
		if err != nil || werr != nil {
			continue // the header: "-> RemoteAddress:Port Forward Weight ..."
		}
		got[host] = w
	}
	return got
}

func TestLocalAddr(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"timeout: read tcp [fd00:10:96::525e]:41432->[fd00:10:96::525e]:80: i/o timeout", "[fd00:10:96::525e]:41432"},
		{"reset: read tcp 10.96.0.5:41432->10.96.0.5:80: read: connection reset by peer", "10.96.0.5:41432"},
		{"refused: dial tcp 10.96.0.5:80: connect: connection refused", ""},
	} {
		if got := localAddr(tc.err); got != tc.want {
			t.Errorf("localAddr(%q) = %q; want %q", tc.err, got, tc.want)
		}
	}
}

func TestUnexcusedOnNodes(t *testing.T) {
	at := time.Date(2026, 11, 28, 23, 21, 2, 0, time.UTC)
	onNew := hitFailure{at: at, err: "timeout: read tcp [fd00::a]:41432->[fd00::a]:80: i/o timeout"}
	unknown := hitFailure{at: at, err: "refused: dial tcp [fd00::a]:80: connect: connection refused"}
	dests := map[string]string{"[fd00::a]:41432": "fd00:2::5"}
	stall := []hitFailure{{at: at.Add(3 * time.Second), err: "timeout"}}
	for _, tc := range []struct {
		name                string
		failure             hitFailure
		local, remote       []hitFailure
		wantUnexcusedFailed bool
	}{
		{"on node-2, node-2 stalled", onNew, nil, stall, false},
		{"on node-2, only node-1 stalled", onNew, stall, nil, true},
		{"unknown real server, node-1 stalled", unknown, stall, nil, false},
		{"unknown real server, only node-2 stalled", unknown, nil, stall, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unexcusedOnNodes(t, []hitFailure{tc.failure}, dests, "fd00:2::5", tc.local, tc.remote)
			if (len(got) > 0) != tc.wantUnexcusedFailed {
				t.Errorf("unexcused %v; want a failure unexcused: %v", got, tc.wantUnexcusedFailed)
			}
		})
	}
}
