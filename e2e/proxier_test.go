package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// TestClusterIPMultiPortTCPAndUDP: one Service, a TCP and a UDP port, two
// backends; both ports reach both backends through the clusterIP.
func TestClusterIPMultiPortTCPAndUDP(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	svc := e.createService(t, ns, "web", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	ip := svc.Spec.ClusterIP
	e.expectTable(t, []string{
		"TCP  " + hostPort(ip, 80) + " rr",
		"UDP  " + hostPort(ip, 53) + " rr",
		"-> " + hostPort(bes[0].Addr, backendPort),
		"-> " + hostPort(bes[1].Addr, backendPort),
	}, nil)
	e.expectBackends(t, "tcp", hostPort(ip, 80), names(bes))
	e.expectBackends(t, "udp", hostPort(ip, 53), names(bes))
	e.expectRouted(t, ip)
}

// TestNodePortExternalIPAndLoadBalancer: the external addresses of a
// LoadBalancer Service: a node port on the node's address, an externalIP,
// and the load balancer's ingress IP.
func TestNodePortExternalIPAndLoadBalancer(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	const extIP, lbIP, proxyIP = "10.251.0.10", "10.251.0.11", "10.251.0.12"
	svc := e.createService(t, ns, "lb", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{extIP}
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP},
		{IP: proxyIP, IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
	if _, err := e.Client.CoreV1().Services(ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set load balancer status: %v", err)
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	nodePort := svc.Spec.Ports[0].NodePort
	for _, addr := range []string{hostPort(nodeAddr, nodePort), hostPort(extIP, 80), hostPort(lbIP, 80)} {
		e.expectBackends(t, "tcp", addr, names(bes))
	}
	// ipMode Proxy: the load balancer proxies itself, the node must not.
	e.expectTable(t, nil, []string{proxyIP})
	bound := e.vipsBound(t)
	for _, ip := range []string{extIP, lbIP} {
		if !strings.Contains(bound, ip+"/32") {
			t.Errorf("%s not bound to %s:\n%s", ip, proxyIface, bound)
		}
	}
	if strings.Contains(bound, nodeAddr) {
		t.Errorf("the node address was bound to %s", proxyIface)
	}
}

// TestIPv6ClusterIP: an IPv6 single-stack Service served from an IPv6
// EndpointSlice.
func TestIPv6ClusterIP(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	svc := e.createService(t, ns, "web6", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	})
	if !strings.Contains(svc.Spec.ClusterIP, ":") {
		t.Fatalf("clusterIP %q is not IPv6", svc.Spec.ClusterIP)
	}
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv6, bes)
	e.expectTable(t, []string{"TCP  " + hostPort(svc.Spec.ClusterIP, 80) + " rr"}, nil)
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), names(bes))
}

// TestSessionAffinity: ClientIP affinity keeps one client on one backend.
func TestSessionAffinity(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 3)
	svc := e.createService(t, ns, "sticky", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectTable(t, []string{"TCP  " + addr + " rr persistent 600"}, nil)
	eventually(t, 30*time.Second, func() error {
		res := e.hit(t, "tcp", addr, 9)
		if len(res.Answers) != 1 || res.Total() != 9 {
			return fmt.Errorf("answers %v errors %v: want all 9 from one backend", res.Answers, res.Errors)
		}
		return nil
	})
}

// TestExternalTrafficPolicyLocal: external addresses reach only this
// node's endpoints, the clusterIP reaches all of them.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2, nodeName, otherNode)
	svc := e.createService(t, ns, "local", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), names(bes))
	e.expectBackends(t, "tcp", hostPort(nodeAddr, svc.Spec.Ports[0].NodePort), []string{bes[0].Name})

	// With no local endpoint left, the node port answers nobody.
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes[1:])
	e.expectNoAnswer(t, "tcp", hostPort(nodeAddr, svc.Spec.Ports[0].NodePort))
	e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 80), []string{bes[1].Name})
}

