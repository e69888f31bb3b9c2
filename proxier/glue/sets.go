package glue

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// The sets, by base name. Per family: "IPVSP-" + base for IPv4,
// "IPVSP-6-" + base for IPv6; the health-check ports set serves both.
const (
	// setClusterIP: clusterIP,proto:port of every clusterIP virtual server.
	setClusterIP = "CLUSTER-IP"
	// setExternal: ip,proto:port of every externalIP, LoadBalancer and
	// node-port virtual server under externalTrafficPolicy Cluster (these
	// are masqueraded; under Local the source is preserved).
	setExternal = "EXTERNAL"
	// setInClusterOnly: ip,proto:port of every externalIP, LoadBalancer and
	// node-port virtual server of a Local Service without a usable local
	// endpoint: it serves in-cluster clients only (from every endpoint).
	setInClusterOnly = "IN-CLUSTER-ONLY"
	// setService: every virtual server, accepted in filter INPUT.
	setService = "SERVICE"
	// setVIP: every address on the dummy interface and every clusterIP in
	// a routed Service range (VIP protection; the node's own connections
	// from one are masqueraded).
	setVIP = "VIP"
	// setServiceRange: the Service ranges routed as local through the
	// dummy interface (protection of their addresses that are no
	// Service's).
	setServiceRange = "SERVICE-RANGE"
	// setLBFirewall: LoadBalancer virtual servers with source ranges.
	setLBFirewall = "LB-FW"
	// setLBSource: lbIP,proto:port,range for each allowed range.
	setLBSource = "LB-SRC"
	// setLBSourceIP: lbIP,proto:port,lbIP when a range holds one of the
	// node's (node-port) addresses: the node's own connections to a VIP
	// bound locally come from the VIP itself.
	setLBSourceIP = "LB-SRC-IP"
	// setHairpin: rs,proto:rsport,rs for every real server (a pod balanced
	// to itself is masqueraded, or its reply would skip IPVS).
	setHairpin = "HAIRPIN"
	// setClusterCIDR: the --cluster-cidr prefixes.
	setClusterCIDR = "CLUSTER-CIDR"
	// setHealthCheck: health-check node ports (bitmap:port, both families).
	setHealthCheck = "HC-NODE-PORT"
	// setDSR: ip,proto:port of every externalIP and LoadBalancer virtual
	// server whose external traffic is tunnelled (direct server return):
	// in-cluster clients of it are redirected to its clusterIP (Redirect).
	setDSR = "DSR"
)

type setType struct {
	base string
	typ  ipset.Type
}

// setTypes gives each base name its type, in the order a sync writes them:
// the sets that restrict a virtual server (protection, source ranges,
// in-cluster only) before SERVICE, the one that accepts it, so that a
// virtual server is accepted only once its restrictions are in place, and
// a Service whose restrictions could not be written is kept out of
// SERVICE (Glue.withheld): it fails closed, not open.
var setTypes = []setType{
	{setClusterIP, ipset.HashIPPort},
	{setExternal, ipset.HashIPPort},
	{setDSR, ipset.HashIPPort},
	{setVIP, ipset.HashIP},
	{setServiceRange, ipset.HashNet},
	{setInClusterOnly, ipset.HashIPPort},
	{setLBFirewall, ipset.HashIPPort},
	{setLBSource, ipset.HashIPPortNet},
	{setLBSourceIP, ipset.HashIPPortIP},
	{setService, ipset.HashIPPort},
	{setHairpin, ipset.HashIPPortIP},
	{setClusterCIDR, ipset.HashNet},
	{setHealthCheck, ipset.BitmapPort},
}

// restricts reports whether a set's entries restrict who reaches a virtual
// server that SERVICE accepts (a missing entry would let too much in).
func restricts(base string) bool { return base == setInClusterOnly || base == setLBFirewall }

// SetName is the name of a set of a family (ipset.None for the bitmap).
func SetName(base string, f ipset.Family) string {
	if f == ipset.IPv6 {
		return ipset.Prefix + "6-" + base
	}
	return ipset.Prefix + base
}

// setID names one set: a base and a family.
type setID struct {
	base string
	fam  ipset.Family
}

func (id setID) name() string { return SetName(id.base, id.fam) }

