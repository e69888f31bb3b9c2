package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// terminatingServing marks one endpoint as a pod that shuts down but
// still serves (ready=false, serving=true, terminating=true).
func terminatingServing(addr string) func(*discoveryv1.Endpoint) {
	return func(ep *discoveryv1.Endpoint) {
		if ep.Addresses[0] == addr {
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		}
	}
}

// startHostService starts a host service on every address of the node
// (like sshd) and waits until it answers on the node's address.
func (e env) startHostService(t *testing.T, port int) {
	t.Helper()
	host, err := e.VM.Start(context.Background(), "vmagent", "serve", "--name", "host", "--port", fmt.Sprint(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Stop() })
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := host.WaitFor(wctx, "READY"); err != nil {
		t.Fatal(err)
	}
	if res := e.hitFrom(t, bed.ClientNetns, "tcp", hostPort(nodeAddr, int32(port)), 1, 2*time.Second); res.Answers["host"] != 1 {
		t.Fatalf("the host service does not answer on the node's address: %v %v", res.Answers, res.Errors)
	}
}

// TestHealthCheckCountsReadyOnly: externalTrafficPolicy Local, the only
// local endpoint turns terminating but still serving. The health-check
// node port answers 503 with localEndpoints 0 (a load balancer drains the
// node), while the endpoint still serves through the fallback: a held
// connection goes on, and new ones still reach it.
func TestHealthCheckCountsReadyOnly(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	svc := e.createService(t, ns, "local", []corev1.ServicePort{tcpPort("http", 80)}, localLoadBalancer)
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatalf("the apiserver allocated no healthCheckNodePort: %+v", svc.Spec)
	}
	url := fmt.Sprintf("http://%s/", hostPort(nodeAddr, svc.Spec.HealthCheckNodePort))
	np := hostPort(nodeAddr, svc.Spec.Ports[0].NodePort)
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", np, names(bes))
	if body := e.waitHealth(t, url, 200, 30*time.Second); body["localEndpoints"] != 1.0 {
		t.Fatalf("GET %s: %v, want localEndpoints 1", url, body)
	}
	hold, held := e.holdConn(t, np)
	if held != bes[0].Name {
		t.Fatalf("the held connection reached %q, want %q", held, bes[0].Name)
	}

	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes, terminatingServing(bes[0].Addr))
	if body := e.waitHealth(t, url, 503, 30*time.Second); body["localEndpoints"] != 0.0 {
		t.Errorf("GET %s: %v, want localEndpoints 0", url, body)
	}
	hold.expectAnswers(5, bes[0].Name)
	e.expectBackends(t, "tcp", np, names(bes))
}

// restartAgentAfter stops the agent, runs argv in the VM, and starts the
// agent again with the bed's arguments (also at the end of the test if
// anything failed in between).
func (e env) restartAgentAfter(t *testing.T, argv ...string) {
	t.Helper()
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	started := false
	t.Cleanup(func() {
		if !started {
			_ = e.StartAgent(context.Background())
		}
	})
	e.vmRun(t, argv...)
	if err := e.StartAgent(context.Background()); err != nil {
		t.Fatalf("restart the agent: %v", err)
	}
	started = true
}

