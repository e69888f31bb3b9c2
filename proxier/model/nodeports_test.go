package model

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFilterNodePortAddresses: the prefixes apply per family, and a family
// none of them names keeps all its addresses (kube-proxy's rule), so an
// IPv4-only list leaves a dual-stack node its IPv6 node ports.
func TestFilterNodePortAddresses(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	prefixes := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	node := addrs("192.168.56.10", "10.0.2.15", "fd00:56::10", "2001:db8::10", "10.0.2.15")
	for _, tc := range []struct {
		name     string
		prefixes []netip.Prefix
		want     []netip.Addr
	}{
		{"none: every address", nil, addrs("10.0.2.15", "192.168.56.10", "2001:db8::10", "fd00:56::10")},
		{"IPv4 only: every IPv6 address", prefixes("192.168.56.0/24"), addrs("192.168.56.10", "2001:db8::10", "fd00:56::10")},
		{"IPv6 only: every IPv4 address", prefixes("fd00:56::/64"), addrs("10.0.2.15", "192.168.56.10", "fd00:56::10")},
		{"both families", prefixes("10.0.0.0/8", "2001:db8::/32"), addrs("10.0.2.15", "2001:db8::10")},
		{"a family named but matching nothing keeps nothing of it", prefixes("172.16.0.0/12"), addrs("2001:db8::10", "fd00:56::10")},
		{"all of both", prefixes("0.0.0.0/0", "::/0"), addrs("10.0.2.15", "192.168.56.10", "2001:db8::10", "fd00:56::10")},
		{"an IPv4-mapped prefix is IPv4", prefixes("::ffff:192.168.56.0/120"), addrs("192.168.56.10", "2001:db8::10", "fd00:56::10")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, FilterNodePortAddresses(node, tc.prefixes), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("FilterNodePortAddresses(%v) mismatch (-want +got):\n%s", tc.prefixes, diff)
			}
		})
	}
}

// TestHealthCheckListen: the health-check node ports listen on the named
// families' matching addresses, and on the whole of a family the prefixes
// do not name (or whose prefixes match no node address, reported).
func TestHealthCheckListen(t *testing.T) {
	node := []netip.Addr{netip.MustParseAddr("192.168.56.10"), netip.MustParseAddr("10.0.2.15"), netip.MustParseAddr("fd00:56::10")}
	for _, tc := range []struct {
		name         string
		prefixes     []string
		want         []string
		wantFallback []string
	}{
		{"no prefixes: every address (nil)", nil, nil, nil},
		{"IPv4 named: its matches, and all of IPv6", []string{"192.168.56.0/24"}, []string{"192.168.56.10", "::"}, nil},
		{"IPv6 named: all of IPv4, and its matches", []string{"fd00:56::/64"}, []string{"0.0.0.0", "fd00:56::10"}, nil},
		{"both named", []string{"10.0.0.0/8", "fd00::/8"}, []string{"10.0.2.15", "fd00:56::10"}, nil},
		{"a named family matching nothing listens on all of it", []string{"172.16.0.0/12", "fd00::/8"}, []string{"0.0.0.0", "fd00:56::10"}, []string{"IPv4"}},
		{"IPv4-mapped prefix names IPv4", []string{"::ffff:192.168.56.0/120"}, []string{"192.168.56.10", "::"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prefixes []netip.Prefix
			for _, p := range tc.prefixes {
				prefixes = append(prefixes, netip.MustParsePrefix(p))
			}
			addrs, fallback := HealthCheckListen(node, prefixes, true, true)
			var got []string
			for _, a := range addrs {
				got = append(got, a.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("listen mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantFallback, fallback); diff != "" {
				t.Errorf("fallback mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHealthCheckListenServedFamilies: a family the node does not serve (a
// kernel without IPv6) gets no listener: [::] cannot be bound there, and a
// failed bind would close the Service's other listeners.
func TestHealthCheckListenServedFamilies(t *testing.T) {
	node := []netip.Addr{netip.MustParseAddr("10.0.2.15")}
	got, fallback := HealthCheckListen(node, []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}, true, false)
	if len(got) != 1 || got[0] != netip.MustParseAddr("10.0.2.15") || fallback != nil {
		t.Errorf("IPv4 served alone: listen %v (fallback %v), want [10.0.2.15]", got, fallback)
	}
}
