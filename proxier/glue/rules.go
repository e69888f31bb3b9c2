package glue

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// ChainPrefix starts the name of every iptables chain ipvs-proxy owns.
const ChainPrefix = "IPVSP-"

// Packet marks. The bits are Kubernetes' conventions (kube-proxy's
// --iptables-masquerade-bit 14 and kubelet's drop bit 15), so that a node
// migrating from kube-proxy sees the same meaning on the same bit.
const (
	// MarkMasq asks POSTROUTING to masquerade the connection.
	MarkMasq = "0x4000"
	// MarkDrop asks filter INPUT/OUTPUT to drop the packet (it came from
	// outside a LoadBalancer's source ranges).
	MarkDrop = "0x8000"
)

// Our chains.
const (
	chainServices    = "IPVSP-SERVICES"
	chainFirewall    = "IPVSP-FIREWALL"
	chainInCluster   = "IPVSP-IN-CLUSTER"
	chainMarkMasq    = "IPVSP-MARK-MASQ"
	chainPostrouting = "IPVSP-POSTROUTING"
	chainInput       = "IPVSP-INPUT"
	chainSrcRanges   = "IPVSP-SOURCE-RANGES"
	chainForward     = "IPVSP-FORWARD"
	chainOutput      = "IPVSP-OUTPUT"
	chainDSR         = "IPVSP-DSR"
	chainDSRHost     = "IPVSP-DSR-HOST"
	chainDSRRedirect = "IPVSP-DSR-REDIRECT"
)

// RuleConfig is everything the rules depend on. Services are not part of
// it but for Redirects: every other per-Service datum lives in ipsets, so
// the rules are the same for 0 and for 100,000 Services without direct
// server return.
type RuleConfig struct {
	Family ipset.Family
	// MasqueradeAll masquerades all traffic to clusterIPs.
	MasqueradeAll bool
	// ClusterCIDR is set when --cluster-cidr has a prefix of this family:
	// traffic to clusterIPs from outside it is masqueraded. Without one
	// (and without MasqueradeAll) clusterIP traffic keeps its source,
	// except the node's own connections from a VIP.
	ClusterCIDR bool
	// BridgeInterface and InterfacePrefix tell pods' traffic by the
	// interface it arrives on (kube-proxy's detectLocalMode
	// BridgeInterface and InterfaceNamePrefix), instead of ClusterCIDR.
	BridgeInterface, InterfacePrefix string
	// AcceptServices accepts traffic to a Service's virtual servers in
	// filter INPUT, ahead of the host's own firewall rules (for hosts
	// whose INPUT drops by default). Off, as in kube-proxy's IPVS mode,
	// Service traffic returns from IPVSP-INPUT and the host's rules after
	// it decide: node ports stay behind the operator's firewall.
	AcceptServices bool
	// Redirects are the tunnelled virtual servers of this family, sorted:
	// one DNAT rule each (a DNAT target takes one address, which no set
	// can give), bounded per Service by the model.
	Redirects []Redirect
}

// Redirect sends in-cluster clients of a tunnelled virtual server (VIP,
// Protocol, Port) to To, the Service's clusterIP and port, which IPVS
// NATs: a tunnelled reply would reach a pod's node from the VIP, one of
// that node's own addresses, and be dropped as a martian.
type Redirect struct {
	VIP      netip.Addr
	Protocol ktypes.Protocol
	Port     uint16
	To       netip.AddrPort
}

func (r Redirect) compare(o Redirect) int {
	return ktypes.VSKey{Address: r.VIP, Protocol: r.Protocol, Port: r.Port}.Compare(
		ktypes.VSKey{Address: o.VIP, Protocol: o.Protocol, Port: o.Port})
}

// rule is the redirect's rule in IPVSP-DSR-REDIRECT, as iptables-save
// prints it.
func (r Redirect) rule() string {
	proto := strings.ToLower(r.Protocol.String())
	return fmt.Sprintf("-A %s -d %s -p %s -m %s --dport %d -j DNAT --to-destination %s",
		chainDSRRedirect, netip.PrefixFrom(r.VIP, r.VIP.BitLen()), proto, proto, r.Port, r.To)
}

// localMatch is the match of pods' traffic (negated: of all other traffic),
// and whether anything tells it. Interface matches come first in a rule, as
// iptables-save prints them.
func (c RuleConfig) localMatch(negate bool) (iface, set string, ok bool) {
	not := ""
	if negate {
		not = "! "
	}
	switch {
	case c.ClusterCIDR:
		return "", "-m set " + not + "--match-set " + SetName(setClusterCIDR, c.Family) + " src", true
	case c.BridgeInterface != "":
		return not + "-i " + c.BridgeInterface, "", true
	case c.InterfacePrefix != "":
		return not + "-i " + c.InterfacePrefix + "+", "", true
	}
	return "", "", false
}

// Jump is one rule in a built-in chain that sends packets to one of ours.
type Jump struct {
	Chain   string // the built-in chain
	Comment string
	Target  string
}

// Spec is the jump's rule as iptables-save prints it, without "-A CHAIN".
func (j Jump) Spec() string {
	return `-m comment --comment "` + j.Comment + `" -j ` + j.Target
}

