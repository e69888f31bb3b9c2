package model

import (
	"net/netip"
	"slices"
)

// FilterNodePortAddresses keeps the addresses inside the prefixes (all when
// there are none), sorted and deduplicated.
func FilterNodePortAddresses(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		keep := len(prefixes) == 0
		for _, p := range prefixes {
			if p.Contains(a) {
				keep = true
				break
			}
		}
		if keep {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
