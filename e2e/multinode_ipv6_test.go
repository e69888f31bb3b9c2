package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
)

// The IPv6 addresses of the two-node tests on the segment, as their IPv4
// counterparts.
var (
	twoNodeLBIP6       = cluster.SegmentAddr6(202)
	twoNodeRangesLBIP6 = cluster.SegmentAddr6(203)
	notOutside6        = cluster.SegmentAddr6(99) + "/128"
)

// podIPv6 is a pod's IPv6 address (a dual-stack cluster gives it one of
// each family, IPv4 first).
func podIPv6(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is6() {
			return a.String()
		}
	}
	t.Fatalf("pod %s has no IPv6 address: %v", p.Name, p.Status.PodIPs)
	return ""
}

// twoNodesIPv6 is TestTwoNodes' IPv6 part, on its dual-stack cluster:
// the same server (on node-2) and client (a pod on node-1), behind
// IPv6-only Services; what each client reaches and which address the
// backend sees, over the nodes' IPv6 addresses on the segment: the
// clusterIP, both NodePort policies, the health check, a LoadBalancer IP
// routed to each node, internalTrafficPolicy Local, source ranges and an
// endpoint moving across nodes under traffic; and that no node advertises
// the LoadBalancer IP by neighbour discovery.
//
// It returns the node ports of its NodePort Service (policy Cluster) and
// of its Local LoadBalancer's health check, for the checks that follow a
// change of the agents' configuration.
func twoNodesIPv6(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, server, client *corev1.Pod) (npPort int32, hcPort string) {
	cs := c.Client
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	serverIP, clientIP := podIPv6(t, server), podIPv6(t, client)
	t.Logf("IPv6: server %s on %s, client %s on %s", serverIP, nodeB.Name, clientIP, nodeA.Name)
	mk := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		t.Helper()
		spec.Selector = map[string]string{"app": "server"}
		spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}
		spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		got, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	clusterIP := mk("cluster-ip-6", corev1.ServiceSpec{})
	npCluster := mk("np-cluster-6", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort})
	// (A LoadBalancer without an ingress IP: only that type gets a
	// health-check node port.)
	npLocal := mk("lb-local-6", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal})
	itpLocal := mk("itp-local-6", corev1.ServiceSpec{InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal)})
	lbRanges := mk("lb-ranges-6", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerSourceRanges: []string{notOutside6}})
	for _, lb := range []struct {
		svc **corev1.Service
		ip  string
	}{{&npLocal, twoNodeLBIP6}, {&lbRanges, twoNodeRangesLBIP6}} {
		(*lb.svc).Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb.ip}}
		got, err := cs.CoreV1().Services(ns).UpdateStatus(ctx, *lb.svc, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		*lb.svc = got
	}
	hostPort := func(host string, port int32) string { return net.JoinHostPort(host, strconv.Itoa(int(port))) }
	vip := hostPort(clusterIP.Spec.ClusterIP, 80)
	npPort = npCluster.Spec.Ports[0].NodePort
	localPort := npLocal.Spec.Ports[0].NodePort
	hcPort = strconv.Itoa(int(npLocal.Spec.HealthCheckNodePort))

	for _, n := range c.Nodes {
		for _, addr := range []string{vip, hostPort(twoNodeLBIP6, 80), hostPort(twoNodeRangesLBIP6, 80)} {
			waitFor(ctx, t, addr+" in IPVS on "+n.Name, func() (bool, string) {
				out, err := n.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", addr)
				return err == nil && strings.Contains(out, hostPort(serverIP, 8080)), out + fmt.Sprint(err)
			})
		}
	}
	t.Run("IPv6: neighbour discovery for the LoadBalancer IP: no node answers", func(t *testing.T) {
		// Linux answers a neighbour solicitation only for an address of
		// the interface it came in on (strict ARP's sysctls are IPv4's
		// alone): the agent's interface carries the LoadBalancer IP, and
		// no node may advertise it on the segment, strict ARP or not.
		// The control: a node's own address, advertised by that node.
		if got := ndpAnswers(ctx, t, c, twoNodeLBIP6); len(got) != 0 {
			t.Errorf("neighbour advertisements for %s on the segment: from %v; want none (no announcer runs)", twoNodeLBIP6, got)
		}
		if got := ndpAnswers(ctx, t, c, nodeB.IP6); len(got) != 1 {
			t.Errorf("neighbour advertisements for %s (%s's own address) on the segment: from %v; want one", nodeB.IP6, nodeB.Name, got)
		}
	})
	clusterIPAcrossNodes(ctx, t, c, ns, "IPv6: ", vip, clusterIP.Spec.ClusterIP, clientIP)
	t.Run("IPv6: outside to NodePort with policy Cluster on the node without the endpoint", func(t *testing.T) {
		addr := hostPort(nodeA.IP6, npPort)
		hit := vmHit(ctx, t, c.Outside, addr, 3)
		if hit.Answers["server"] != 3 || hit.Clients[nodeA.IP6] != 3 {
			t.Errorf("outside -> %s: %+v; want 3 answers, masqueraded to %s", addr, hit, nodeA.IP6)
		}
	})
	t.Run("IPv6: outside to NodePort with policy Local", func(t *testing.T) {
		if hit := vmHit(ctx, t, c.Outside, hostPort(nodeA.IP6, localPort), 2, "--timeout", "2s"); hit.Total() != 0 {
			t.Errorf("outside -> %s (no local endpoint): %+v; want no answer", hostPort(nodeA.IP6, localPort), hit)
		}
		hit := vmHit(ctx, t, c.Outside, hostPort(nodeB.IP6, localPort), 3)
		if hit.Answers["server"] != 3 || hit.Clients[cluster.OutsideIP6] != 3 {
			t.Errorf("outside -> %s: %+v; want 3 answers seen from the outside host's own %s", hostPort(nodeB.IP6, localPort), hit, cluster.OutsideIP6)
		}
	})
	t.Run("IPv6: health-check node port", func(t *testing.T) {
		for _, tc := range []struct {
			node *cluster.Node
			want int
		}{{nodeA, 503}, {nodeB, 200}} {
			if got, out := healthCheckAt(ctx, c, tc.node.IP6, hcPort); got != tc.want {
				t.Errorf("outside GET [%s]:%s: %s; want status %d", tc.node.IP6, hcPort, out, tc.want)
			}
		}
	})
	lbIPRoutedPerNode(ctx, t, c, segmentIPv6, twoNodeLBIP6)
	t.Run("IPv6: internalTrafficPolicy Local with the only endpoint on the other node", func(t *testing.T) {
		addr := hostPort(itpLocal.Spec.ClusterIP, 80)
		if hit := podHit(ctx, t, c, ns, "client", addr, 1); hit.Total() != 0 {
			t.Errorf("pod client on %s -> %s: %+v; want no answer", nodeA.Name, addr, hit)
		}
		if hit := vmHit(ctx, t, nodeB.VM, addr, 2); hit.Answers["server"] != 2 {
			t.Errorf("%s's host -> %s: %+v; want 2 answers from its local endpoint", nodeB.Name, addr, hit)
		}
	})
	sourceRangesOnEveryNode(ctx, t, c, segmentIPv6, lbRanges, twoNodeRangesLBIP6, notOutside6)
	t.Run("IPv6: endpoint moving from node-1 to node-2 under traffic", func(t *testing.T) {
		moveEndpointAcrossNodes(ctx, t, c, ns, segmentIPv6, clientIP)
	})
	return npPort, hcPort
}