// TestSchedulerAnnotation: the per-Service scheduler shows in the kernel,
// follows changes, and an unknown one falls back to the default with an
// Event on the Service.
func TestSchedulerAnnotation(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	svc := e.createService(t, ns, "sched", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Annotations = map[string]string{"ipvs-proxy.io/scheduler": "sh", "ipvs-proxy.io/scheduler-flags": "sh-port"}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectTable(t, []string{"TCP  " + addr + " sh"}, nil)

	setAnnotation := func(v string) {
		t.Helper()
		cur, err := e.Client.CoreV1().Services(ns).Get(context.Background(), svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Annotations = map[string]string{"ipvs-proxy.io/scheduler": v}
		if _, err := e.Client.CoreV1().Services(ns).Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setAnnotation("lc")
	e.expectTable(t, []string{"TCP  " + addr + " lc"}, nil)
	setAnnotation("fastest")
	e.expectTable(t, []string{"TCP  " + addr + " rr"}, nil)
	e.expectEvent(t, svc, `unknown IPVS scheduler "fastest"`)
	e.expectBackends(t, "tcp", addr, names(bes))
}

// TestSchedulerModuleMissing: a Service asks for a scheduler whose module
// the node's kernel cannot load (here: removed from the VM's
// /lib/modules). It gets the default scheduler and an Event saying why,
// and serves; the agent does not crash or stall.
func TestSchedulerModuleMissing(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	mod, err := e.VM.RunOK(ctx, "sh", "-c", "find /lib/modules -name 'ip_vs_ovf.ko*' | head -n 1")
	if mod = strings.TrimSpace(mod); err != nil || mod == "" {
		t.Fatalf("no ip_vs_ovf module in the VM (%v)", err)
	}
	if r, err := e.VM.Run(ctx, "rmmod", "ip_vs_ovf"); err == nil && r.ExitCode == 0 {
		t.Logf("unloaded ip_vs_ovf")
	}
	if _, err := e.VM.RunOK(ctx, "mv", mod, mod+".hidden"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.VM.RunOK(ctx, "mv", mod+".hidden", mod) })

	ns := e.namespace(t)
	bes := e.backends(t, 1)
	svc := e.createService(t, ns, "ovf", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Annotations = map[string]string{"ipvs-proxy.io/scheduler": "ovf"}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectTable(t, []string{"TCP  " + addr + " rr", "-> " + hostPort(bes[0].Addr, backendPort)}, nil)
	e.expectBackends(t, "tcp", addr, names(bes))
	e.expectEvent(t, svc, `IPVS scheduler "ovf" is not available in this node's kernel (module ip_vs_ovf)`)

	// Gone before the module comes back: the agent remembers a missing
	// scheduler only until it restarts, and a later test restarts it.
	if err := e.Client.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, nil, []string{addr})
}

// TestScaleEndpointsAndDelete: endpoints added and removed show in
// traffic; a deleted Service leaves the kernel, and its address, still in
// the routed Service range, refuses connections at once.
func TestScaleEndpointsAndDelete(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 3)
	svc := e.createService(t, ns, "scale", []corev1.ServicePort{tcpPort("http", 80)})
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes[:1])
	e.expectBackends(t, "tcp", addr, names(bes[:1]))
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", addr, names(bes))
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes[1:2])
	e.expectBackends(t, "tcp", addr, names(bes[1:2]))

	// Not ready, not serving: the virtual server stays with no serving
	// real server and refuses connections. The endpoint's real server
	// drains at weight 0 while IPVS still counts the test's closed
	// connections on it (TIME_WAIT), then goes.
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes[1:2], func(ep *discoveryv1.Endpoint) {
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	})
	serving := regexp.MustCompile(`-> ` + regexp.QuoteMeta(hostPort(bes[1].Addr, backendPort)) + `\s+Masq\s+[1-9]`)
	eventually(t, 30*time.Second, func() error {
		if out := e.ipvsadm(t, "-t", addr); serving.MatchString(out) {
			return fmt.Errorf("the not-serving endpoint still has weight:\n%s", out)
		}
		return nil
	})
	res := e.hit(t, "tcp", addr, 2)
	if len(res.Answers) != 0 || res.ErrorCount("refused") != 2 {
		t.Errorf("with no endpoints: answers %v errors %v, want two refusals", res.Answers, res.Errors)
	}

	if err := e.Client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, nil, []string{addr})
	// Its address stays in the routed range, which refuses it at once
	// like any other address of the range that is no Service's.
	e.expectRouted(t, svc.Spec.ClusterIP)
	start := time.Now()
	if res = e.hit(t, "tcp", addr, 2); len(res.Answers) != 0 || res.ErrorCount("refused") != 2 || time.Since(start) > 3*time.Second {
		t.Errorf("deleted Service's %s: answers %v errors %v in %s; want two refusals at once", addr, res.Answers, res.Errors, time.Since(start))
	}
}

