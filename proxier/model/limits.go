package model

import (
	"fmt"
	"net/netip"
	"slices"
)

// Limits bound what one Service may ask of a node. Any tenant who can write
// a Service and EndpointSlices in their own namespace chooses these counts
// (1,024 externalIPs × 1,025 ports is a valid Service; ten EndpointSlices
// of 1,000 endpoints × 100 ports are valid slices), and every node programs
// them: past a limit the Service is refused whole (ServicePlan.Refused),
// with an Event, and nothing of it reaches the kernel, so that it harms
// only itself, not the node's sets, memory or sync time. A zero field takes
// its default (DefaultLimits).
type Limits struct {
	// VirtualServers per Service: its ports × its addresses (clusterIPs,
	// externalIPs, LoadBalancer IPs, and the node's node-port addresses
	// for each port with a node port).
	VirtualServers int
	// RealServersPerVirtualServer: the endpoints of one port in one
	// family.
	RealServersPerVirtualServer int
	// RealServers per Service, over all its virtual servers; the endpoint
	// ports of its EndpointSlices are held to the same bound before any
	// real server is built.
	RealServers int
	// SetEntries per Service in the iptables glue's sets, counted from the
	// plan as the most the glue may write for it (setEntriesBound).
	SetEntries int
}

// DefaultLimits fit the largest clusters Kubernetes is tested at (5,000
// nodes, 150,000 pods, 10,000 Services) with room: a dual-stack Service of
// 1,000 ports with node ports on four node addresses and a LoadBalancer IP
// wants 12,000 virtual servers; 5,000 endpoints × 10 ports on six
// addresses, 300,000 real servers. The kernel's IPVS and ipset take all of
// it; only a Service that asks for more is refused.
func DefaultLimits() Limits {
	return Limits{
		VirtualServers:              16384,
		RealServersPerVirtualServer: 32768,
		RealServers:                 524288,
		SetEntries:                  131072,
	}
}

// OrDefault returns l with each zero field set to its default.
func (l Limits) OrDefault() Limits {
	d := DefaultLimits()
	pick := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	return Limits{
		VirtualServers:              pick(l.VirtualServers, d.VirtualServers),
		RealServersPerVirtualServer: pick(l.RealServersPerVirtualServer, d.RealServersPerVirtualServer),
		RealServers:                 pick(l.RealServers, d.RealServers),
		SetEntries:                  pick(l.SetEntries, d.SetEntries),
	}
}

// Validate rejects negative limits.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"virtualServers", l.VirtualServers}, {"realServersPerVirtualServer", l.RealServersPerVirtualServer},
		{"realServers", l.RealServers}, {"setEntries", l.SetEntries}} {
		if f.v < 0 {
			return fmt.Errorf("service limit %s is %d; want 0 (the default) or more", f.name, f.v)
		}
	}
	return nil
}

// refuse marks the Service as over a limit; the first reason stands.
func (b *planBuilder) refuse(format string, args ...any) {
	if b.refused == "" {
		b.refused = "not programmed: " + fmt.Sprintf(format, args...)
	}
}

// checkSize refuses a Service whose virtual servers or endpoint ports are
// over the limits, before any is built: the counts come from the spec and
// the parsed slices, so a hostile Service costs its parse, not its plan.
func (b *planBuilder) checkSize(addrs buildAddrs) {
	lim := b.cfg.Limits.OrDefault()
	vss := 0
	for _, p := range b.svc.Spec.Ports {
		vss += len(addrs.service)
		if p.NodePort != 0 {
			vss += len(addrs.node)
		}
	}
	if vss > lim.VirtualServers {
		b.refuse("the Service wants %d virtual servers (ports × addresses), more than the limit of %d", vss, lim.VirtualServers)
		return
	}
	eps := 0
	for _, s := range b.slices {
		eps += len(s.endpoints) * len(s.ports)
	}
	if eps > lim.RealServers {
		b.refuse("its EndpointSlices hold %d endpoint ports, more than the limit of %d real servers", eps, lim.RealServers)
	}
}

// checkRealServers counts a virtual server's real servers against the
// limits; false when the Service is refused.
func (b *planBuilder) checkRealServers(vs VSPlan) bool {
	lim := b.cfg.Limits.OrDefault()
	n := len(vs.RealServers)
	b.realServers += n
	switch {
	case n > lim.RealServersPerVirtualServer:
		b.refuse("virtual server %s wants %d real servers, more than the limit of %d", vs.VSKey, n, lim.RealServersPerVirtualServer)
	case b.realServers > lim.RealServers:
		b.refuse("the Service wants more than %d real servers, the limit", lim.RealServers)
	}
	return b.refused == ""
}

// checkSetEntries refuses a Service whose plan could put more entries in the
// glue's sets than the limit: counted here, from the plan, so that a
// Service over it is refused whole (no virtual server either), never left
// half programmed.
func (b *planBuilder) checkSetEntries() {
	lim := b.cfg.Limits.OrDefault()
	if n := setEntriesBound(b.vss, func(a netip.Addr) bool { return b.nodeRS[a] }); n > lim.SetEntries {
		b.refuse("the Service would put up to %d entries in the iptables glue's sets, more than the limit of %d", n, lim.SetEntries)
	}
}

// setEntriesBound is the most entries the glue writes for these virtual
// servers (proxier/glue's serviceEntries): per virtual server its SERVICE
// entry, one of CLUSTER-IP, EXTERNAL or IN-CLUSTER-ONLY, its address in VIP;
// a firewalled LoadBalancer's LB-FW and LB-SRC-IP entries and one LB-SRC
// entry per range; and a hairpin entry per real server on this node; plus
// the health-check port.
func setEntriesBound(vss []VSPlan, onNode func(netip.Addr) bool) int {
	n := 1
	for _, vs := range vss {
		n += 3
		if len(vs.SourceRanges) > 0 {
			n += 2 + len(vs.SourceRanges)
		}
		for _, rs := range vs.RealServers {
			if onNode(rs.Address) {
				n++
			}
		}
	}
	return n
}

// SetEntriesBound is the most entries the glue writes for a plan (the
// bound Limits.SetEntries is checked against).
func SetEntriesBound(p *ServicePlan) int {
	return setEntriesBound(p.VirtualServers, func(a netip.Addr) bool {
		_, ok := slices.BinarySearchFunc(p.NodeEndpoints, a, netip.Addr.Compare)
		return ok
	})
}
