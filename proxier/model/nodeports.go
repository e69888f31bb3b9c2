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
	named := map[bool]bool{} // is4 → some prefix is of that family
	for _, p := range prefixes {
		named[p.Addr().Unmap().Is4()] = true
	}
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

// HealthCheckListen is where the health-check node ports listen, given the
// node's addresses and the nodePortAddresses prefixes: nil (every address)
// without prefixes; else, per family, the addresses the prefixes keep, or
// the family's unspecified address (all of it, now and later) where no
// prefix names the family. fallback lists the named families whose prefixes
// keep no address of the node: they listen on all of it too.
func HealthCheckListen(addrs []netip.Addr, prefixes []netip.Prefix) (listen []netip.Addr, fallback []string) {
	if len(prefixes) == 0 {
		return nil, nil
	}
	named := map[bool]bool{}
	for _, p := range prefixes {
		named[p.Addr().Unmap().Is4()] = true
	}
	kept := FilterNodePortAddresses(addrs, prefixes)
	families := []struct {
		is4  bool
		name string
		all  netip.Addr
	}{{true, "IPv4", netip.IPv4Unspecified()}, {false, "IPv6", netip.IPv6Unspecified()}}
	for _, f := range families {
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
