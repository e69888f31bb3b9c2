package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// The glue tests assert what address a backend sees as its client: the
// backends answer "<name> <client-ip>". A masqueraded connection arrives
// from the node's address on the backend's veth (the backend's gateway,
// x.x.x.1); a preserved one from the client itself.

// inCluster is a client namespace inside --cluster-cidr (10.100.0.0/14,
// fd00:100::/24), made once for the package.
const (
	inClusterNetns = "incl"
	inClusterAddr  = "10.103.250.2"
	inClusterAddr6 = "fd00:1fa::2"
)

var inClusterOnce struct {
	sync.Once
	err error
}

func (e env) inClusterClient(t *testing.T) {
	t.Helper()
	inClusterOnce.Do(func() {
		_, inClusterOnce.err = e.VM.RunOK(context.Background(), "vmagent", "netns", "add", inClusterNetns,
			"--veth-host-addr", "10.103.250.1/24", "--addr", inClusterAddr+"/24",
			"--veth-host-addr6", "fd00:1fa::1/64", "--addr6", inClusterAddr6+"/64")
	})
	if inClusterOnce.err != nil {
		t.Fatalf("in-cluster client namespace: %v", inClusterOnce.err)
	}
}

// gateway is the root-side address of a backend's veth: where a
// masqueraded connection comes from.
func gateway(be backend) string { return strings.TrimSuffix(be.Addr, "2") + "1" }

func gateway6(be backend) string { return strings.TrimSuffix(be.Addr6, "2") + "1" }

// hitFrom connects n times from a namespace ("" is the node itself).
func (e env) hitFrom(t *testing.T, netns, proto, addr string, n int, timeout time.Duration) nettest.HitResult {
	t.Helper()
	res, err := e.VM.Hit(context.Background(), nettest.HitConfig{Netns: netns, Proto: proto, Addr: addr, N: n, Timeout: timeout})
	if err != nil {
		t.Fatalf("hit %s %s from %q: %v", proto, addr, netns, err)
	}
	return res
}

// expectClients waits until every connection from netns to addr is
// answered and the backends saw exactly the client addresses want.
func (e env) expectClients(t *testing.T, netns, addr string, want ...string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		res := e.hitFrom(t, netns, "tcp", addr, 3, 2*time.Second)
		got := slices.Sorted(maps.Keys(res.Clients))
		slices.Sort(want)
		if res.Total() != 3 || !slices.Equal(got, want) {
			return fmt.Errorf("from %q to %s: answers %v clients %v errors %v; want 3 answers from clients %v",
				netns, addr, res.Answers, res.Clients, res.Errors, want)
		}
		return nil
	})
}

// expectBlocked waits until connections from netns to addr get no answer.
func (e env) expectBlocked(t *testing.T, netns, addr string) nettest.HitResult {
	t.Helper()
	var res nettest.HitResult
	eventually(t, 30*time.Second, func() error {
		res = e.hitFrom(t, netns, "tcp", addr, 2, time.Second)
		if res.Total() > 0 {
			return fmt.Errorf("from %q to %s: still answered %v", netns, addr, res.Answers)
		}
		return nil
	})
	return res
}

// ipsetList returns `ipset list NAME` of the VM.
func (e env) ipsetList(t *testing.T, name string) string {
	t.Helper()
	out, err := e.VM.RunOK(context.Background(), "ipset", "list", name)
	if err != nil {
		t.Fatalf("ipset list %s: %v", name, err)
	}
	return out
}

// iptablesSave returns `iptables-save` (or ip6tables-save) of the VM.
func (e env) iptablesSave(t *testing.T, tool string) string {
	t.Helper()
	out, err := e.VM.RunOK(context.Background(), tool)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return out
}

// ownRules are the lines of iptables-save that are ipvs-proxy's.
func ownRules(save string) []string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.Contains(l, "IPVSP-") {
			out = append(out, l)
		}
	}
	return out
}

// logGlueState logs the VM's rules and sets when the test failed.
func (e env) logGlueState(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, argv := range [][]string{{"iptables-save", "-c"}, {"ip6tables-save", "-c"}, {"ipset", "list", "-t"}, {"ipvsadm", "-Ln"}, {"ip", "addr"}, {"cat", "/proc/net/snmp"}} {
			out, err := e.VM.RunOK(context.Background(), argv...)
			t.Logf("%s (err %v):\n%s", strings.Join(argv, " "), err, out)
		}
	})
}

