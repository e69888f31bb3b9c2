package model

import (
	"net/netip"
	"slices"
)

// FilterNodePortAddresses keeps the addresses inside the prefixes, sorted and
// deduplicated. The prefixes apply per family, as kube-proxy applies
// nodePortAddresses: a family that no prefix names keeps all its addresses
// (so an IPv4-only list leaves a dual-stack node its IPv6 node ports), and
// no prefixes at all keep every address.
func FilterNodePortAddresses(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Addr {
	prefixes, named := unmapPrefixes(prefixes)
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		keep := !named[a.Is4()]
		for _, p := range prefixes {
			if keep {
				break
			}
			keep = p.Contains(a)
		}
		if keep {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// unmapPrefixes reads IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104) as
// the IPv4 prefixes they are, as addresses are unmapped, and tells which
// families they name (is4 → named).
func unmapPrefixes(prefixes []netip.Prefix) (out []netip.Prefix, named map[bool]bool) {
	named = map[bool]bool{}
	for _, p := range prefixes {
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
		named[p.Addr().Is4()] = true
	}
	return out, named
}

// HealthCheckListen is where the health-check node ports listen, given the
// node's addresses, the nodePortAddresses prefixes and the families the
// node serves (both when neither is set): nil (every address) without
// prefixes; else, per served family, the addresses the prefixes keep, or
// the family's unspecified address (all of it, now and later) where no
// prefix names the family. fallback lists the named families whose
// prefixes keep no address of the node: they listen on all of it too.
func HealthCheckListen(addrs []netip.Addr, prefixes []netip.Prefix, ipv4, ipv6 bool) (listen []netip.Addr, fallback []string) {
	if len(prefixes) == 0 {
		return nil, nil
	}
	if !ipv4 && !ipv6 {
		ipv4, ipv6 = true, true
	}
	_, named := unmapPrefixes(prefixes)
	kept := FilterNodePortAddresses(addrs, prefixes)
	families := []struct {
		is4, served bool
		name        string
		all         netip.Addr
	}{{true, ipv4, "IPv4", netip.IPv4Unspecified()}, {false, ipv6, "IPv6", netip.IPv6Unspecified()}}
	for _, f := range families {
		if !f.served {
			continue // a node without IPv6 cannot listen on [::]
		}
		if !named[f.is4] {
			listen = append(listen, f.all)
			continue
		}
		n := len(listen)
		for _, a := range kept {
			if a.Is4() == f.is4 {
				listen = append(listen, a)
			}
		}
		if len(listen) == n {
			fallback = append(fallback, f.name)
			listen = append(listen, f.all)
		}
	}
	return listen, fallback
}
