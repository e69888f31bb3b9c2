package ipset_test

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"unsafe"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// TestKey: an entry of every set type and family comes back from its key
// unchanged; entries that no type accepts stay refused; distinct entries
// have distinct keys; a key is 38 bytes and holds no pointer.
func TestKey(t *testing.T) {
	a4, b4 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.244.1.7")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00:10::7")
	valid := []struct {
		typ ipset.Type
		fam ipset.Family
		e   ipset.Entry
	}{
		{ipset.HashIP, ipset.IPv4, ipset.Entry{Addr: a4}},
		{ipset.HashIP, ipset.IPv6, ipset.Entry{Addr: a6}},
		{ipset.HashIPPort, ipset.IPv4, ipset.Entry{Addr: a4, Proto: ktypes.TCP, Port: 80}},
		{ipset.HashIPPort, ipset.IPv6, ipset.Entry{Addr: a6, Proto: ktypes.SCTP, Port: 65535}},
		{ipset.HashIPPortIP, ipset.IPv4, ipset.Entry{Addr: b4, Proto: ktypes.UDP, Port: 53, Addr2: b4}},
		{ipset.HashIPPortIP, ipset.IPv6, ipset.Entry{Addr: b6, Proto: ktypes.UDP, Port: 53, Addr2: b6}},
		{ipset.HashIPPortNet, ipset.IPv4, ipset.Entry{Addr: a4, Proto: ktypes.TCP, Port: 443, Net: netip.MustParsePrefix("192.0.2.0/24")}},
		{ipset.HashIPPortNet, ipset.IPv6, ipset.Entry{Addr: a6, Proto: ktypes.TCP, Port: 443, Net: netip.MustParsePrefix("2001:db8::/32")}},
		{ipset.HashNet, ipset.IPv4, ipset.Entry{Net: netip.MustParsePrefix("10.96.0.0/16")}},
		{ipset.HashNet, ipset.IPv4, ipset.Entry{Net: netip.MustParsePrefix("10.96.0.1/32")}},
		{ipset.HashNet, ipset.IPv6, ipset.Entry{Net: netip.MustParsePrefix("fd00:96::/112")}},
		{ipset.BitmapPort, ipset.None, ipset.Entry{Port: 30080}},
	}
	seen := map[ipset.Key]ipset.Entry{}
	for _, tc := range valid {
		if err := tc.typ.Check(tc.fam, tc.e); err != nil {
			t.Fatalf("test entry: %v", err)
		}
		k := tc.e.Key()
		if got := k.Entry(); got != tc.e {
			t.Errorf("%s %s: %s came back as %s", tc.typ, tc.fam, tc.e, got)
		}
		if k.String() != tc.e.String() {
			t.Errorf("key %q, entry %q", k.String(), tc.e.String())
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share a key", tc.e, other)
		}
		seen[k] = tc.e
	}

	// An IPv4 address and its IPv4-mapped IPv6 form are different entries.
	mapped := ipset.Entry{Addr: netip.AddrFrom16(a4.As16())}
	if mapped.Key() == (ipset.Entry{Addr: a4}).Key() || mapped.Key().Entry() != mapped {
		t.Errorf("%s: key shared with %s, or changed (%s)", mapped, a4, mapped.Key().Entry())
	}

	invalid := []struct {
		typ ipset.Type
		fam ipset.Family
		e   ipset.Entry
	}{
		{ipset.HashIP, ipset.IPv6, ipset.Entry{Addr: netip.MustParseAddr("fe80::1%eth0")}},
		{ipset.HashIPPortIP, ipset.IPv6, ipset.Entry{Addr: b6, Proto: ktypes.UDP, Port: 53, Addr2: netip.MustParseAddr("fe80::7%eth0")}},
		{ipset.HashIPPortIP, ipset.IPv4, ipset.Entry{Addr: b4, Proto: ktypes.UDP, Port: 53, Addr2: b4, Net: netip.MustParsePrefix("10.0.0.0/8")}},
		{ipset.HashIPPortNet, ipset.IPv4, ipset.Entry{Addr: b4, Proto: ktypes.UDP, Port: 53, Addr2: b4, Net: netip.MustParsePrefix("10.0.0.0/8")}},
		{ipset.HashIP, ipset.IPv4, mapped},
		// Net of the other family beside Addr2.
		{ipset.HashIPPortIP, ipset.IPv4, ipset.Entry{Addr: b4, Proto: ktypes.UDP, Port: 53, Addr2: b4, Net: netip.MustParsePrefix("fd00::/64")}},
	}
	for _, tc := range invalid {
		if err := tc.typ.Check(tc.fam, tc.e); err == nil {
			t.Fatalf("test entry %s is valid", tc.e)
		}
		if err := tc.typ.Check(tc.fam, tc.e.Key().Entry()); err == nil {
			t.Errorf("%s %s: %s is refused, its key's entry %s is not", tc.typ, tc.fam, tc.e, tc.e.Key().Entry())
		}
	}

	// A Net that is no valid prefix is none, as Type.Check reads it: the
	// key equals that of the entry without it.
	bad := ipset.Entry{Addr: a4, Proto: ktypes.TCP, Port: 80, Net: netip.PrefixFrom(a4, 99)}
	if bad.Key() != (ipset.Entry{Addr: a4, Proto: ktypes.TCP, Port: 80}).Key() {
		t.Errorf("%s: an invalid Net is kept in the key", bad)
	}

	if n := unsafe.Sizeof(ipset.Key{}); n != 38 {
		t.Errorf("a key is %d bytes, want 38", n)
	}
	kt := reflect.TypeFor[ipset.Key]()
	for i := range kt.NumField() {
		if k := kt.Field(i).Type.Kind(); slices.Contains([]reflect.Kind{reflect.Pointer, reflect.String, reflect.Slice, reflect.Map, reflect.Interface}, k) {
			t.Errorf("field %s is a %s: the collector would scan maps of keys", kt.Field(i).Name, k)
		}
	}
}

// TestKeysCompare: Compare is a total order that agrees with ==.
func TestKeysCompare(t *testing.T) {
	ks := keys(
		ipset.Entry{Addr: netip.MustParseAddr("10.96.0.2"), Proto: ktypes.TCP, Port: 80},
		ipset.Entry{Addr: netip.MustParseAddr("10.96.0.1"), Proto: ktypes.TCP, Port: 80},
		ipset.Entry{Addr: netip.MustParseAddr("10.96.0.1"), Proto: ktypes.UDP, Port: 80},
		ipset.Entry{Addr: netip.MustParseAddr("10.96.0.1"), Proto: ktypes.TCP, Port: 81},
		ipset.Entry{Addr: netip.MustParseAddr("10.96.0.1")},
	)
	for _, a := range ks {
		for _, b := range ks {
			if (a.Compare(b) == 0) != (a == b) || a.Compare(b) != -b.Compare(a) {
				t.Errorf("Compare(%s, %s) = %d, reverse %d", a, b, a.Compare(b), b.Compare(a))
			}
		}
	}
	sorted := slices.SortedFunc(slices.Values(ks), ipset.Key.Compare)
	if !slices.IsSortedFunc(sorted, ipset.Key.Compare) || len(slices.Compact(sorted)) != len(ks) {
		t.Errorf("sorted: %v", sorted)
	}
}