// ipv6NodePortsKept: with nodePortAddresses naming the segment's IPv4
// prefix only, the IPv6 node ports and health checks serve as before (a
// family the list does not name keeps all its addresses, kube-proxy's
// rule), while the IPv4 node ports leave the addresses outside the prefix.
func ipv6NodePortsKept(ctx context.Context, t *testing.T, c *cluster.Cluster, npPort6 int32, hcPort6, npPort4 string) {
	nodeA, nodeB := c.Nodes[0], c.Nodes[1]
	t.Run("nodePortAddresses of IPv4 only: the IPv6 node ports stay", func(t *testing.T) {
		addr := net.JoinHostPort(nodeA.IP6, strconv.Itoa(int(npPort6)))
		if hit := vmHit(ctx, t, c.Outside, addr, 3); hit.Answers["server"] != 3 || hit.Clients[nodeA.IP6] != 3 {
			t.Errorf("outside -> %s: %+v; want 3 answers, masqueraded to %s", addr, hit, nodeA.IP6)
		}
		if got, out := healthCheckAt(ctx, c, nodeB.IP6, hcPort6); got != 200 {
			t.Errorf("outside GET [%s]:%s: %s; want status 200", nodeB.IP6, hcPort6, out)
		}
		if hit := vmHit(ctx, t, c.Outside, nodeA.IP+":"+npPort4, 3); hit.Answers["server"] != 3 {
			t.Errorf("outside -> %s:%s (inside the prefix): %+v; want 3 answers", nodeA.IP, npPort4, hit)
		}
		// The VM's own 10.0.2.15 (its restricted uplink) is outside the
		// prefix: no IPv4 node port there.
		if out, err := nodeA.VM.RunOK(ctx, "ip", "-4", "-o", "addr", "show"); err != nil || !strings.Contains(out, " 10.0.2.15/") {
			t.Fatalf("%s has no 10.0.2.15 to check (%v):\n%s", nodeA.Name, err, out)
		}
		if out, err := nodeA.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", "10.0.2.15:"+npPort4); err == nil {
			t.Errorf("%s: node port on 10.0.2.15, outside nodePortAddresses:\n%s", nodeA.Name, out)
		}
	})
}