// dualStackService creates a dual-stack clusterIP Service with one TCP
// port served by bes in both families, and returns its two VIP:ports.
func (e env) dualStackService(t *testing.T, ns, name string, port int32, bes []backend) (v4, v6 string) {
	t.Helper()
	svc := e.createService(t, ns, name, []corev1.ServicePort{tcpPort("http", port)}, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv6, bes)
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs %v: want one per family", svc.Spec.ClusterIPs)
	}
	return hostPort(svc.Spec.ClusterIPs[0], port), hostPort(svc.Spec.ClusterIPs[1], port)
}

// TestGlueClusterIPSourceAddress: a clusterIP reached from outside the
// cluster CIDR is masqueraded (the backend sees the node), from inside it the
// client's address is preserved; in both families.
func TestGlueClusterIPSourceAddress(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	e.inClusterClient(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	v4, v6 := e.dualStackService(t, ns, "web", 80, bes)

	e.expectClients(t, bed.ClientNetns, v4, gateway(bes[0]))
	e.expectClients(t, inClusterNetns, v4, inClusterAddr)
	e.expectClients(t, bed.ClientNetns, v6, gateway6(bes[0]))
	e.expectClients(t, inClusterNetns, v6, inClusterAddr6)
}

// TestGlueNodePortSourceAddress: a node port under externalTrafficPolicy
// Cluster is masqueraded, under Local the client's address is preserved.
func TestGlueNodePortSourceAddress(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	ns, svc, _, addr := e.nodePortService(t, "np")

	cur, err := e.Client.CoreV1().Services(ns).Get(context.Background(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if _, err := e.Client.CoreV1().Services(ns).Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectClients(t, bed.ClientNetns, addr, bed.ClientAddr)
}

// TestGlueHairpin: a backend reaching its own Service and balanced to
// itself gets its answer (the connection is masqueraded, else the reply
// would bypass IPVS).
func TestGlueHairpin(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	_, svc, bes := e.httpService(t, "self", 1)
	e.expectClients(t, bes[0].Name, hostPort(svc.Spec.ClusterIP, 80), gateway(bes[0]))
}

// TestGlueLoadBalancerSourceRanges: traffic to a LoadBalancer IP from
// outside loadBalancerSourceRanges is dropped, from the node too, and
// allowed from inside them. Every packet is checked, as kube-proxy's IPVS
// mode checks: ranges narrowed under a held connection cut it.
func TestGlueLoadBalancerSourceRanges(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	const lbIP = "10.251.1.10"
	svc := e.createService(t, ns, "fw", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		// The client's range; the node is a router into it (10.250.0.1),
		// but that is not one of its node-port addresses.
		s.Spec.LoadBalancerSourceRanges = []string{"10.250.0.0/24"}
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := e.Client.CoreV1().Services(ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set load balancer status: %v", err)
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr := hostPort(lbIP, 80)

	// The client's range is allowed, the node is not.
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
	res := e.expectBlocked(t, "", addr)
	if res.ErrorCount(nettest.ErrTimeout) == 0 {
		t.Errorf("from the node: %v; want dropped (timeouts)", res.Errors)
	}
	// The clusterIP of the same Service has no source ranges.
	e.expectClients(t, "", hostPort(svc.Spec.ClusterIP, 80), gateway(bes[0]))

	hold := e.holdFlow(t, "tcp", addr)

	// A range that holds the node's address lets the node in, not the
	// client, whose held connection is cut.
	setRanges := func(ranges ...string) {
		t.Helper()
		cur, err := e.Client.CoreV1().Services(ns).Get(context.Background(), svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.LoadBalancerSourceRanges = ranges
		if _, err := e.Client.CoreV1().Services(ns).Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setRanges("10.0.2.0/24")
	e.expectBlocked(t, bed.ClientNetns, addr)
	e.expectClients(t, "", addr, gateway(bes[0]))
	hold.expectEnd()

	// No ranges: everyone.
	setRanges()
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
	e.expectClients(t, "", addr, gateway(bes[0]))
}

// TestGlueVIPProtection: the node's own services do not answer on a VIP: a
// new connection to a clusterIP on a port that is no Service port is
// refused at once, while the Service port and the node's own address work.
func TestGlueVIPProtection(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	_, svc, bes := e.httpService(t, "vip", 1)
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), names(bes))

	// A host service on every address of the node, like sshd.
	const hostPortNum = 2222
	host, err := e.VM.Start(context.Background(), "vmagent", "serve", "--name", "host", "--port", fmt.Sprint(hostPortNum))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Stop() })
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := host.WaitFor(wctx, "READY"); err != nil {
		t.Fatal(err)
	}
	if res := e.hitFrom(t, bed.ClientNetns, "tcp", hostPort(nodeAddr, hostPortNum), 1, 2*time.Second); res.Answers["host"] != 1 {
		t.Fatalf("the host service does not answer on the node's address: %v %v", res.Answers, res.Errors)
	}

	// TCP is refused with a reset; UDP with an ICMP port unreachable, which
	// the kernel rate-limits per client (about one a second after a burst):
	// one UDP attempt per check, a second apart.
	refused := func(from, proto string, port int32, n int) {
		t.Helper()
		start := time.Now()
		res := e.hitFrom(t, from, proto, hostPort(svc.Spec.ClusterIP, port), n, 3*time.Second)
		if took := time.Since(start); res.ErrorCount(nettest.ErrRefused) != n || took > 2*time.Second {
			t.Errorf("%s from %q to clusterIP:%d: answers %v errors %v after %v; want %d refusals at once",
				proto, from, port, res.Answers, res.Errors, took.Round(time.Millisecond), n)
		}
	}
	for _, from := range []string{bed.ClientNetns, ""} {
		refused(from, "tcp", hostPortNum, 3)
		time.Sleep(1100 * time.Millisecond)
		refused(from, "udp", hostPortNum, 1)
	}
	// The Service port still answers; UDP to the same number does not (it
	// is no Service port).
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), names(bes))
	time.Sleep(1100 * time.Millisecond)
	refused(bed.ClientNetns, "udp", 80, 1)
}

// TestGlueSetsFollowServices: a Service's addresses appear in the sets and
// leave them with the Service; the number of rules does not change.
func TestGlueSetsFollowServices(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	before := ownRules(e.iptablesSave(t, "iptables-save"))

	const extIP, lbIP = "10.251.2.10", "10.251.2.11"
	svc := e.createService(t, ns, "sets", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{extIP}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.LoadBalancerSourceRanges = []string{"10.250.0.0/24"}
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := e.Client.CoreV1().Services(ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	ip := svc.Spec.ClusterIP
	np := svc.Spec.Ports[0].NodePort
	want := map[string][]string{
		"IPVSP-CLUSTER-IP":   {ip + ",tcp:80", ip + ",udp:53"},
		"IPVSP-SERVICE":      {ip + ",tcp:80", extIP + ",tcp:80", lbIP + ",tcp:80", fmt.Sprintf("%s,tcp:%d", nodeAddr, np)},
		"IPVSP-VIP":          {ip, extIP, lbIP},
		"IPVSP-LB-FW":        {lbIP + ",tcp:80", lbIP + ",udp:53"},
		"IPVSP-LB-SRC":       {lbIP + ",tcp:80,10.250.0.0/24"},
		"IPVSP-HAIRPIN":      {bes[0].Addr + ",tcp:8080," + bes[0].Addr, bes[1].Addr + ",udp:8080," + bes[1].Addr},
		"IPVSP-HC-NODE-PORT": {fmt.Sprint(svc.Spec.HealthCheckNodePort)},
	}
	// Local: the external addresses are not masqueraded.
	notWant := map[string][]string{"IPVSP-EXTERNAL": {extIP + ",tcp:80", lbIP + ",tcp:80", fmt.Sprintf("%s,tcp:%d", nodeAddr, np)}}
	check := func(present bool) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			for set, entries := range want {
				out := e.ipsetList(t, set)
				for _, en := range entries {
					if strings.Contains(out, "\n"+en+"\n") != present {
						return fmt.Errorf("%s: entry %s present=%v, want %v:\n%s", set, en, !present, present, out)
					}
				}
			}
			for set, entries := range notWant {
				out := e.ipsetList(t, set)
				for _, en := range entries {
					if strings.Contains(out, "\n"+en+"\n") {
						return fmt.Errorf("%s has %s:\n%s", set, en, out)
					}
				}
			}
			return nil
		})
	}
	check(true)
	during := ownRules(e.iptablesSave(t, "iptables-save"))
	if err := e.Client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	check(false)
	after := ownRules(e.iptablesSave(t, "iptables-save"))
	if !slices.Equal(before, during) || !slices.Equal(before, after) {
		t.Errorf("ipvs-proxy's rules changed with a Service:\nbefore:\n%s\nwith it:\n%s\nafter:\n%s",
			strings.Join(before, "\n"), strings.Join(during, "\n"), strings.Join(after, "\n"))
	}
	t.Logf("ipvs-proxy's iptables rules (%d lines, constant):\n%s", len(before), strings.Join(before, "\n"))

	// Full resyncs find the rules in place and rewrite nothing.
	applied := strings.Count(e.AgentOutput(), "iptables rules applied")
	fulls := strings.Count(e.AgentOutput(), `"kind":"full"`)
	eventually(t, 30*time.Second, func() error {
		if n := strings.Count(e.AgentOutput(), `"kind":"full"`); n < fulls+2 {
			return fmt.Errorf("%d full syncs since, want 2", n-fulls)
		}
		return nil
	})
	if n := strings.Count(e.AgentOutput(), "iptables rules applied"); n != applied {
		t.Errorf("full resyncs re-applied the rules %d times; want 0", n-applied)
	}
}

