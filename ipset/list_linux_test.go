package ipset

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// dumpMessage is one message of a set's dump as the kernel writes it:
// nfgenmsg, the set's name, type and family, its header, and entries.
func dumpMessage(name, typ string, family uint8, header func(nlbatch.Attrs) nlbatch.Attrs, entries ...func(nlbatch.Attrs) nlbatch.Attrs) []byte {
	a := nlbatch.Attrs{unix.AF_INET, 0, 0, 0}.
		U8(nl.IPSET_ATTR_PROTOCOL, nl.IPSET_PROTOCOL).
		String(nl.IPSET_ATTR_SETNAME, name).
		String(nl.IPSET_ATTR_TYPENAME, typ).
		U8(nl.IPSET_ATTR_REVISION, 1).
		U8(nl.IPSET_ATTR_FAMILY, family)
	if header != nil {
		a = a.Nest(nl.IPSET_ATTR_DATA, header)
	}
	return a.Nest(nl.IPSET_ATTR_ADT, func(a nlbatch.Attrs) nlbatch.Attrs {
		for _, e := range entries {
			a = a.Nest(nl.IPSET_ATTR_DATA, e)
		}
		return a
	})
}

var equateAddrs = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func ip4(typ uint16, s string) func(nlbatch.Attrs) nlbatch.Attrs {
	return func(a nlbatch.Attrs) nlbatch.Attrs {
		b := netip.MustParseAddr(s).As4()
		return a.Nest(typ, func(a nlbatch.Attrs) nlbatch.Attrs {
			return a.Bytes(nl.IPSET_ATTR_IPADDR_IPV4|unix.NLA_F_NET_BYTEORDER, b[:])
		})
	}
}

func TestSetReader(t *testing.T) {
	header := func(a nlbatch.Attrs) nlbatch.Attrs {
		return a.Bytes(nl.IPSET_ATTR_HASHSIZE|unix.NLA_F_NET_BYTEORDER, be32(1024)).
			Bytes(nl.IPSET_ATTR_MAXELEM|unix.NLA_F_NET_BYTEORDER, be32(131072)).
			Bytes(nl.IPSET_ATTR_REFERENCES|unix.NLA_F_NET_BYTEORDER, be32(2))
	}
	entry := func(addr string, port uint16, proto uint8, addr2 string) func(nlbatch.Attrs) nlbatch.Attrs {
		return func(a nlbatch.Attrs) nlbatch.Attrs {
			a = ip4(nl.IPSET_ATTR_IP, addr)(a).BE16(nl.IPSET_ATTR_PORT|unix.NLA_F_NET_BYTEORDER, port).U8(nl.IPSET_ATTR_PROTO, proto)
			return ip4(nl.IPSET_ATTR_IP2, addr2)(a)
		}
	}
	// A set of two messages, as a large dump comes.
	var r setReader
	for _, m := range [][]byte{
		dumpMessage("IPVSP-HAIRPIN", "hash:ip,port,ip", unix.AF_INET, header, entry("10.244.0.5", 8080, unix.IPPROTO_TCP, "10.244.0.5")),
		dumpMessage("IPVSP-HAIRPIN", "hash:ip,port,ip", unix.AF_INET, nil, entry("10.244.0.6", 53, unix.IPPROTO_UDP, "10.244.0.6")),
	} {
		if err := r.message(m); err != nil {
			t.Fatal(err)
		}
	}
	want := Set{
		Spec:       Spec{Name: "IPVSP-HAIRPIN", Type: HashIPPortIP, Family: IPv4, MaxElem: 131072},
		References: 2,
		Entries: []Entry{
			{Addr: a("10.244.0.5"), Port: 8080, Proto: ktypes.TCP, Addr2: a("10.244.0.5")},
			{Addr: a("10.244.0.6"), Port: 53, Proto: ktypes.UDP, Addr2: a("10.244.0.6")},
		},
	}
	if diff := cmp.Diff(want, r.set, equateAddrs); diff != "" {
		t.Errorf("set (-want +got):\n%s", diff)
	}

	// A bitmap:port set and a hash:net one.
	var b setReader
	err := b.message(dumpMessage("IPVSP-NODE-PORT-TCP", "bitmap:port", unix.AF_UNSPEC, func(a nlbatch.Attrs) nlbatch.Attrs {
		return a.BE16(nl.IPSET_ATTR_PORT_FROM|unix.NLA_F_NET_BYTEORDER, 0).BE16(nl.IPSET_ATTR_PORT_TO|unix.NLA_F_NET_BYTEORDER, 65535)
	}, func(a nlbatch.Attrs) nlbatch.Attrs { return a.BE16(nl.IPSET_ATTR_PORT|unix.NLA_F_NET_BYTEORDER, 30080) }))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Set{Spec: Spec{Name: "IPVSP-NODE-PORT-TCP", Type: BitmapPort, Family: None, PortTo: 65535}, Entries: []Entry{{Port: 30080}}}, b.set, equateAddrs); diff != "" {
		t.Errorf("bitmap:port (-want +got):\n%s", diff)
	}
	var n setReader
	err = n.message(dumpMessage("IPVSP-CLUSTER-CIDR", "hash:net", unix.AF_INET, header,
		func(a nlbatch.Attrs) nlbatch.Attrs {
			return ip4(nl.IPSET_ATTR_IP, "10.244.0.0")(a).U8(nl.IPSET_ATTR_CIDR, 16)
		}))
	if err != nil {
		t.Fatal(err)
	}
	if got := n.set.Entries; len(got) != 1 || got[0].Net != p("10.244.0.0/16") {
		t.Errorf("hash:net entries %v, want 10.244.0.0/16", got)
	}

	// Damaged messages are errors, never a panic.
	good := dumpMessage("IPVSP-HAIRPIN", "hash:ip,port,ip", unix.AF_INET, header, entry("10.244.0.5", 8080, unix.IPPROTO_TCP, "10.244.0.5"))
	for cut := 0; cut < len(good); cut++ {
		var r setReader
		_ = r.message(good[:cut])
	}
	other := setReader{want: "IPVSP-CLUSTER-IP"}
	if err := other.message(good); err == nil {
		t.Error("a message of another set than the one asked for was taken")
	}
	var m setReader
	err = m.message(dumpMessage("IPVSP-HAIRPIN", "hash:ip,port,ip", unix.AF_INET, header,
		func(a nlbatch.Attrs) nlbatch.Attrs { return ip4(nl.IPSET_ATTR_IP, "10.244.0.5")(a) })) // no port
	if err == nil || !strings.Contains(err.Error(), "IPVSP-HAIRPIN") {
		t.Errorf("an entry without its port: %v, want an error naming the set", err)
	}
}
