package model_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestTunnelEnds: the ends a node must hold are the real servers of its
// tunnelled virtual servers whose endpoints are on it (NAT on this node,
// since they are local, but tunnelled to by every other node), draining
// ones too; NAT virtual servers and other nodes' endpoints have none.
func TestTunnelEnds(t *testing.T) {
	vip := netip.MustParseAddr("198.51.100.10")
	lb := model.VSPlan{VirtualServer: ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: vip, Protocol: ktypes.TCP, Port: 80}},
		Kind: model.KindLoadBalancer, Forward: ktypes.ForwardGUE, TunPort: 6080,
		RealServers: ktypestest.RSs("10.1.0.1:8080", "10.1.0.2:8080", "10.2.0.1:8080")}
	lb.RealServers[1].Weight = 0 // draining
	nat := model.VSPlan{VirtualServer: ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.10"), Protocol: ktypes.TCP, Port: 80}},
		Kind: model.KindClusterIP, RealServers: ktypestest.RSs("10.1.0.1:8080", "10.2.0.1:8080")}
	plan := &model.ServicePlan{VirtualServers: []model.VSPlan{nat, lb},
		NodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")}}
	want := []model.TunnelEnd{
		{VIP: vip, Protocol: ktypes.TCP, Port: 80, Endpoint: netip.MustParseAddrPort("10.1.0.1:8080"), Forward: ktypes.ForwardGUE, GUEPort: 6080},
		{VIP: vip, Protocol: ktypes.TCP, Port: 80, Endpoint: netip.MustParseAddrPort("10.1.0.2:8080"), Forward: ktypes.ForwardGUE, GUEPort: 6080},
	}
	if diff := cmp.Diff(want, model.TunnelEnds(plan), planCmp...); diff != "" {
		t.Errorf("TunnelEnds (-want +got):\n%s", diff)
	}
	if got := model.TunnelEnds(nil); got != nil {
		t.Errorf("TunnelEnds(nil) = %v", got)
	}
}

// TestTunnelledVirtualServersBounded: each tunnelled virtual server costs
// every node an iptables rule, so a Service tunnels at most 64; the rest
// keep NAT, with one warning each, and the Service is programmed whole.
func TestTunnelledVirtualServersBounded(t *testing.T) {
	var ips []string
	for i := range 70 {
		ips = append(ips, fmt.Sprintf("203.0.113.%d", i+1))
	}
	cfg := testCfg
	cfg.DSR = model.DSRConfig{GUEPort: 6080}
	p := build(svc(externalIPs(ips...), annotate(model.AnnotationForwarding, "tunnel")), nil, model.NodeInfo{Name: "node-a"}, cfg)
	tunnelled, nat := 0, 0
	for _, vs := range p.VirtualServers {
		switch {
		case vs.Kind != model.KindExternalIP:
		case vs.Forward == ktypes.ForwardTunnel:
			tunnelled++
		default:
			nat++
		}
	}
	if tunnelled != 64 || nat != 6 {
		t.Errorf("%d tunnelled and %d NAT virtual servers, want 64 and 6", tunnelled, nat)
	}
	if len(p.Warnings) != 6 || !strings.Contains(p.Warnings[0], "more than 64 tunnelled virtual servers") {
		t.Errorf("warnings %q, want 6 naming the bound", p.Warnings)
	}
}

// TestTunnelStaysOnItsVirtualServer: a tunnelled LoadBalancer IP's real
// servers carry the tunnel; the clusterIP's and the node ports' (the same
// endpoints, chosen once for the port, each virtual server with its own
// copy) stay NAT.
func TestTunnelStaysOnItsVirtualServer(t *testing.T) {
	cfg := testCfg
	cfg.DSR = model.DSRConfig{GUEPort: 6080}
	p := build(svc(typ("LoadBalancer"), ports(port("http", "TCP", 80, 30080)), ingress(lbIP("198.51.100.1")), externalIPs("203.0.113.5"),
		annotate(model.AnnotationForwarding, "tunnel")),
		slices(slice4("web-1", http8080, ep("10.1.0.1"), ep("10.1.0.2"))), testNode, cfg)
	kinds := map[model.AddressKind]int{}
	for _, vs := range p.VirtualServers {
		kinds[vs.Kind]++
		want := ktypes.ForwardNAT
		if vs.Kind == model.KindLoadBalancer || vs.Kind == model.KindExternalIP {
			want = ktypes.ForwardTunnel
		}
		if vs.Forward != want {
			t.Errorf("%s (%s): forward %v, want %v", vs.VSKey, vs.Kind, vs.Forward, want)
		}
		for _, rs := range vs.RealServers {
			if rs.Forward != want {
				t.Errorf("%s (%s): real server %s forward %v, want %v", vs.VSKey, vs.Kind, rs.RSKey, rs.Forward, want)
			}
		}
	}
	if kinds[model.KindLoadBalancer] != 1 || kinds[model.KindExternalIP] != 1 || kinds[model.KindNodePort] == 0 || kinds[model.KindClusterIP] != 1 {
		t.Errorf("virtual servers by kind %v, want a clusterIP, an external IP, a LoadBalancer IP and node ports", kinds)
	}
}