// TestGlueRepairsDrift: a set entry deleted, a foreign entry added and one
// of ipvs-proxy's chains flushed behind its back are repaired by a periodic
// full sync (--sync-period 5s here), by its check read off the sync loop
// (the log line of the check that repaired them says so).
func TestGlueRepairsDrift(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	svc := e.createService(t, ns, "drift", []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	entry := svc.Spec.ClusterIP + ",tcp:80"
	const foreign = "10.96.255.254"
	inSet := func(set, en string) bool { return strings.Contains(e.ipsetList(t, set), "\n"+en+"\n") }
	eventually(t, 30*time.Second, func() error {
		if !inSet("IPVSP-CLUSTER-IP", entry) {
			return fmt.Errorf("no %s in IPVSP-CLUSTER-IP yet", entry)
		}
		return nil
	})
	rules := ownRules(e.iptablesSave(t, "iptables-save"))
	chain := ""
	for _, l := range rules {
		if strings.HasPrefix(l, "-A IPVSP-") {
			chain = strings.Fields(l)[1]
			break
		}
	}
	if chain == "" {
		t.Fatalf("no rule in a chain of ipvs-proxy's:\n%s", strings.Join(rules, "\n"))
	}
	table := ""
	for _, l := range strings.Split(e.iptablesSave(t, "iptables-save"), "\n") {
		if strings.HasPrefix(l, "*") {
			table = l[1:]
		}
		if strings.HasPrefix(l, "-A "+chain+" ") {
			break
		}
	}
	checked := strings.Count(e.AgentOutput(), `"msg":"iptables glue checked"`)

	for _, argv := range [][]string{
		{"ipset", "del", "IPVSP-CLUSTER-IP", entry},
		{"ipset", "add", "IPVSP-VIP", foreign},
		{"iptables", "-t", table, "-F", chain},
	} {
		if _, err := e.VM.RunOK(context.Background(), argv...); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("drift: %s deleted from IPVSP-CLUSTER-IP, %s added to IPVSP-VIP, %s/%s flushed", entry, foreign, table, chain)
	eventually(t, 60*time.Second, func() error {
		switch {
		case !inSet("IPVSP-CLUSTER-IP", entry):
			return fmt.Errorf("%s not back in IPVSP-CLUSTER-IP", entry)
		case inSet("IPVSP-VIP", foreign):
			return fmt.Errorf("%s still in IPVSP-VIP", foreign)
		}
		if now := ownRules(e.iptablesSave(t, "iptables-save")); !slices.Equal(now, rules) {
			return fmt.Errorf("rules not repaired:\n%s", strings.Join(now, "\n"))
		}
		return nil
	})
	var repairs []string
	for _, l := range strings.Split(e.AgentOutput(), "\n") {
		if strings.Contains(l, `"msg":"iptables glue checked"`) {
			repairs = append(repairs, l)
		}
	}
	repairs = repairs[min(checked, len(repairs)):]
	if !slices.ContainsFunc(repairs, func(l string) bool { return !strings.Contains(l, `"added":0,`) }) ||
		!slices.ContainsFunc(repairs, func(l string) bool { return !strings.Contains(l, `"restores":0,`) }) {
		t.Errorf("no check since the drift repaired a set entry and the rules; checks:\n%s", strings.Join(repairs, "\n"))
	}
}

// TestGlueLegacyBackend: on a node whose rules are in iptables-legacy, the
// agent detects it and puts its rules there (and none in nft); cleanup
// removes them from there. The shared agent is back on nft afterwards.
func TestGlueLegacyBackend(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	_, svc, bes := e.httpService(t, "legacy", 1)
	addr := hostPort(svc.Spec.ClusterIP, 80)

	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	foreign := []string{"-A", "INPUT", "-s", "192.0.2.9/32", "-j", "ACCEPT"}
	restarted := false
	t.Cleanup(func() {
		_, _ = e.VM.RunOK(context.Background(), append([]string{"iptables-legacy", "-D"}, foreign[1:]...)...)
		_, _ = e.VM.RunOK(context.Background(), bed.GuestBinary, "cleanup")
		if !restarted {
			if err := e.StartAgent(context.Background()); err != nil {
				t.Errorf("restart the agent: %v", err)
			}
		}
	})
	e.vmRun(t, bed.GuestBinary, "cleanup")
	e.vmRun(t, append([]string{"iptables-legacy"}, foreign...)...)
	if err := e.StartAgent(context.Background()); err != nil {
		t.Fatal(err)
	}
	if log := e.AgentOutput(); !strings.Contains(log, `"backend":"legacy"`) {
		t.Errorf("the agent did not pick legacy:\n%s", log)
	}
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
	legacy := ownRules(e.iptablesSave(t, "iptables-legacy-save"))
	nft := ownRules(e.iptablesSave(t, "iptables-nft-save"))
	if len(legacy) == 0 || len(nft) != 0 {
		t.Errorf("ipvs-proxy's rules: %d in legacy, %d in nft; want all in legacy:\n%s", len(legacy), len(nft), strings.Join(nft, "\n"))
	}
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	out := e.vmRun(t, bed.GuestBinary, "cleanup")
	if !strings.Contains(out, "iptables (legacy): removed 12 chains") {
		t.Errorf("cleanup did not remove the legacy rules:\n%s", out)
	}
	if rules := ownRules(e.iptablesSave(t, "iptables-legacy-save")); len(rules) != 0 {
		t.Errorf("legacy rules left:\n%s", strings.Join(rules, "\n"))
	}
	if save := e.iptablesSave(t, "iptables-legacy-save"); !strings.Contains(save, "-A INPUT -s 192.0.2.9/32 -j ACCEPT") {
		t.Errorf("cleanup removed the node's own legacy rule:\n%s", save)
	}
	e.vmRun(t, append([]string{"iptables-legacy", "-D"}, foreign[1:]...)...)
	restarted = true
	if err := e.StartAgent(context.Background()); err != nil {
		t.Fatal(err)
	}
	if log := e.AgentOutput(); !strings.Contains(log, `"backend":"nft"`) {
		t.Errorf("the agent did not return to nft")
	}
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
}

// withoutFlag returns args without a flag and its value.
func withoutFlag(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// runAgentWith replaces the bed's agent, for the rest of the test, by one
// run with args instead of agentArgs, and waits for its first full sync.
// The bed's agent is restored after the test.
func (e env) runAgentWith(t *testing.T, args []string) *vm.Proc {
	t.Helper()
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the bed's agent: %v", err)
		}
	})
	return e.startAgentProc(t, args)
}