// TestTerminatingEndpointDrains: an endpoint whose pod is terminating but
// still serving keeps its real server at weight 0: a connection made before
// goes on answering, new connections go to the other backend. When the
// endpoint leaves the slice while its pod still runs (relabelled out of
// the selector, as here: the pod answers on), the real server stays at
// weight 0 while IPVS counts the connection, as in kube-proxy's IPVS mode
// (deleting it would cut the connection at its next packet,
// expire_nodest_conn=1); once the connection ends, the real server goes.
func TestTerminatingEndpointDrains(t *testing.T) {
	e := setup(t)
	_, svc, bes := e.httpService(t, "drain", 2)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	// No test connections before the hold: a closed TCP connection counts
	// on its real server (TIME_WAIT) for two minutes, and would keep it
	// after the held connection ends.
	// (The whole table: "-t" fails while the virtual server is not there.)
	e.expectTable(t, []string{"TCP  " + addr + " rr", "-> " + hostPort(bes[0].Addr, backendPort), "-> " + hostPort(bes[1].Addr, backendPort)}, nil)

	hold := e.holdFlow(t, "tcp", addr, "--reset")
	held := hold.backend
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

	// The held backend's pod terminates but still serves.
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes, func(ep *discoveryv1.Endpoint) {
		if ep.Addresses[0] == draining.Addr {
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		}
	})
	weight0 := regexp.MustCompile(`-> ` + regexp.QuoteMeta(hostPort(draining.Addr, backendPort)) + `\s+Masq\s+0\s+1\s`)
	eventually(t, 30*time.Second, func() error {
		if out := e.ipvsadm(t, "-t", addr); !weight0.MatchString(out) {
			return fmt.Errorf("no real server %s with weight 0 and one active connection:\n%s", draining.Addr, out)
		}
		return nil
	})
	e.expectBackends(t, "tcp", addr, []string{other.Name})
	// A few more answers on the held connection, from the draining backend.
	hold.expectAnswers(5, draining.Name)

	// The endpoint leaves the slice, and a third one joins in the same
	// change (its real server tells that the agent applied the change):
	// the held connection goes on, its real server at weight 0.
	third := e.backends(t, 1)[0]
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, []backend{other, third})
	e.expectTable(t, []string{"-> " + hostPort(third.Addr, backendPort)}, nil, "-t", addr)
	if out := e.ipvsadm(t, "-t", addr); !weight0.MatchString(out) {
		t.Errorf("the endpoint left the slice: want its real server %s kept at weight 0 with its connection:\n%s", draining.Addr, out)
	}
	hold.expectAnswers(5, draining.Name)
	e.expectBackends(t, "tcp", addr, []string{other.Name, third.Name})

	// The connection ends (a reset): the real server goes.
	if err := hold.proc.Stop(); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, []string{"-> " + hostPort(other.Addr, backendPort)}, []string{"-> " + hostPort(draining.Addr, backendPort)}, "-t", addr)
}