// spec is the set's spec with a hash set's maxelem (ignored for the
// bitmap): see Glue.maxElem.
func (id setID) spec(maxElem uint32) ipset.Spec {
	for _, st := range setTypes {
		if st.base == id.base {
			s := ipset.Spec{Name: id.name(), Type: st.typ, Family: id.fam}
			if st.typ == ipset.BitmapPort {
				s.PortFrom, s.PortTo = 0, 65535
			} else {
				s.MaxElem = maxElem
			}
			return s.Normalized()
		}
	}
	panic("glue: unknown set " + id.base)
}

// maxElemFor is the smallest size for n entries: ipset's default
// (1,048,576), or twice n rounded up to a power of two when that is more.
func maxElemFor(n int) uint32 {
	size := uint64(ipset.DefaultMaxElem)
	for size < 2*uint64(n) && size < 1<<31 {
		size *= 2
	}
	return uint32(size)
}

// nextMaxElem is a hash set's size for n entries when it has cur (0: none
// yet): it grows once n passes half of it, and shrinks only below an
// eighth, so that a count moving to and fro across a power of two does not
// rebuild a set of a million entries at each crossing. A size that changes
// is a new spec: the Syncer fills a set of the new size and swaps it in. So
// a set never fills: the Services' limits bound each one's share, their
// number the apiserver's quotas.
func nextMaxElem(cur uint32, n int) uint32 {
	want := maxElemFor(n)
	switch {
	case cur == 0, uint64(2*n) > uint64(cur):
		return max(want, cur)
	case cur > ipset.DefaultMaxElem && uint64(8*n) < uint64(cur):
		return want
	}
	return cur
}

// setIDs lists the sets of the enabled families, in a fixed order.
func setIDs(ipv4, ipv6 bool) []setID {
	var out []setID
	for _, st := range setTypes {
		if st.typ == ipset.BitmapPort {
			out = append(out, setID{st.base, ipset.None})
			continue
		}
		if ipv4 {
			out = append(out, setID{st.base, ipset.IPv4})
		}
		if ipv6 {
			out = append(out, setID{st.base, ipset.IPv6})
		}
	}
	return out
}

// entries is one Service's contribution to the sets.
// setRef is a setID in one byte: the base's index in setTypes times
// three, plus the family's index (None, IPv4, IPv6).
type setRef uint8

func refOf(id setID) setRef {
	i := slices.IndexFunc(setTypes, func(st setType) bool { return st.base == id.base })
	if i < 0 {
		panic("glue: unknown set " + id.base)
	}
	f := 0
	switch id.fam {
	case ipset.IPv4:
		f = 1
	case ipset.IPv6:
		f = 2
	}
	return setRef(3*i + f)
}

func (r setRef) id() setID {
	return setID{setTypes[r/3].base, [...]ipset.Family{ipset.None, ipset.IPv4, ipset.IPv6}[r%3]}
}

// held is a Service's set entries, sorted by set and entry, each once: a
// list of 40-byte items, not a map per set (a small map costs most of a
// kilobyte, and a Service has entries in about five sets).
type held []setEntry

type setEntry struct {
	set setRef
	k   ipset.Key
}

func (a setEntry) compare(b setEntry) int {
	if c := cmp.Compare(a.set, b.set); c != 0 {
		return c
	}
	return a.k.Compare(b.k)
}

func (h *held) add(base string, fam ipset.Family, en ipset.Entry) {
	*h = append(*h, setEntry{refOf(setID{base, fam}), en.Key()})
}

