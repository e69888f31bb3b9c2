package chaos

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// State is ipvs-proxy's part of a kernel, as the tools print it.
type State struct {
	// Virtual maps each virtual server ("TCP 10.96.0.10:80",
	// "UDP [fd00::1]:53") to its real servers ("10.100.0.2:8080"), sorted.
	Virtual map[string][]string
	// Addrs are the addresses bound to the proxy's interface; nil when
	// the interface is missing.
	Addrs []string
	// Routes are the prefixes routed as local through the proxy's
	// interface ("10.96.0.0/16"), sorted.
	Routes []string
	// Sets maps each IPVSP-* set to its entries as `ipset save` writes
	// them; a missing set has no key.
	Sets map[string][]string
}

// ParseIPVS reads `ipvsadm -Ln` into State.Virtual's form.
func ParseIPVS(out string) map[string][]string {
	vs := map[string][]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			cur = f[0] + " " + f[1]
			if _, ok := vs[cur]; !ok {
				vs[cur] = []string{}
			}
		case len(f) >= 2 && f[0] == "->" && f[1] != "RemoteAddress:Port" && cur != "":
			vs[cur] = append(vs[cur], f[1])
		case len(f) >= 1 && f[0] == "FWM":
			cur = "" // fwmark virtual servers are never ipvs-proxy's
		}
	}
	for k := range vs {
		sort.Strings(vs[k])
	}
	return vs
}

// ParseAddrs reads `ip -o addr show dev IFACE` into addresses without
// their prefix length, the kernel's link-local ones left out.
func ParseAddrs(out string) []string {
	addrs := []string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || (f[2] != "inet" && f[2] != "inet6") {
			continue
		}
		a, _, _ := strings.Cut(f[3], "/")
		if strings.HasPrefix(a, "fe80:") {
			continue
		}
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	return addrs
}

// ParseRoutes reads `ip -4 route show table local dev IFACE` into the
// prefixes routed as local through it; its bound addresses' routes, single
// addresses, are left out.
func ParseRoutes(out string) []string {
	routes := []string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "local" && strings.Contains(f[1], "/") {
			routes = append(routes, f[1])
		}
	}
	sort.Strings(routes)
	return routes
}

// ParseIPSets reads `ipset save` into State.Sets' form (IPVSP-* sets only).
func ParseIPSets(out string) map[string][]string {
	sets := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(f[1], "IPVSP-") {
			continue
		}
		switch {
		case f[0] == "create":
			if _, ok := sets[f[1]]; !ok {
				sets[f[1]] = []string{}
			}
		case f[0] == "add" && len(f) >= 3:
			sets[f[1]] = append(sets[f[1]], f[2])
		}
	}
	for k := range sets {
		sort.Strings(sets[k])
	}
	return sets
}

// Expected is the state a kernel should converge to.
type Expected struct {
	// Virtual are the virtual servers of the Services in scope, each with
	// exactly these real servers.
	Virtual map[string][]string
	// Known are the virtual servers of every other Service: allowed, their
	// real servers not checked.
	Known map[string]bool
	// Addrs must be held (the addresses of Virtual): bound, or inside a
	// range of Routed and then not bound; KnownAddrs may be bound.
	Addrs      map[string]bool
	KnownAddrs map[string]bool
	// Routed are the Service ranges that must be routed as local through
	// the proxy's interface (routeServiceCIDRs, the default), and the
	// only ones.
	Routed []netip.Prefix
	// Ownership, as the README states it: a virtual server on a bound
	// address, on a Service range address, or on a node address with a
	// port in the node-port range is ipvs-proxy's; any other one is
	// another tool's, never a leak.
	ServiceCIDRs  []netip.Prefix
	NodeAddrs     []string
	NodePortRange [2]int
}

// Diff is what a kernel lacks (Missing: not converged yet) and has too
// much (Leaks) compared with an Expected.
type Diff struct {
	Missing []string
	Leaks   []string
}

// Converged reports whether nothing is missing and nothing leaked.
func (d Diff) Converged() bool { return len(d.Missing) == 0 && len(d.Leaks) == 0 }

// String summarises the diff, the first few of each kind.
func (d Diff) String() string {
	first := func(s []string) string {
		if len(s) > 8 {
			return strings.Join(s[:8], "; ") + fmt.Sprintf("; ... (%d in all)", len(s))
		}
		return strings.Join(s, "; ")
	}
	return fmt.Sprintf("%d missing [%s], %d leaked [%s]", len(d.Missing), first(d.Missing), len(d.Leaks), first(d.Leaks))
}

// splitVS splits "TCP 10.96.0.10:80" into its protocol, address and port.
func splitVS(vs string) (proto string, addr netip.Addr, port int, ok bool) {
	proto, hp, found := strings.Cut(vs, " ")
	if !found {
		return "", netip.Addr{}, 0, false
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", netip.Addr{}, 0, false
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return "", netip.Addr{}, 0, false
	}
	port, err = strconv.Atoi(p)
	return proto, a, port, err == nil
}

