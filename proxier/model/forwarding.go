package model

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// AnnotationForwarding chooses how a Service's externalIPs and LoadBalancer
// IPs send traffic from outside the cluster to its endpoints: "nat" (the
// default), "tunnel" (IPIP) or "gue" (IPIP in UDP). The tunnels are direct
// server return: the endpoint's node ends the tunnel and the pod answers
// the client itself (proxier/DSR.md).
const AnnotationForwarding = "ipvs-proxy.io/forwarding"

// DSRConfig is the node's direct server return (--direct-server-return).
type DSRConfig struct {
	// Off, when not empty, says why this node does not tunnel (the flag
	// is off, nothing tells pods' traffic from the rest, the node cannot
	// end tunnels): a Service that asks for a tunnel gets NAT and this
	// reason as a warning.
	Off string
	// GUEPort is the UDP port every node receives GUE on (--gue-port).
	GUEPort uint16
}

// maxTunnelVirtualServers bounds the tunnelled virtual servers of one
// Service: each costs the iptables glue a rule of its own (the in-cluster
// redirect), which ipsets cannot hold. Past it the Service keeps NAT.
const maxTunnelVirtualServers = 64

// forwarding reads the annotation: the method the Service asks for, NAT
// with a warning when the value is unknown or the node does not tunnel.
func (b *planBuilder) forwarding() ktypes.Forward {
	v, ok := b.svc.Annotations[AnnotationForwarding]
	if !ok {
		return ktypes.ForwardNAT
	}
	var f ktypes.Forward
	switch strings.TrimSpace(v) {
	case "", "nat":
		return ktypes.ForwardNAT
	case "tunnel":
		f = ktypes.ForwardTunnel
	case "gue":
		f = ktypes.ForwardGUE
	default:
		b.warn("annotation %s: %q is not one of nat, tunnel, gue; using nat", AnnotationForwarding, v)
		return ktypes.ForwardNAT
	}
	switch {
	case b.cfg.DSR.Off != "":
		b.warn("annotation %s: %s; using nat", AnnotationForwarding, b.cfg.DSR.Off)
		return ktypes.ForwardNAT
	case f == ktypes.ForwardGUE && b.cfg.DSR.GUEPort == 0:
		b.warn("annotation %s: this node has no GUE port; using nat", AnnotationForwarding)
		return ktypes.ForwardNAT
	case b.svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal:
		b.warn("annotation %s: with externalTrafficPolicy Local the node that receives the traffic serves it; using nat", AnnotationForwarding)
		return ktypes.ForwardNAT
	}
	return f
}

// tunnelled sets a virtual server of an external address to the Service's
// forwarding method, when it can be: its real servers on other nodes are
// reached through the tunnel, those on this node by NAT (the pod's reply
// is routed through this node anyway), and in-cluster clients are sent to
// the clusterIP of its family (InClusterTo), which NATs them: a tunnelled
// reply would reach the client's node from one of that node's own
// addresses, a martian there.
func (b *planBuilder) tunnelled(vs *VSPlan) {
	if b.forward == ktypes.ForwardNAT || (vs.Kind != KindExternalIP && vs.Kind != KindLoadBalancer) || vs.NodeAddress {
		return
	}
	if !vs.Address.Is4() {
		b.warn("annotation %s: direct server return is IPv4 only; %s keeps nat", AnnotationForwarding, vs.Address)
		return
	}
	cip, ok := b.clusterIPs[buildIPv4]
	if !ok {
		b.warn("annotation %s: %s has no IPv4 clusterIP for in-cluster clients; it keeps nat", AnnotationForwarding, vs.Address)
		return
	}
	if b.tunnels >= maxTunnelVirtualServers {
		b.warn("annotation %s: more than %d tunnelled virtual servers; %s keeps nat", AnnotationForwarding, maxTunnelVirtualServers, vs.VSKey)
		return
	}
	b.tunnels++
	vs.Forward = b.forward
	vs.InClusterTo = netip.AddrPortFrom(cip, vs.Port)
	if b.forward == ktypes.ForwardGUE {
		vs.TunPort = b.cfg.DSR.GUEPort
	}
	for i := range vs.RealServers {
		if b.nodeRS[vs.RealServers[i].Address] {
			continue // on this node: NAT
		}
		vs.RealServers[i].Forward, vs.RealServers[i].TunPort = vs.Forward, vs.TunPort
	}
}

// TunnelEnd is one endpoint on this node of a tunnelled virtual server:
// where this node ends the tunnels that any node (itself included) sends
// to the endpoint, and delivers the inner packet to VIP:Port at the
// endpoint with its port remapped.
type TunnelEnd struct {
	VIP      netip.Addr
	Protocol ktypes.Protocol
	Port     uint16
	// Endpoint is the pod's address and target port.
	Endpoint netip.AddrPort
	Forward  ktypes.Forward
	// GUEPort is the UDP port of ForwardGUE.
	GUEPort uint16
}

// TunnelEnds lists the tunnel ends a plan asks of this node, in the plan's
// order: every real server of a tunnelled virtual server whose endpoint is
// on this node (plan.NodeEndpoints), serving or draining.
func TunnelEnds(plan *ServicePlan) []TunnelEnd {
	if plan == nil {
		return nil
	}
	var out []TunnelEnd
	for _, vs := range plan.VirtualServers {
		if vs.Forward == ktypes.ForwardNAT {
			continue
		}
		for _, rs := range vs.RealServers {
			if _, local := slices.BinarySearchFunc(plan.NodeEndpoints, rs.Address, netip.Addr.Compare); !local {
				continue
			}
			end := TunnelEnd{VIP: vs.Address, Protocol: vs.Protocol, Port: vs.Port,
				Endpoint: netip.AddrPortFrom(rs.Address, rs.Port), Forward: vs.Forward, GUEPort: vs.TunPort}
			out = append(out, end)
		}
	}
	return out
}
