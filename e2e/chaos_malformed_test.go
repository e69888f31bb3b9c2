package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
)

// TestChaosMalformedObjects sends what the apiserver's validation lets through
// but a proxy may choke on, while a steady Service carries new connections
// every 50 ms and a held one: a Service with 250 ports, an EndpointSlice
// with 1,000 endpoints (validation's maximum), an externalIP that is the
// node's own address, an FQDN EndpointSlice (ignored) beside one whose
// port name matches no Service port, scheduler flags that mean nothing. Each
// programs what it can (checked in the kernel and with connections), gets
// a Warning Event and a log line naming it where something was dropped,
// and leaves nothing behind when deleted; the node keeps its address. The
// steady Service loses no connection. A clusterIP outside the Service
// range never reaches the agent: the apiserver refuses it.
func TestChaosMalformedObjects(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	peaks := startPeaks(ctx, t, e.bedVM())
	t.Cleanup(foreignVirtualServer(t, e.VM))
	ns, steady, bes := e.httpService(t, "steady", 2)
	steadyAddr := hostPort(steady.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", steadyAddr, names(bes))
	hold, held := e.holdConn(t, steadyAddr)
	tr := e.startTraffic(t, "tcp", steadyAddr)
	del := func(svc *corev1.Service) {
		t.Helper()
		if err := e.Client.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// virtualServers counts the kernel's virtual servers on addr (an IP).
	virtualServers := func(ip string) int {
		return len(regexp.MustCompile(`(?m)^(TCP|UDP|SCTP)\s+`+regexp.QuoteMeta(ip)+`:`).FindAllString(e.ipvsadm(t), -1))
	}
	leaks := 0
	expectVirtualServers := func(ip string, want int) {
		t.Helper()
		defer func() {
			if want == 0 {
				leaks += virtualServers(ip)
			}
		}()
		eventually(t, 2*time.Minute, func() error {
			if n := virtualServers(ip); n != want {
				return fmt.Errorf("%d virtual servers on %s, want %d", n, ip, want)
			}
			return nil
		})
	}

	t.Run("250 ports", func(t *testing.T) {
		var ports []corev1.ServicePort
		var slicePorts []discoveryv1.EndpointPort
		for i := range 250 {
			p := tcpPort(fmt.Sprintf("p%d", i), int32(1000+i))
			ports = append(ports, p)
			slicePorts = append(slicePorts, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))})
		}
		svc := e.createService(t, ns, "many-ports", ports)
		e.createSlice(t, svc, "many-ports-1", discoveryv1.AddressTypeIPv4, slicePorts, endpointsOf(bes, nil))
		expectVirtualServers(svc.Spec.ClusterIP, 250)
		e.expectBackends(t, "tcp", hostPort(svc.Spec.ClusterIP, 1249), names(bes))
		del(svc)
		expectVirtualServers(svc.Spec.ClusterIP, 0)
	})

	t.Run("1000 endpoints", func(t *testing.T) {
		svc := e.createService(t, ns, "many-endpoints", []corev1.ServicePort{tcpPort("http", 80)})
		var extra []string
		for i := range 998 {
			extra = append(extra, fmt.Sprintf("10.101.%d.%d", i/250, 1+i%250))
		}
		slicePorts := []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))}}
		e.createSlice(t, svc, "many-endpoints-1", discoveryv1.AddressTypeIPv4, slicePorts, endpointsOf(bes, extra))
		addr := hostPort(svc.Spec.ClusterIP, 80)
		eventually(t, 2*time.Minute, func() error {
			table, err := e.IPVSTable(ctx, "-t", addr)
			if err != nil {
				return err
			}
			if n := strings.Count(table, "-> 10."); n != 1000 {
				return fmt.Errorf("%s has %d real servers, want 1000", addr, n)
			}
			return nil
		})
		del(svc)
		expectVirtualServers(svc.Spec.ClusterIP, 0)
	})

	t.Run("externalIP is the node's address", func(t *testing.T) {
		svc := e.createService(t, ns, "node-address", []corev1.ServicePort{tcpPort("http", 8088)}, func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{bed.NodeAddr}
		})
		e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
		// The Kubernetes documentation: traffic to an external IP on the
		// Service's port goes to its endpoints, whoever else has the address.
		e.expectBackends(t, "tcp", hostPort(bed.NodeAddr, 8088), names(bes))
		del(svc)
		expectVirtualServers(bed.NodeAddr, 0)
		eth0 := e.vmRun(t, "ip", "-o", "-4", "addr", "show", "dev", "eth0")
		if !strings.Contains(eth0, " "+bed.NodeAddr+"/") {
			t.Errorf("eth0 lost the node's address after the Service went:\n%s", eth0)
		}
		if own := e.vipsBound(t); strings.Contains(own, " "+bed.NodeAddr+"/") {
			t.Errorf("the node's address is still on %s:\n%s", proxyIface, own)
		}
		// The guest agent answers on the node's address (QEMU's forward).
		if _, err := e.VM.RunOK(ctx, "true"); err != nil {
			t.Errorf("the node no longer answers on its address: %v", err)
		}
	})

	t.Run("FQDN slice and an unmatched port name", func(t *testing.T) {
		svc := e.createService(t, ns, "odd-slices", []corev1.ServicePort{tcpPort("http", 80)})
		e.createSlice(t, svc, "odd-slices-fqdn", discoveryv1.AddressTypeFQDN,
			[]discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))}},
			[]discoveryv1.Endpoint{{Addresses: []string{"backend.example.invalid"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}})
		e.createSlice(t, svc, "odd-slices-v4", discoveryv1.AddressTypeIPv4,
			[]discoveryv1.EndpointPort{{Name: ptr.To("other"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))}},
			endpointsOf(bes, nil))
		e.expectEvent(t, svc, `no EndpointSlice has a TCP port named "http"`)
		e.expectLog(t, "service has problems", ns+"/odd-slices")
		// FQDN slices are not proxied (as kube-proxy: no addresses to
		// balance to); the IPv4 slice's port matches no Service port. The
		// virtual server is there, with no real server: refused.
		addr := hostPort(svc.Spec.ClusterIP, 80)
		e.expectTable(t, []string{"TCP  " + addr}, []string{"-> " + hostPort(bes[0].Addr, backendPort)}, "-t", addr)
		e.expectNoAnswer(t, "tcp", addr)
		// Fixed: served.
		if err := e.Client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "odd-slices-v4", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
		e.expectBackends(t, "tcp", addr, names(bes))
		del(svc)
		expectVirtualServers(svc.Spec.ClusterIP, 0)
	})

	t.Run("meaningless scheduler flags", func(t *testing.T) {
		svc := e.createService(t, ns, "odd-flags", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
			s.Annotations = map[string]string{"ipvs-proxy.io/scheduler": "rr", "ipvs-proxy.io/scheduler-flags": "sh-port,,; rm -rf /"}
		})
		e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
		e.expectEvent(t, svc, "annotation ipvs-proxy.io/scheduler-flags")
		addr := hostPort(svc.Spec.ClusterIP, 80)
		e.expectTable(t, []string{"TCP  " + addr + " rr"}, nil, "-t", addr)
		e.expectBackends(t, "tcp", addr, names(bes))
		del(svc)
		expectVirtualServers(svc.Spec.ClusterIP, 0)
	})

	t.Run("Services over the limits", func(t *testing.T) {
		e.overLimits(t, ns, bes)
	})

	t.Run("clusterIP outside the Service range", func(t *testing.T) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "outside"},
			Spec:       corev1.ServiceSpec{ClusterIP: "192.0.2.10", Ports: []corev1.ServicePort{tcpPort("http", 80)}},
		}
		_, err := e.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err == nil {
			t.Fatalf("the apiserver accepted clusterIP 192.0.2.10, outside its Service range")
		}
		t.Logf("the apiserver refuses it: %v", err)
	})

	hold.expectAnswers(3, held)
	attempts, failed, _, errs := tr.stop(t, time.Time{})
	t.Logf("steady Service: %d new connections, %d failed", attempts, failed)
	if failed > 0 || attempts < 20 {
		t.Errorf("steady Service: %d of %d new connections failed: %v", failed, attempts, errs)
	}
	peaks.record(t, chaos.Row{
		Case: "malformed-objects", TrafficAttempted: attempts + 1, TrafficFailed: failed, Leaks: leaks,
		Notes: "250 ports; 1,000 endpoints in a slice; 1,024 externalIPs × 1,025 ports and slices of 1M endpoint ports (refused, Event, nothing else touched); externalIP = node address (node keeps it); FQDN + unmatched port name (Event); bad scheduler flags (Event); clusterIP out of range refused by the apiserver; leaks = virtual servers left on deleted Services' IPs",
	})
}

// endpointsOf lists the backends, then the extra addresses, as ready
// endpoints on this node.
func endpointsOf(bes []backend, extra []string) []discoveryv1.Endpoint {
	var out []discoveryv1.Endpoint
	add := func(addr string) {
		out = append(out, discoveryv1.Endpoint{Addresses: []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(nodeName)})
	}
	for _, be := range bes {
		add(be.Addr)
	}
	for _, a := range extra {
		add(a)
	}
	return out
}

// createSlice creates an EndpointSlice of svc as the test wrote it.
func (e env) createSlice(t *testing.T, svc *corev1.Service, name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint) {
	t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "bed.ipvs-proxy.io",
		}},
		AddressType: family, Ports: ports, Endpoints: eps,
	}
	if _, err := e.Client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create EndpointSlice %s/%s: %v", svc.Namespace, name, err)
	}
}

// expectLog waits for a line of the agent's log that contains every one
// of parts.
func (e env) expectLog(t *testing.T, parts ...string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		for _, l := range strings.Split(e.AgentOutput(), "\n") {
			found := true
			for _, p := range parts {
				found = found && strings.Contains(l, p)
			}
			if found {
				return nil
			}
		}
		return fmt.Errorf("no line of the agent's log has %q", parts)
	})
}