// TestNotServingEndpointDrains: an endpoint whose pod stops serving
// (terminating with serving=false: an application that fails readiness on
// SIGTERM and finishes its requests) keeps its TCP real server at weight 0
// while the kernel counts connections on it: a held TCP connection goes on
// answering from it, new connections go to the other endpoint only, and
// the real server goes once the connection ends (reset), while the
// endpoint is still in the slice. Its UDP real server goes at once
// (kube-proxy's rule): a client that keeps its source port, which stayed
// on it for as long as it sent, gets its answers from the serving endpoint
// within a sync.
func TestNotServingEndpointDrains(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	svc := e.createService(t, ns, "drain", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	tcpAddr, udpAddr := hostPort(svc.Spec.ClusterIP, 80), hostPort(svc.Spec.ClusterIP, 53)
	// No test connections before the holds: a closed TCP connection
	// counts on its real server (TIME_WAIT) for two minutes, and would
	// keep it after the held connection ends.
	e.expectTable(t, []string{"TCP  " + tcpAddr + " rr", "UDP  " + udpAddr + " rr",
		"-> " + hostPort(bes[0].Addr, backendPort), "-> " + hostPort(bes[1].Addr, backendPort)}, nil)

	tcpHold := e.holdFlow(t, "tcp", tcpAddr, "--reset")
	var draining, other backend
	for _, b := range bes {
		if b.Name == tcpHold.backend {
			draining = b
		} else {
			other = b
		}
	}
	if draining.Name == "" {
		t.Fatalf("the held connection reached %q, not one of %v", tcpHold.backend, names(bes))
	}
	// A UDP client with a fixed source port on the same backend: round
	// robin alternates, so one of two new source ports reaches it, and
	// the port stays there while it sends.
	udpFrom := func(port int) nettest.HitResult {
		res, err := e.VM.Hit(context.Background(), nettest.HitConfig{Netns: bed.ClientNetns, Proto: "udp", Addr: udpAddr, N: 3,
			Timeout: 2 * time.Second, SourcePort: port})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	udpPort := 0
	for p := 40300; p < 40304 && udpPort == 0; p++ {
		if res := udpFrom(p); res.Answers[draining.Name] == 3 {
			udpPort = p
		}
	}
	if udpPort == 0 {
		t.Fatalf("no UDP source port reached %s in four tries", draining.Name)
	}

	// The backend stops serving (its pod terminates and fails readiness).
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes, func(ep *discoveryv1.Endpoint) {
		if ep.Addresses[0] == draining.Addr {
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
		}
	})
	rs := hostPort(draining.Addr, backendPort)
	// Weight 0 first, then probe: a probe that reached the draining
	// backend before would count on its real server for two minutes
	// (TIME_WAIT) and keep it after the held connection ends.
	waitWithin(context.Background(), t, time.Minute, rs+" at weight 0 in -t "+tcpAddr, func() (bool, string) {
		out := e.ipvsadm(t, "-t", tcpAddr)
		w, _, ok := realServerRow(out, rs)
		return ok && w == 0, out
	})
	// The UDP real server goes at once (the same sync, after the TCP
	// one's update): the fixed source port's next datagrams are
	// scheduled afresh.
	e.expectTable(t, nil, []string{"-> " + rs}, "-u", udpAddr)
	eventually(t, 10*time.Second, func() error {
		if res := udpFrom(udpPort); res.Answers[other.Name] != 3 {
			return fmt.Errorf("UDP from source port %d: answers %v errors %v; want all 3 from the serving %s\n%s",
				udpPort, res.Answers, res.Errors, other.Name, e.ipvsadm(t, "-c"))
		}
		return nil
	})
	e.expectBackends(t, "tcp", tcpAddr, []string{other.Name})
	e.expectBackends(t, "udp", udpAddr, []string{other.Name})
	if out := e.ipvsadm(t, "-t", tcpAddr); func() bool { w, conns, ok := realServerRow(out, rs); return !ok || w != 0 || conns == 0 }() {
		t.Errorf("ipvsadm -Ln -t %s: want %s at weight 0 with its connection:\n%s", tcpAddr, rs, out)
	}
	tcpHold.expectAnswers(5, draining.Name)

	// The TCP connection ends: its real server goes.
	if err := tcpHold.proc.Stop(); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, nil, []string{"-> " + rs}, "-t", tcpAddr)
}

