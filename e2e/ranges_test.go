package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// TestServiceRangesRouted: by default (--route-service-cidrs) the agent
// routes the bed's IPv4 Service range (from the apiserver's ServiceCIDR
// object, 10.96.0.0/16) as local through its interface and binds no IPv4
// clusterIP, while the IPv6 clusterIP is bound as before. Every client
// still reaches the Service and is seen as before (masqueraded from
// outside the cluster CIDR, its own address from inside, the node's
// own connections masqueraded); an address of the range that is no
// Service's does not reach a host listener (refused at once); status sees
// no drift. The agent's restart with --route-service-cidrs=false binds
// the address and deletes the route (a Service deleted then unbinds
// its own), and back in the default mode the
// route returns and the address goes, the virtual server kept and
// answering throughout.
func TestServiceRangesRouted(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	e.inClusterClient(t)
	ctx := context.Background()
	ns := e.namespace(t)
	bes := e.backends(t, 1, otherNode)
	v4, v6 := e.dualStackService(t, ns, "ranged", 80, bes)
	// Deleted while the agent binds, below: its address must go.
	gone := e.createService(t, ns, "gone", []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, gone, discoveryv1.AddressTypeIPv4, bes)
	ip4, _, _ := strings.Cut(v4, ":")
	ip6 := strings.TrimPrefix(strings.Split(v6, "]")[0], "[")

	args := append([]string(nil), agentArgs...)
	p := e.runAgentWith(t, args)
	routes := func() string { return strings.Join(e.routedRanges(t), "; ") }
	bound := func() string { return e.vipsBound(t) }
	routed := func() error {
		if r := routes(); r != "10.96.0.0/16" {
			return fmt.Errorf("local routes of prefixes through %s: %q, want 10.96.0.0/16 alone", bed.Interface, r)
		}
		if b := bound(); strings.Contains(b, " "+ip4+"/32") || !strings.Contains(b, " "+ip6+"/128") {
			return fmt.Errorf("%s holds\n%s\nwant %s (IPv6) and not %s (IPv4, routed)", bed.Interface, b, ip6, ip4)
		}
		return nil
	}
	eventually(t, 30*time.Second, routed)
	if !strings.Contains(p.Output(), "Service ranges routed as local") {
		t.Errorf("the agent does not log the ranges it routes")
	}

	e.expectClients(t, bed.ClientNetns, v4, gateway(bes[0]))
	e.expectClients(t, inClusterNetns, v4, inClusterAddr)
	e.expectClients(t, "", v4, gateway(bes[0]))
	e.expectClients(t, bed.ClientNetns, v6, gateway6(bes[0]))

	// An address of the range that no Service has: local, yet a host
	// listener on every address does not answer on it.
	const hostPortNum = 2223
	host, err := e.VM.Start(ctx, "vmagent", "serve", "--name", "host", "--port", fmt.Sprint(hostPortNum))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Stop() })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := host.WaitFor(wctx, "READY"); err != nil {
		t.Fatal(err)
	}
	free := netip.MustParseAddr("10.96.255.254")
	for _, from := range []string{bed.ClientNetns, ""} {
		start := time.Now()
		res := e.hitFrom(t, from, "tcp", hostPort(free.String(), hostPortNum), 3, 3*time.Second)
		if res.ErrorCount(nettest.ErrRefused) != 3 || time.Since(start) > 2*time.Second {
			t.Errorf("from %q to %s:%d, in the range and no Service's: answers %v errors %v; want 3 refusals at once",
				from, free, hostPortNum, res.Answers, res.Errors)
		}
	}

	// status builds its desired state with the same ranges: no drift.
	out, err := e.VM.RunOK(ctx, append([]string{bed.GuestBinary, "status", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName,
		"--output", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --output json: %v\n%s", err, out)
	}
	if !st.DriftKnown || len(st.Drift) != 0 {
		t.Errorf("status under routed ranges: drift known %v, drift %+v; want none", st.DriftKnown, st.Drift)
	}

	// One address per clusterIP (--route-service-cidrs=false): bound,
	// the route gone, the Service still answering.
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	// Not runAgentWith again: its cleanup, which starts the bed's agent,
	// must run once.
	b := e.startAgentProc(t, append(append([]string(nil), agentArgs...), "--route-service-cidrs=false"))
	eventually(t, 30*time.Second, func() error {
		if r := routes(); r != "" {
			return fmt.Errorf("local routes of prefixes through %s left: %q", bed.Interface, r)
		}
		if b := bound(); !strings.Contains(b, " "+ip4+"/32") {
			return fmt.Errorf("%s holds\n%s\nwant %s bound", bed.Interface, b, ip4)
		}
		return nil
	})
	e.expectClients(t, bed.ClientNetns, v4, gateway(bes[0]))
	if !strings.Contains(bound(), " "+gone.Spec.ClusterIP+"/32") {
		t.Errorf("%s not bound in binding mode:\n%s", gone.Spec.ClusterIP, bound())
	}
	if err := e.Client.CoreV1().Services(ns).Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if b := bound(); strings.Contains(b, " "+gone.Spec.ClusterIP+"/32") {
			return fmt.Errorf("the deleted Service's %s still bound:\n%s", gone.Spec.ClusterIP, b)
		}
		return nil
	})

	// And back to the default: the route first, then the address goes.
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	e.startAgentProc(t, args)
	eventually(t, 30*time.Second, routed)
	e.expectClients(t, bed.ClientNetns, v4, gateway(bes[0]))
}