// Table is what ipvs-proxy wants in one iptables table.
type Table struct {
	Name string
	// Chains are our chains, in declaration order.
	Chains []string
	// Jumps are inserted at the top of built-in chains.
	Jumps []Jump
	// Rules are "-A CHAIN ..." lines of our chains, written as iptables-save
	// prints them, so that the kernel's state compares equal to them.
	Rules []string
}

// Rules returns the tables ipvs-proxy wants for one family. It is a pure
// function of its configuration.
//
// The rules hang off these hooks:
//
//   - nat PREROUTING and OUTPUT → IPVSP-SERVICES: the first packet of each
//     connection to a Service, before IPVS sees it (IPVS schedules remote
//     traffic in LOCAL_IN and the node's own in LOCAL_OUT, both after
//     these). Here the connection is marked for masquerade, and packets
//     from outside a LoadBalancer's source ranges are marked for drop.
//   - nat POSTROUTING → IPVSP-POSTROUTING: after IPVS has rewritten the
//     destination to a real server; masquerades the marked connections and
//     hairpin ones (a pod balanced to itself).
//   - filter INPUT → IPVSP-INPUT: before IPVS's LOCAL_IN hook; drops marked
//     packets, checks every packet to a LoadBalancer with source ranges
//     against them (IPVSP-SOURCE-RANGES: a narrowed range cuts the flows
//     it no longer holds, as kube-proxy's IPVS mode does; nat sees only a
//     connection's first packet), accepts Service traffic (VIP and node
//     ports) and health-check node ports, and rejects new connections to a
//     VIP on any other port (with a TCP reset, or an ICMP port
//     unreachable).
//   - filter OUTPUT → IPVSP-OUTPUT: the node's own connections, after IPVS
//     scheduled them in LOCAL_OUT; drops the marked ones.
//   - filter FORWARD → IPVSP-FORWARD: real servers' replies cross FORWARD on
//     their way back to the client; accepted even under a default-drop
//     policy, like marked traffic.
func Rules(c RuleConfig) []Table {
	set := func(base string) string { return SetName(base, c.Family) }
	hc := SetName(setHealthCheck, ipset.None)
	reject := "icmp-port-unreachable"
	if c.Family == ipset.IPv6 {
		reject = "icmp6-port-unreachable"
	}

	nat := Table{
		Name: "nat",
		Chains: []string{chainServices, chainFirewall, chainInCluster, chainMarkMasq, chainPostrouting,
			chainDSR, chainDSRHost, chainDSRRedirect},
		Jumps: []Jump{
			{"PREROUTING", "ipvs-proxy: Service traffic", chainServices},
			{"OUTPUT", "ipvs-proxy: Service traffic", chainServices},
			{"POSTROUTING", "ipvs-proxy: masquerade", chainPostrouting},
		},
	}
	add := func(t *Table, chain string, rule ...string) {
		rule = slices.DeleteFunc(rule, func(s string) bool { return s == "" })
		t.Rules = append(t.Rules, "-A "+chain+" "+strings.TrimSpace(strings.Join(rule, " ")))
	}
	add(&nat, chainServices, "-m set --match-set", set(setLBFirewall), "dst,dst -j", chainFirewall)
	add(&nat, chainServices, "-m set --match-set", set(setDSR), "dst,dst -j", chainDSR)
	notLocalIface, notLocalSet, detected := c.localMatch(true)
	switch {
	case c.MasqueradeAll:
		add(&nat, chainServices, "-m set --match-set", set(setClusterIP), "dst,dst -j", chainMarkMasq)
	case detected:
		add(&nat, chainServices, notLocalIface, "-m set --match-set", set(setClusterIP), "dst,dst", notLocalSet, "-j", chainMarkMasq)
	default:
		// Nothing tells pods' traffic apart, so clusterIP traffic keeps its
		// source, but not the node's own connections from a VIP: the local
		// route of a VIP on the dummy interface names the VIP as source, and
		// a real server on another node would answer to a VIP its own node
		// owns (kube-proxy's IPVS mode masquerades these too).
		add(&nat, chainServices, "-m set --match-set", set(setClusterIP), "dst,dst -m set --match-set",
			set(setVIP), "src -j", chainMarkMasq)
	}
	add(&nat, chainServices, "-m set --match-set", set(setInClusterOnly), "dst,dst -j", chainInCluster)
	add(&nat, chainServices, "-m set --match-set", set(setExternal), "dst,dst -j", chainMarkMasq)
	add(&nat, chainFirewall, "-m set --match-set", set(setLBSource), "dst,dst,src -j RETURN")
	add(&nat, chainFirewall, "-m set --match-set", set(setLBSourceIP), "dst,dst,src -j RETURN")
	add(&nat, chainFirewall, "-j MARK --set-xmark", MarkDrop+"/"+MarkDrop)
	// An external address of a Local Service without a local endpoint:
	// pods keep their source, the node's own connections are masqueraded
	// (their source may be a VIP, as above), the rest of the world is
	// dropped, as it would find no local endpoint.
	if localIface, localSet, ok := c.localMatch(false); ok {
		add(&nat, chainInCluster, localIface, localSet, "-j RETURN")
	}
	add(&nat, chainInCluster, "-m addrtype ! --src-type LOCAL -j MARK --set-xmark", MarkDrop+"/"+MarkDrop)
	add(&nat, chainInCluster, "-j MARK --set-xmark", MarkMasq+"/"+MarkMasq)
	add(&nat, chainMarkMasq, "-j MARK --set-xmark", MarkMasq+"/"+MarkMasq)
	add(&nat, chainPostrouting, "-m set --match-set", set(setHairpin), "dst,dst,src -j MASQUERADE")
	add(&nat, chainPostrouting, "-m mark ! --mark", MarkMasq+"/"+MarkMasq, "-j RETURN")
	add(&nat, chainPostrouting, "-j MARK --set-xmark", MarkMasq+"/0x0")
	add(&nat, chainPostrouting, "-j MASQUERADE --random-fully")
	dsrRules(&nat, c, add)

	filter := Table{
		Name:   "filter",
		Chains: []string{chainInput, chainSrcRanges, chainForward, chainOutput},
		Jumps: []Jump{
			{"INPUT", "ipvs-proxy: source ranges, Service ports, VIP protection", chainInput},
			{"FORWARD", "ipvs-proxy: marked and established traffic", chainForward},
			{"OUTPUT", "ipvs-proxy: source ranges of traffic from the node", chainOutput},
		},
	}
	add(&filter, chainInput, "-m mark --mark", MarkDrop+"/"+MarkDrop, "-j DROP")
	add(&filter, chainInput, "-m set --match-set", set(setLBFirewall), "dst,dst -j", chainSrcRanges)
	serviceVerdict := "RETURN" // past the VIP protection; the host's rules decide
	if c.AcceptServices {
		serviceVerdict = "ACCEPT"
	}
	add(&filter, chainInput, "-m set --match-set", set(setService), "dst,dst -j", serviceVerdict)
	add(&filter, chainInput, "-p tcp -m set --match-set", hc, "dst -j ACCEPT")
	// A reset for TCP (ICMP errors are rate-limited per client), an ICMP
	// port unreachable for the rest.
	add(&filter, chainInput, "-p tcp -m set --match-set", set(setVIP), "dst -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset")
	add(&filter, chainInput, "-m set --match-set", set(setVIP), "dst -m conntrack --ctstate NEW -j REJECT --reject-with", reject)
	// The addresses of a routed Service range are local too, Services'
	// or not.
	add(&filter, chainInput, "-p tcp -m set --match-set", set(setServiceRange), "dst -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset")
	add(&filter, chainInput, "-m set --match-set", set(setServiceRange), "dst -m conntrack --ctstate NEW -j REJECT --reject-with", reject)
	add(&filter, chainSrcRanges, "-m set --match-set", set(setLBSource), "dst,dst,src -j RETURN")
	add(&filter, chainSrcRanges, "-m set --match-set", set(setLBSourceIP), "dst,dst,src -j RETURN")
	add(&filter, chainSrcRanges, "-j DROP")
	add(&filter, chainForward, "-m mark --mark", MarkMasq+"/"+MarkMasq, "-j ACCEPT")
	add(&filter, chainForward, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
	add(&filter, chainOutput, "-m mark --mark", MarkDrop+"/"+MarkDrop, "-j DROP")
	return []Table{nat, filter}
}

// dsrRules send in-cluster clients of a tunnelled virtual server to its
// clusterIP: pods keep their source (unless every clusterIP connection is
// masqueraded), the node's own connections are masqueraded as they are to
// a clusterIP; the rest of the world returns to IPVSP-SERVICES, and IPVS
// tunnels it. The agent turns direct server return off where nothing tells
// pods' traffic apart (model.DSRConfig), so that the tunnel never takes
// pods' connections.
func dsrRules(nat *Table, c RuleConfig, add func(t *Table, chain string, rule ...string)) {
	if iface, set, ok := c.localMatch(false); ok {
		to := chainDSRRedirect
		if c.MasqueradeAll {
			to = chainDSRHost
		}
		add(nat, chainDSR, iface, set, "-j", to)
	}
	add(nat, chainDSR, "-m addrtype --src-type LOCAL -j", chainDSRHost)
	add(nat, chainDSRHost, "-j MARK --set-xmark", MarkMasq+"/"+MarkMasq)
	add(nat, chainDSRHost, "-j", chainDSRRedirect)
	for _, r := range c.Redirects {
		nat.Rules = append(nat.Rules, r.rule())
	}
}

// Dump renders tables as an iptables-restore input that creates them on a
// node without any of ipvs-proxy's rules: the "rule dump".
func Dump(tables []Table) string {
	var b strings.Builder
	for _, t := range tables {
		b.WriteString("*" + t.Name + "\n")
		for _, c := range t.Chains {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, j := range t.Jumps {
			b.WriteString("-I " + j.Chain + " 1 " + j.Spec() + "\n")
		}
		for _, r := range t.Rules {
			b.WriteString(r + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