// setEntry is a virtual server as an entry of a hash:ip,port set, and the
// family prefix of the set's name ("" or "6-").
func setEntry(vs string) (entry, family string, ok bool) {
	proto, a, port, ok := splitVS(vs)
	if !ok {
		return "", "", false
	}
	if a.Is6() {
		family = "6-"
	}
	return fmt.Sprintf("%s,%s:%d", a, strings.ToLower(proto), port), family, true
}

func (e Expected) owned(vs string, bound map[string]bool) bool {
	_, a, port, ok := splitVS(vs)
	if !ok {
		return false
	}
	if bound[a.String()] || e.Addrs[a.String()] || e.KnownAddrs[a.String()] {
		return true
	}
	for _, p := range e.ServiceCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return slices.Contains(e.NodeAddrs, a.String()) && port >= e.NodePortRange[0] && port <= e.NodePortRange[1]
}

// Compare diffs a kernel's state with the expected one: virtual servers
// and their real servers, the interface's addresses, and the sets that
// list virtual servers and addresses (IPVSP-SERVICE and IPVSP-VIP of each
// family).
func Compare(k State, e Expected) Diff {
	var d Diff
	missing := func(f string, a ...any) { d.Missing = append(d.Missing, fmt.Sprintf(f, a...)) }
	leak := func(f string, a ...any) { d.Leaks = append(d.Leaks, fmt.Sprintf(f, a...)) }
	bound := map[string]bool{}
	for _, a := range k.Addrs {
		bound[a] = true
	}
	for vs, want := range e.Virtual {
		got, ok := k.Virtual[vs]
		if !ok {
			missing("virtual server %s", vs)
			continue
		}
		for _, r := range want {
			if !slices.Contains(got, r) {
				missing("real server %s -> %s", vs, r)
			}
		}
		for _, r := range got {
			if !slices.Contains(want, r) {
				leak("real server %s -> %s", vs, r)
			}
		}
	}
	for vs := range k.Virtual {
		if _, ok := e.Virtual[vs]; !ok && !e.Known[vs] && e.owned(vs, bound) {
			leak("virtual server %s", vs)
		}
	}
	if k.Addrs == nil {
		missing("the proxy's interface")
	}
	routed := func(a string) bool {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return false
		}
		for _, p := range e.Routed {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}
	for a := range e.Addrs {
		switch {
		case routed(a) && bound[a]:
			leak("address %s bound inside a routed range", a)
		case !routed(a) && !bound[a]:
			missing("address %s", a)
		}
	}
	anchors := map[string]bool{}
	for _, p := range e.Routed {
		if !slices.Contains(k.Routes, p.String()) {
			missing("route %s", p)
		}
		// The range's anchor, bound beside its route (model.RangeAnchor).
		if a, ok := model.RangeAnchor(p); ok {
			anchors[a.String()] = true
			if !bound[a.String()] {
				missing("anchor %s of route %s", a, p)
			}
		}
	}
	for _, r := range k.Routes {
		if !slices.ContainsFunc(e.Routed, func(p netip.Prefix) bool { return p.String() == r }) {
			leak("route %s", r)
		}
	}
	for a := range bound {
		if !e.Addrs[a] && !e.KnownAddrs[a] && !anchors[a] {
			leak("address %s", a)
		}
	}
	// The sets: what must be there (the scope's), what may be (all).
	must, may := map[string]map[string]bool{}, map[string]map[string]bool{}
	put := func(m map[string]map[string]bool, set, entry string) {
		if m[set] == nil {
			m[set] = map[string]bool{}
		}
		m[set][entry] = true
	}
	for vs := range e.Virtual {
		if en, fam, ok := setEntry(vs); ok {
			put(must, "IPVSP-"+fam+"SERVICE", en)
			put(may, "IPVSP-"+fam+"SERVICE", en)
		}
	}
	for vs := range e.Known {
		if en, fam, ok := setEntry(vs); ok {
			put(may, "IPVSP-"+fam+"SERVICE", en)
		}
	}
	vipSet := func(a string) string {
		if strings.Contains(a, ":") {
			return "IPVSP-6-VIP"
		}
		return "IPVSP-VIP"
	}
	for a := range e.KnownAddrs {
		put(may, vipSet(a), a)
	}
	for a := range e.Addrs {
		put(must, vipSet(a), a)
		put(may, vipSet(a), a)
	}
	for set, entries := range must {
		got, ok := k.Sets[set]
		if !ok {
			missing("set %s", set)
			continue
		}
		for en := range entries {
			if !slices.Contains(got, en) {
				missing("entry %s in %s", en, set)
			}
		}
	}
	for _, set := range []string{"IPVSP-SERVICE", "IPVSP-6-SERVICE", "IPVSP-VIP", "IPVSP-6-VIP"} {
		for _, en := range k.Sets[set] {
			if !may[set][en] {
				leak("entry %s in %s", en, set)
			}
		}
	}
	sort.Strings(d.Missing)
	sort.Strings(d.Leaks)
	return d
}