var realServerConns = regexp.MustCompile(`->\s+(\S+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)`)

// realServerRow finds a real server in `ipvsadm -Ln` output: its weight
// and its active and inactive connections summed.
func realServerRow(out, rs string) (weight, conns int, ok bool) {
	for _, m := range realServerConns.FindAllStringSubmatch(out, -1) {
		if m[1] != rs {
			continue
		}
		w, _ := strconv.Atoi(m[2])
		a, _ := strconv.Atoi(m[3])
		i, _ := strconv.Atoi(m[4])
		return w, a + i, true
	}
	return 0, 0, false
}

// TestDriftRepairAndRestart: a real server deleted by hand comes back at
// the next full resync; an agent restart with unchanged Services makes no
// writes and leaves the kernel's counters running.
func TestDriftRepairAndRestart(t *testing.T) {
	e := setup(t)
	_, svc, bes := e.httpService(t, "drift", 2)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", addr, names(bes))

	if _, err := e.VM.RunOK(context.Background(), "ipvsadm", "-d", "-t", addr, "-r", hostPort(bes[0].Addr, backendPort)); err != nil {
		t.Fatal(err)
	}
	e.expectTable(t, []string{"-> " + hostPort(bes[0].Addr, backendPort)}, nil, "-t", addr)

	// Restart. Connections made before count in the kernel's statistics;
	// a re-created virtual server would start from zero. The kernel
	// publishes its per-CPU counters from the rate estimator's timer
	// (every 2 s), so a read right after traffic can still show 0.
	var statsBefore int
	eventually(t, 15*time.Second, func() error {
		statsBefore = connCount(t, e.ipvsadm(t, "--stats", "-t", addr))
		if statsBefore == 0 {
			return fmt.Errorf("no connections counted before the restart")
		}
		return nil
	})
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	// At debug level the agent logs each write: the first sync may
	// delete a real server of another Service whose drain just ended (a
	// TCP real server that left its plan is kept while IPVS counts
	// connections, TIME_WAIT included), and nothing else.
	if err := e.StartAgent(context.Background(), "--log-level", "debug"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.StopAgent() == nil {
			_ = e.StartAgent(context.Background())
		}
	})
	first, writes := firstFullSyncWrites(e.AgentOutput())
	if first == "" {
		t.Fatalf("no full sync in the agent's log:\n%s", e.AgentOutput())
	}
	for _, w := range writes {
		if strings.Contains(w, addr) || !strings.Contains(w, `"op":"delete-real-server `) {
			t.Errorf("the first sync after a restart wrote more than the end of another Service's drain: %s\n(%s)", w, first)
		}
	}
	if after := connCount(t, e.ipvsadm(t, "--stats", "-t", addr)); after < statsBefore {
		t.Errorf("connection count went from %d to %d: the virtual server was re-created", statsBefore, after)
	}
	e.expectBackends(t, "tcp", addr, names(bes))
}

var statsLine = regexp.MustCompile(`(?m)^TCP\s+\S+\s+(\d+)`)

// connCount reads a virtual server's connection counter from
// `ipvsadm -Ln --stats -t ...`.
func connCount(t *testing.T, out string) int {
	t.Helper()
	m := statsLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no stats line in:\n%s", out)
	}
	var n int
	if _, err := fmt.Sscan(m[1], &n); err != nil {
		t.Fatalf("connection counter %q: %v", m[1], err)
	}
	return n
}

// firstFullSync returns the agent's log line of its first full sync.
func firstFullSync(log string) string {
	first, _ := firstFullSyncWrites(log)
	return first
}

// firstFullSyncWrites is firstFullSync and the "kernel write" lines (at
// debug level) logged before it.
func firstFullSyncWrites(log string) (first string, writes []string) {
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, `"msg":"kernel write"`):
			writes = append(writes, l)
		case strings.Contains(l, `"kind":"full"`):
			return l, writes
		}
	}
	return "", nil
}