// startAgentProc starts an agent of its own with args (the bed's must be
// stopped), stopped when the test ends, and waits for its first full
// sync.
func (e env) startAgentProc(t *testing.T, args []string) *vm.Proc {
	t.Helper()
	ctx := context.Background()
	argv := append([]string{bed.GuestBinary, "run", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName}, args...)
	p, err := e.VM.Start(ctx, argv...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.WaitFor(wctx, `"kind":"full"`); err != nil {
		t.Fatalf("the agent (%v) did not sync: %v\n%s", args, err, p.Output())
	}
	return p
}

// TestGlueNodeToClusterIPWithoutClusterCIDR: with neither --cluster-cidr
// nor --masquerade-all, a connection from the node itself to a clusterIP
// whose endpoint is on another node reaches the backend from the node's
// address (masqueraded), not from the VIP, which the backend's own node
// would hold: in both families. A pod's connection keeps its source, and
// the agent's warning says what breaks.
func TestGlueNodeToClusterIPWithoutClusterCIDR(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	e.inClusterClient(t)
	p := e.runAgentWith(t, withoutFlag(agentArgs, "--cluster-cidr"))
	if out := p.Output(); !strings.Contains(out, "nothing tells in-cluster traffic") {
		t.Errorf("no warning that nothing tells in-cluster traffic:\n%s", grepLines(out, `"level":"warn"`))
	}
	ns := e.namespace(t)
	bes := e.backends(t, 1, otherNode)
	v4, v6 := e.dualStackService(t, ns, "api", 443, bes)
	e.expectClients(t, "", v4, gateway(bes[0]))
	e.expectClients(t, "", v6, gateway6(bes[0]))
	e.expectClients(t, inClusterNetns, v4, inClusterAddr)
	e.expectClients(t, inClusterNetns, v6, inClusterAddr6)
}

// TestGlueLocalPolicyInClusterClients: the LoadBalancer IP, the externalIP
// and the node port of an externalTrafficPolicy Local Service whose only
// endpoint is on another node answer in-cluster clients (a pod, source in
// the cluster CIDR, keeps its address; the node's own connections are
// masqueraded) and drop clients outside the cluster. Once the node has an
// endpoint of its own, an outside client reaches it with its address
// preserved.
func TestGlueLocalPolicyInClusterClients(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	e.inClusterClient(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1, otherNode)
	const lbIP, extIP = "10.251.1.20", "10.251.1.21"
	svc := e.createService(t, ns, "ingress", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.ExternalIPs = []string{extIP}
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := e.Client.CoreV1().Services(ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set load balancer status: %v", err)
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	nodePort := hostPort(nodeAddr, svc.Spec.Ports[0].NodePort)
	for _, addr := range []string{hostPort(lbIP, 80), hostPort(extIP, 80), nodePort} {
		e.expectClients(t, inClusterNetns, addr, inClusterAddr)
		e.expectClients(t, "", addr, gateway(bes[0]))
		if res := e.expectBlocked(t, bed.ClientNetns, addr); res.ErrorCount(nettest.ErrTimeout) == 0 {
			t.Errorf("from outside the cluster to %s: %v; want dropped (timeouts)", addr, res.Errors)
		}
	}

	// The kernel keeps the rules as the glue writes them (a difference in
	// form would make every full sync rewrite them).
	saved := ownRules(e.iptablesSave(t, "iptables-save"))
	for _, tab := range glue.Rules(glue.RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}) {
		for _, r := range tab.Rules {
			if !slices.Contains(saved, r) {
				t.Errorf("iptables-save has no rule %q; ours:\n%s", r, strings.Join(saved, "\n"))
			}
		}
	}

	// A local endpoint: it alone serves, the outside client too.
	local := e.backends(t, 1)
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, append(bes, local...))
	e.expectClients(t, bed.ClientNetns, nodePort, bed.ClientAddr)
	e.expectBackends(t, "tcp", hostPort(lbIP, 80), names(local))
}

// TestGlueHostFirewallDecides: the host's own firewall keeps its say over
// node ports (issue 41): an operator's rule after ipvs-proxy's jump in
// filter INPUT that drops a node port drops it, as with kube-proxy's IPVS
// mode (ipvs-proxy's chain lets Service traffic past, it does not accept
// it); without the rule the node port answers. Accepting ahead of the
// host's rules is the explicit option acceptServiceTraffic (rule dumps:
// TestRulesDumpVariants).
func TestGlueHostFirewallDecides(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	_, svc, bes, addr := e.nodePortService(t, "fw")
	nodePort := fmt.Sprint(svc.Spec.Ports[0].NodePort)

	// The operator's host firewall, appended after ipvs-proxy's jump.
	rule := []string{"INPUT", "-p", "tcp", "--dport", nodePort, "-m", "comment", "--comment", "operator: node port closed", "-j", "DROP"}
	e.vmRun(t, append([]string{"iptables", "-A"}, rule...)...)
	removed := false
	remove := func() {
		if !removed {
			removed = true
			e.vmRun(t, append([]string{"iptables", "-D"}, rule...)...)
		}
	}
	t.Cleanup(remove)
	if res := e.hitFrom(t, bed.ClientNetns, "tcp", addr, 2, 2*time.Second); len(res.Answers) > 0 {
		t.Errorf("node port %s answered %v through the host's DROP rule: ipvs-proxy accepted it ahead of the host's firewall", addr, res.Answers)
	}
	// The clusterIP, which the rule does not name, still answers.
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), names(bes))
	remove()
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
}

// nodePortService is a NodePort Service of one backend in a fresh
// namespace, answering on the node's address (masqueraded: the backend
// sees its gateway); addr is that node port.
func (e env) nodePortService(t *testing.T, name string) (ns string, svc *corev1.Service, bes []backend, addr string) {
	t.Helper()
	ns = e.namespace(t)
	bes = e.backends(t, 1)
	svc = e.createService(t, ns, name, []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr = hostPort(nodeAddr, svc.Spec.Ports[0].NodePort)
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
	return ns, svc, bes, addr
}