// TestConnReuseModeRestored: on this kernel (past 5.9) a conn_reuse_mode
// forced to 0, as an older ipvs-proxy did on every kernel, is the kernel's
// default 1 again once the agent has started, and the agent says what it
// was.
func TestConnReuseModeRestored(t *testing.T) {
	e := setup(t)
	e.restartAgentAfter(t, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/vs/conn_reuse_mode")
	if v := strings.TrimSpace(e.vmRun(t, "cat", "/proc/sys/net/ipv4/vs/conn_reuse_mode")); v != "1" {
		t.Errorf("net.ipv4.vs.conn_reuse_mode = %s after the agent started, want the kernel's default 1", v)
	}
	if want := `"name":"net/ipv4/vs/conn_reuse_mode","value":"1","was":"0"`; !strings.Contains(e.AgentOutput(), want) {
		t.Errorf("the agent did not log restoring conn_reuse_mode (%s)", want)
	}
}

// TestConnReuseDrainingRealServer: on this kernel (Debian's 6.1, past 5.9)
// the agent keeps conn_reuse_mode at the kernel's 1, and a client that
// reuses its source port is scheduled afresh: after its backend turns
// draining (weight 0), the reconnections from the same port reach the
// other backend, not the draining one. (On 6.1 the reconnections would do
// so under 0 too, with expire_nodest_conn=1, since the kernel fix "ipvs:
// Fix reuse connection if RS weight is 0"; on 5.9 to the kernels before
// it, 0 sent them to the draining backend.)
func TestConnReuseDrainingRealServer(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if v := strings.TrimSpace(e.vmRun(t, "cat", "/proc/sys/net/ipv4/vs/conn_reuse_mode")); v != "1" {
		t.Errorf("net.ipv4.vs.conn_reuse_mode = %s with the agent running on kernel %s, want the kernel's default 1", v,
			strings.TrimSpace(e.vmRun(t, "cat", "/proc/sys/kernel/osrelease")))
	}
	_, svc, bes := e.httpService(t, "reuse", 2)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", addr, names(bes))

	const srcPort = 40123
	proc, err := e.VM.Start(ctx, "vmagent", "hold", "--netns", bed.ClientNetns, "--addr", addr, "--source-port", fmt.Sprint(srcPort),
		"--interval", "200ms", "--timeout", "10s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop() })
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.WaitFor(wctx, "answer 1 "); err != nil {
		t.Fatalf("held connection from port %d: %v\n%s", srcPort, err, proc.Output())
	}
	held := heldAnswer.FindStringSubmatch(proc.Output())[1]
	var draining, other backend
	for _, b := range bes {
		if b.Name == held {
			draining = b
		} else {
			other = b
		}
	}
	if draining.Name == "" {
		t.Fatalf("the held connection reached %q, not one of %v", held, names(bes))
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes, terminatingServing(draining.Addr))
	weight0 := regexp.MustCompile(`-> ` + regexp.QuoteMeta(hostPort(draining.Addr, backendPort)) + `\s+Masq\s+0\s`)
	eventually(t, 30*time.Second, func() error {
		if out := e.ipvsadm(t, "-t", addr); !weight0.MatchString(out) {
			return fmt.Errorf("no real server %s with weight 0:\n%s", draining.Addr, out)
		}
		return nil
	})
	// The held connection ends with a reset; the same port connects again
	// at once, while IPVS still has the old connection's entry.
	if err := proc.Stop(); err != nil {
		t.Fatal(err)
	}
	res, err := e.VM.Hit(ctx, nettest.HitConfig{Netns: bed.ClientNetns, Proto: "tcp", Addr: addr, N: 3, Timeout: 5 * time.Second,
		SourcePort: srcPort})
	if err != nil {
		t.Fatal(err)
	}
	if res.Answers[other.Name] != 3 {
		t.Errorf("reconnections from port %d: answers %v errors %v; want all 3 from %s, none from the draining %s\nIPVS connections:\n%s",
			srcPort, res.Answers, res.Errors, other.Name, draining.Name, e.ipvsadm(t, "-c"))
	}
}

// TestTakeoverNodePortsOnNodeAddressesOnly: taking over from kube-proxy
// with node ports on every node address (as without --nodeport-addresses),
// kube-ipvs0's VIPs are no node addresses: at no point does a node port
// get a virtual server on one of them.
func TestTakeoverNodePortsOnNodeAddressesOnly(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	kp := e.kubeProxy(t, kubeproxy.Options{})
	t.Cleanup(func() { _ = e.StopAgent() }) // before the fixture's own cleanup
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	const extIP = "10.251.0.31"
	svc := e.createService(t, ns, "np", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalIPs = []string{extIP}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	nodePort := svc.Spec.Ports[0].NodePort
	eventually(t, 2*time.Minute, func() error {
		if out := e.vmRun(t, "ip", "-o", "addr", "show", "dev", kubeproxy.Interface); !strings.Contains(out, " "+extIP+"/32 ") {
			return fmt.Errorf("kube-proxy has not bound %s yet:\n%s", extIP, out)
		}
		return nil
	})
	vips := []string{svc.Spec.ClusterIP, extIP}

	// Watch the IPVS table's node-port virtual servers through the takeover.
	watch, err := e.VM.Start(ctx, "sh", "-c", fmt.Sprintf("while :; do ipvsadm -Ln | grep ':%d '; sleep 0.1; done", nodePort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watch.Stop() })
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	// --nodeport-addresses adds to the bed's prefix: every address.
	if err := e.StartAgent(ctx, "--takeover-kube-proxy", "--nodeport-addresses", "0.0.0.0/0,::/0"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() error {
		if !strings.Contains(e.AgentOutput(), `"msg":"took over from kube-proxy"`) {
			return fmt.Errorf("the agent has not finished taking over")
		}
		return nil
	})
	time.Sleep(6 * time.Second) // past the next full sync (--sync-period 5s)
	e.expectBackends(t, "tcp", hostPort(nodeAddr, nodePort), names(bes))
	if err := watch.Stop(); err != nil {
		t.Logf("stop the watch: %v", err)
	}
	seen := watch.Output()
	if !strings.Contains(seen, hostPort(nodeAddr, nodePort)) {
		t.Fatalf("the watch never saw the node port on %s:\n%s", nodeAddr, tailLines(seen, 20))
	}
	for _, vip := range vips {
		if strings.Contains(seen, " "+hostPort(vip, nodePort)+" ") {
			t.Errorf("a virtual server %s appeared during the takeover:\n%s", hostPort(vip, nodePort), tailLines(seen, 40))
		}
	}
}

// TestExternalIPIsNodeAddress: a Service whose externalIP is the node's own
// address answers on its port through IPVS, but the address is neither
// bound to the proxy's interface nor in the VIP set, so the node's other
// ports on it keep accepting: a host service answers every new connection
// while the Service is created, changed and deleted.
func TestExternalIPIsNodeAddress(t *testing.T) {
	e := setup(t)
	const sshLike = 2222
	e.startHostService(t, sshLike)
	hostTraffic := e.startTraffic(t, "tcp", hostPort(nodeAddr, sshLike))

	ns := e.namespace(t)
	bes := e.backends(t, 2)
	svc := e.createService(t, ns, "on-node", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{nodeAddr}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.expectTable(t, []string{"TCP  " + hostPort(nodeAddr, 80) + " rr"}, nil)
	e.expectBackends(t, "tcp", hostPort(nodeAddr, 80), names(bes))
	notBound := func(when string) {
		t.Helper()
		if bound := e.vipsBound(t); strings.Contains(bound, " "+nodeAddr+"/") {
			t.Errorf("%s: the node address %s is bound to %s:\n%s", when, nodeAddr, proxyIface, bound)
		}
		if vips := e.ipsetList(t, "IPVSP-VIP"); strings.Contains(vips, nodeAddr) {
			t.Errorf("%s: the node address %s is in the VIP set:\n%s", when, nodeAddr, vips)
		}
	}
	notBound("created")
	if res := e.hitFrom(t, bed.ClientNetns, "tcp", hostPort(nodeAddr, sshLike), 3, 2*time.Second); res.Answers["host"] != 3 {
		t.Errorf("with the Service, the host service on the node's address: %v %v", res.Answers, res.Errors)
	}

	// Changed: the Service port moves from 80 to 81.
	cur, err := e.Client.CoreV1().Services(ns).Get(context.Background(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Ports[0].Port = 81
	if _, err := e.Client.CoreV1().Services(ns).Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, []string{"TCP  " + hostPort(nodeAddr, 81) + " rr"}, []string{hostPort(nodeAddr, 80)})
	e.expectBackends(t, "tcp", hostPort(nodeAddr, 81), names(bes))
	notBound("changed")

	if err := e.Client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, nil, []string{hostPort(nodeAddr, 81)})
	notBound("deleted")
	time.Sleep(time.Second) // traffic after the delete
	attempts, failed, _, errs := hostTraffic.stop(t, time.Time{})
	t.Logf("host service on the node's address: %d new connections, %d failed", attempts, failed)
	if failed > 0 || attempts < 20 {
		t.Errorf("the host service on the node's address: %d of %d new connections failed while the Service came and went: %v",
			failed, attempts, errs)
	}
}

// TestNodePortAddressesPerFamily: the bed's agent names an IPv4 prefix
// only (--nodeport-addresses 10.0.2.0/24). A RequireDualStack Local
// LoadBalancer still gets its IPv6 node port on the node's IPv6 addresses
// (the client namespace's gateway is one) and its health-check node port
// answers there, as kube-proxy takes every address of a family the list
// does not name; its IPv4 node port stays off the addresses outside the
// prefix.
func TestNodePortAddressesPerFamily(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	svc := e.createService(t, ns, "dual", []corev1.ServicePort{tcpPort("http", 80)}, localLoadBalancer, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv6, bes)
	np := svc.Spec.Ports[0].NodePort
	e.expectTable(t, []string{"TCP  " + hostPort(bed.ClientGateway6, np) + " ", "TCP  " + hostPort(nodeAddr, np) + " "},
		[]string{"TCP  " + hostPort("10.250.0.1", np) + " "})
	e.expectClients(t, bed.ClientNetns, hostPort(bed.ClientGateway6, np), bed.ClientAddr6)
	url := fmt.Sprintf("http://%s/", hostPort(bed.ClientGateway6, svc.Spec.HealthCheckNodePort))
	if body := e.waitHealth(t, url, 200, 30*time.Second); body["localEndpoints"] != 1.0 {
		t.Errorf("GET %s: %v, want localEndpoints 1", url, body)
	}
}

// TestIPv6ForwardingOnlyForIPv6Services: on a cluster with no IPv6
// Service the agent leaves net.ipv6.conf.all.forwarding as it found it
// (kube-proxy never sets it; a node that forwards IPv6 stops taking router
// advertisements); the first IPv6 Service turns it on, and is served.
// (Services of earlier tests linger, as namespaces do without their
// controller: those with IPv6 addresses are deleted first, so that the
// cluster is IPv4-only when the agent starts.)
func TestIPv6ForwardingOnlyForIPv6Services(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	all, err := e.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all.Items {
		if slices.Contains(s.Spec.IPFamilies, corev1.IPv6Protocol) {
			if err := e.Client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const fwd = "/proc/sys/net/ipv6/conf/all/forwarding"
	e.restartAgentAfter(t, "sh", "-c", "echo 0 > "+fwd)
	// Whatever happens here, the tests after this one have IPv6 Services.
	t.Cleanup(func() { _, _ = e.VM.RunOK(context.Background(), "sh", "-c", "echo 1 > "+fwd) })
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	v4 := e.createService(t, ns, "v4", []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, v4, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", hostPort(v4.Spec.ClusterIP, 80), names(bes))
	if v := strings.TrimSpace(e.vmRun(t, "cat", fwd)); v != "0" {
		t.Errorf("IPv4 Services only: %s = %s, want 0 (left as it was)", fwd, v)
	}
	v6 := e.createService(t, ns, "v6", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	})
	e.setSlice(t, v6, discoveryv1.AddressTypeIPv6, bes)
	e.expectBackends(t, "tcp", hostPort(v6.Spec.ClusterIP, 80), names(bes))
	eventually(t, 10*time.Second, func() error { // the consumer syncs beside the reconciler
		if v := strings.TrimSpace(e.vmRun(t, "cat", fwd)); v != "1" {
			return fmt.Errorf("with an IPv6 Service: %s = %s, want 1", fwd, v)
		}
		return nil
	})
}

// TestNodePortsFollowNodeAddresses: an address added to the node inside
// --nodeport-addresses gets every node port at once (the agent watches
// the node's addresses; no Service changes), answered from a client; when
// it is removed its virtual servers go; the node's own address keeps its
// node port throughout. The cheap form of make chaos-nodes' renumbering
// (issue 45's case 4) on the one-node bed.
func TestNodePortsFollowNodeAddresses(t *testing.T) {
	e := setup(t)
	_, svc, bes, addr := e.nodePortService(t, "follows")
	np := svc.Spec.Ports[0].NodePort
	const extra = "10.0.2.77" // inside bed.NodePortCIDR, on the VM's own segment
	onExtra := "TCP  " + hostPort(extra, np) + " "
	onNode := "TCP  " + hostPort(nodeAddr, np) + " "
	del := func() { e.vmOK("ip", "addr", "del", extra+"/24", "dev", "eth0") }
	t.Cleanup(del)
	added := time.Now()
	e.vmRun(t, "ip", "addr", "add", extra+"/24", "dev", "eth0")
	e.expectTableWithin(t, 10*time.Second, []string{onExtra, onNode}, nil)
	t.Logf("node port on the added address %s after %v", extra, time.Since(added).Round(10*time.Millisecond))
	e.expectClients(t, bed.ClientNetns, hostPort(extra, np), gateway(bes[0]))
	removed := time.Now()
	del()
	e.expectTableWithin(t, 10*time.Second, []string{onNode}, []string{onExtra})
	t.Logf("its virtual server gone %v after the removal", time.Since(removed).Round(10*time.Millisecond))
	e.expectClients(t, bed.ClientNetns, addr, gateway(bes[0]))
}