// serviceEntries computes the set entries of one Service's plan: a pure
// function of the plan and the node's addresses (which decide whether the
// node itself may reach a LoadBalancer IP that has source ranges). Hairpin
// entries are for the real servers on this node only (plan.NodeEndpoints):
// only a local pod can be balanced to itself.
func serviceEntries(plan *model.ServicePlan, nodeAddrs []netip.Addr) held {
	if plan == nil {
		return nil
	}
	var out held
	if plan.HealthCheckNodePort != 0 {
		out.add(setHealthCheck, ipset.None, ipset.Entry{Port: plan.HealthCheckNodePort})
	}
	for _, vs := range plan.VirtualServers {
		fam := ipset.Of(vs.Address)
		key := ipset.Entry{Addr: vs.Address, Proto: vs.Protocol, Port: vs.Port}
		out.add(setService, fam, key)
		if vs.Kind == model.KindClusterIP {
			out.add(setClusterIP, fam, key)
		}
		switch {
		case vs.Forward != ktypes.ForwardNAT:
			// Tunnelled: the endpoint sees the client's own address and
			// answers it directly; its local endpoints are NATed without
			// masquerade, since their replies pass through this node.
			out.add(setDSR, fam, key)
		case vs.Kind.External() && !vs.Local:
			out.add(setExternal, fam, key)
		}
		if vs.InClusterOnly {
			out.add(setInClusterOnly, fam, key)
		}
		if vs.Held() {
			out.add(setVIP, fam, ipset.Entry{Addr: vs.Address})
		}
		if vs.Kind == model.KindLoadBalancer {
			firewall(&out, vs, key, nodeAddrs)
		}
		for _, rs := range vs.RealServers {
			if _, local := slices.BinarySearchFunc(plan.NodeEndpoints, rs.Address, netip.Addr.Compare); local {
				out.add(setHairpin, fam, ipset.Entry{Addr: rs.Address, Proto: vs.Protocol, Port: rs.Port, Addr2: rs.Address})
			}
		}
	}
	// Each entry once (two ports of one VIP both add the VIP), in a list of
	// its exact size: the glue keeps it until the plan changes.
	slices.SortFunc(out, setEntry.compare)
	return slices.Clone(slices.Compact(out))
}

// usesNodeAddresses reports whether the plan's entries depend on the node's
// addresses: only a LoadBalancer's source ranges do (firewall), so only
// such Services are recomputed when the addresses change, not every
// Service (the first sync learns the addresses after every plan is set).
func usesNodeAddresses(plan *model.ServicePlan) bool {
	return slices.ContainsFunc(plan.VirtualServers, func(vs model.VSPlan) bool {
		return vs.Kind == model.KindLoadBalancer && len(vs.SourceRanges) > 0
	})
}

// firewall adds a LoadBalancer virtual server's source ranges. Ranges of the
// other family can never match, so a VIP whose ranges are all of the other
// family drops everyone; a range of length 0 allows everyone (and ipset
// cannot hold it), so the virtual server is not firewalled at all.
func firewall(out *held, vs model.VSPlan, key ipset.Entry, nodeAddrs []netip.Addr) {
	if len(vs.SourceRanges) == 0 {
		return
	}
	fam := ipset.Of(vs.Address)
	var ranges []netip.Prefix
	for _, r := range vs.SourceRanges {
		if ipset.Of(r.Addr()) != fam {
			continue
		}
		if r.Bits() == 0 {
			return
		}
		ranges = append(ranges, r.Masked())
	}
	out.add(setLBFirewall, fam, key)
	fromNode := false
	for _, r := range ranges {
		out.add(setLBSource, fam, ipset.Entry{Addr: vs.Address, Proto: vs.Protocol, Port: vs.Port, Net: r})
		for _, a := range nodeAddrs {
			fromNode = fromNode || r.Contains(a)
		}
	}
	if fromNode {
		out.add(setLBSourceIP, fam, ipset.Entry{Addr: vs.Address, Proto: vs.Protocol, Port: vs.Port, Addr2: vs.Address})
	}
}

// cidrEntries are the contents of the cluster CIDR set of a family.
func cidrEntries(cidrs []netip.Prefix, fam ipset.Family) []ipset.Entry {
	var out []ipset.Entry
	for _, p := range cidrs {
		if ipset.Of(p.Addr()) == fam && p.Bits() > 0 {
			out = append(out, ipset.Entry{Net: p.Masked()})
		}
	}
	return out
}

// redirectsOf lists the in-cluster redirects of a plan's tunnelled virtual
// servers, sorted.
func redirectsOf(plan *model.ServicePlan) []Redirect {
	if plan == nil {
		return nil
	}
	var out []Redirect
	for _, vs := range plan.VirtualServers {
		if vs.Forward != ktypes.ForwardNAT && vs.InClusterTo.IsValid() {
			out = append(out, Redirect{VIP: vs.Address, Protocol: vs.Protocol, Port: vs.Port, To: vs.InClusterTo})
		}
	}
	slices.SortFunc(out, Redirect.compare)
	return out
}