// TestRangeRouteOutlivesTheLastBoundAddress: Linux removes every route
// through an interface with its last IPv4 address
// (netlinkutil.TestLocalRouteGoesWithTheLastIPv4Address), so the agent
// keeps the range's anchor (its network address, which no Service is
// given) bound beside the route. Deleting the Service of an externalIP
// unbinds it and leaves the range routed: the clusterIP keeps answering
// at once, not after the next full read of the kernel.
func TestRangeRouteOutlivesTheLastBoundAddress(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ns := e.namespace(t)
	bes := e.backends(t, 1)
	const extIP, anchor = "10.251.0.21", "10.96.0.0"
	ranged := e.createService(t, ns, "ranged", []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, ranged, discoveryv1.AddressTypeIPv4, bes)
	ext := e.createService(t, ns, "ext", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{extIP}
	})
	e.setSlice(t, ext, discoveryv1.AddressTypeIPv4, bes)
	vip := hostPort(ranged.Spec.ClusterIP, 80)
	ipv4 := func() []string {
		var out []string
		for _, l := range strings.Split(e.vmRun(t, "ip", "-o", "-4", "addr", "show", "dev", proxyIface), "\n") {
			if f := strings.Fields(l); len(f) >= 4 {
				out = append(out, strings.TrimSuffix(f[3], "/32"))
			}
		}
		return out
	}
	eventually(t, 30*time.Second, func() error {
		if got := ipv4(); !slices.Contains(got, extIP) {
			return fmt.Errorf("IPv4 addresses of %s: %v, want %s among them", proxyIface, got, extIP)
		}
		return nil
	})
	e.expectClients(t, bed.ClientNetns, vip, gateway(bes[0]))
	// Other tests' Services (their namespaces linger without the
	// namespace controller) may keep addresses bound: then the external
	// IP is not the last, and only the anchor's presence shows.
	t.Logf("IPv4 addresses of %s before the deletion: %v", proxyIface, ipv4())

	if err := e.Client.CoreV1().Services(ns).Delete(ctx, ext.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if got := ipv4(); slices.Contains(got, extIP) {
			return fmt.Errorf("%s still bound: %v", extIP, got)
		}
		return nil
	})
	// At once: no waiting for a resync to add a lost route again.
	if r := strings.Join(e.routedRanges(t), "; "); r != "10.96.0.0/16" {
		t.Errorf("local routes of prefixes through %s right after %s was unbound: %q, want 10.96.0.0/16", proxyIface, extIP, r)
	}
	res := e.hitFrom(t, bed.ClientNetns, "tcp", vip, 3, 2*time.Second)
	if res.Total() != 3 {
		t.Errorf("%s right after %s was unbound: answers %v errors %v; want 3 answers", vip, extIP, res.Answers, res.Errors)
	}
	if got := ipv4(); !slices.Contains(got, anchor) {
		t.Errorf("IPv4 addresses of %s: %v, want the anchor %s", proxyIface, got, anchor)
	}
}
