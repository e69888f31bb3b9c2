package tunnelend

import (
	"fmt"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// ChainPrefix starts the name of every iptables chain this package owns.
// It is not glue.ChainPrefix ("IPVSP-"): the glue deletes every chain of
// its prefix that it does not want.
const ChainPrefix = "IPVSD-"

// The chains: mangle PREROUTING marks outer packets (and clears the flag
// on decapsulated ones), nat PREROUTING DNATs decapsulated packets by
// mark, mangle FORWARD clamps the pods' SYN-ACKs.
const (
	chainMark  = "IPVSD-PREROUTING" // mangle
	chainDNAT  = "IPVSD-PREROUTING" // nat
	chainClamp = "IPVSD-FORWARD"    // mangle
	jumpNote   = "ipvs-proxy: tunnel ends"
)

// owns tells the chains of this package, for glue.RestoreInput.
func owns(_, chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }

// numbered is an end with its endpoint's number (the mark's id bits).
type numbered struct {
	End
	id int
}

// tables returns the iptables state that ends the tunnels of ends (sorted,
// their endpoints numbered). Without ends the tables hold none of our
// chains, so that applying them removes everything.
func tables(m marks, mtu int, ends []numbered) []glue.Table {
	mangle := glue.Table{Name: "mangle"}
	nat := glue.Table{Name: "nat"}
	if len(ends) == 0 {
		return []glue.Table{mangle, nat}
	}
	mangle.Chains = []string{chainMark, chainClamp}
	mangle.Jumps = []glue.Jump{{Chain: "PREROUTING", Comment: jumpNote, Target: chainMark}, {Chain: "FORWARD", Comment: jumpNote, Target: chainClamp}}
	nat.Chains = []string{chainDNAT}
	nat.Jumps = []glue.Jump{{Chain: "PREROUTING", Comment: jumpNote, Target: chainDNAT}}

	// The decapsulated packet keeps the outer packet's mark: clear the
	// flag, so that the policy rule does not deliver it locally too.
	mangle.Rules = append(mangle.Rules, fmt.Sprintf("-A %s -i %s -m mark --mark %#x/%#x -j MARK --set-xmark 0x0/%#x",
		chainMark, Device, m.flag, m.flag, m.flag))
	seen := map[string]bool{}
	for _, e := range ends {
		for _, r := range markRules(m, e) {
			if !seen[r] {
				seen[r] = true
				mangle.Rules = append(mangle.Rules, r)
			}
		}
	}
	for _, e := range ends {
		nat.Rules = append(nat.Rules, fmt.Sprintf("-A %s -d %s/32 -i %s -p %s -m mark --mark %#x/%#x -m %s --dport %d -j DNAT --to-destination %s",
			chainDNAT, e.VIP, Device, proto(e.Protocol), m.inner(e.id), m.ids, proto(e.Protocol), e.Port, e.Endpoint))
		if e.Protocol == ktypes.TCP {
			mangle.Rules = append(mangle.Rules, fmt.Sprintf("-A %s -s %s/32 -p tcp -m tcp --sport %d --tcp-flags SYN,RST,ACK SYN,ACK "+
				"-m conntrack --ctorigdst %s --ctorigdstport %d -j TCPMSS --set-mss %d",
				chainClamp, e.Endpoint.Addr(), e.Endpoint.Port(), e.VIP, e.Port, mss(mtu, e.End)))
		}
	}
	return []glue.Table{mangle, nat}
}

// markRules mark an outer packet to the end's endpoint: IPIP (protocol 4)
// always, and GUE (UDP to its port) for a GUE end. A connection keeps
// its real server's forwarding method but not its encapsulation: IPVS
// reads the tunnel's type and port from the real server at each packet,
// so after the Service goes from gue to nat (or tunnel) the connections
// still tunnelled arrive as plain IPIP (DSR.md, step 1's facts).
func markRules(m marks, e numbered) []string {
	rule := func(match string) string {
		return fmt.Sprintf("-A %s -d %s/32 %s -j MARK --set-xmark %#x/%#x", chainMark, e.Endpoint.Addr(), match, m.outer(e.id), m.mask)
	}
	out := []string{rule("-p 4")}
	if e.Forward == ktypes.ForwardGUE {
		out = append(out, rule(fmt.Sprintf("-p udp -m udp --dport %d", e.GUEPort)))
	}
	return out
}

// mss is the clamp: the path MTU less the IPv4 and TCP headers and the
// tunnel's.
func mss(mtu int, e End) int { return mtu - 40 - e.overhead() }

func proto(p ktypes.Protocol) string { return strings.ToLower(p.String()) }

// normalize rewrites what iptables-save prints differently from what was
// written: protocol 4 by its /etc/protocols name.
func normalize(s glue.Saved) {
	for _, t := range s {
		for chain, rules := range t.Rules {
			if !strings.HasPrefix(chain, ChainPrefix) {
				continue
			}
			for i, r := range rules {
				rules[i] = strings.Replace(r, " -p ipencap ", " -p 4 ", 1)
			}
		}
	}
}

// asSaved is what the kernel holds after tables were applied to a
// kernel without our chains: what a partial sync compares against.
func asSaved(ts []glue.Table) glue.Saved {
	s := glue.Saved{}
	for _, t := range ts {
		st := &glue.SavedTable{Rules: map[string][]string{}, Policies: map[string]string{}}
		st.Chains = append(st.Chains, t.Chains...)
		for _, j := range t.Jumps {
			st.Rules[j.Chain] = append(st.Rules[j.Chain], "-A "+j.Chain+" "+j.Spec())
		}
		for _, r := range t.Rules {
			chain, _, _ := strings.Cut(r[3:], " ")
			st.Rules[chain] = append(st.Rules[chain], r)
		}
		s[t.Name] = st
	}
	return s
}

// natOrder is the restore input that moves our nat PREROUTING jump ahead
// of the glue's (its IPVSP-SERVICES would mark the decapsulated packet for
// masquerade, and the pod would see the node's address): "" when it is
// already ahead or either is missing.
func natOrder(s glue.Saved) string {
	t := s["nat"]
	if t == nil {
		return ""
	}
	ours := "-A PREROUTING " + (glue.Jump{Chain: "PREROUTING", Comment: jumpNote, Target: chainDNAT}).Spec()
	for _, r := range t.Rules["PREROUTING"] {
		switch {
		case r == ours:
			return ""
		case strings.HasSuffix(r, " -j "+glue.ChainPrefix+"SERVICES"):
			for _, later := range t.Rules["PREROUTING"] {
				if later == ours {
					spec := strings.TrimPrefix(ours, "-A PREROUTING ")
					return "*nat\n-D PREROUTING " + spec + "\n-I PREROUTING 1 " + spec + "\nCOMMIT\n"
				}
			}
			return ""
		}
	}
	return ""
}
