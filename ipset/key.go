package ipset

import (
	"bytes"
	"cmp"
	"net/netip"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Key is an Entry in the form that maps of many entries hold: 38 bytes
// without pointers, where an Entry takes 88 bytes and two pointers (the
// addresses' zones). A map of keys takes half the memory of a map of
// entries, and the garbage collector does not scan it. The Syncer's view
// of each set and the glue's counts of what each set should hold are keyed
// by it.
//
// A key holds every field of an entry that some set type accepts. Of an
// entry that none accepts it keeps the fault, not the value: a zone comes
// back as the zone "?", and Net beside Addr2 (no type holds both) comes
// back as a valid prefix of Addr2's address. Such a key's Entry is as
// invalid as the entry it was made from, so Type.Check still refuses it.
// (A Net that is not a valid prefix counts as none, in a key as in
// Type.Check.)
type Key struct {
	a, b  [16]byte // Addr; Addr2, or else Net's address
	port  uint16
	proto ktypes.Protocol
	bits  uint8
	flags keyFlags
}

type keyFlags uint8

const (
	keyA     keyFlags = 1 << iota // Addr is valid
	keyA4                         // Addr is IPv4
	keyB                          // b holds an address (Addr2 or Net's)
	keyB4                         // b's address is IPv4
	keyAddr2                      // Addr2 is valid (it is b)
	keyNet                        // Net is valid (b/bits, or Addr2's address/bits)
	keyZone                       // Addr or Addr2 had a zone
)

// Key returns e as a key.
func (e Entry) Key() Key {
	k := Key{port: e.Port, proto: e.Proto}
	if e.Addr.IsValid() {
		k.a = e.Addr.As16()
		k.flags |= keyA
		if e.Addr.Is4() {
			k.flags |= keyA4
		}
	}
	var b netip.Addr
	if e.Net.IsValid() {
		b = e.Net.Addr()
	}
	if e.Addr2.IsValid() {
		b = e.Addr2
		k.flags |= keyAddr2
	}
	if b.IsValid() {
		k.b = b.As16()
		k.flags |= keyB
		if b.Is4() {
			k.flags |= keyB4
		}
	}
	if e.Net.IsValid() {
		k.flags |= keyNet
		k.bits = uint8(e.Net.Bits())
	}
	if e.Addr.Zone() != "" || e.Addr2.Zone() != "" {
		k.flags |= keyZone
	}
	return k
}

// Entry returns the entry the key was made from.
func (k Key) Entry() Entry {
	e := Entry{Port: k.port, Proto: k.proto}
	if k.flags&keyA != 0 {
		e.Addr = keyAddr(k.a, k.flags&keyA4 != 0)
	}
	var b netip.Addr
	if k.flags&keyB != 0 {
		b = keyAddr(k.b, k.flags&keyB4 != 0)
	}
	if k.flags&keyAddr2 != 0 {
		e.Addr2 = b
	}
	if k.flags&keyNet != 0 {
		// Beside Addr2 the prefix is Addr2's address: with bits of
		// another family it would be invalid, and the entry would lose
		// its fault.
		e.Net = netip.PrefixFrom(b, min(int(k.bits), b.BitLen()))
	}
	if k.flags&keyZone != 0 {
		switch {
		case e.Addr.Is6():
			e.Addr = e.Addr.WithZone("?")
		case e.Addr2.Is6():
			e.Addr2 = e.Addr2.WithZone("?")
		}
	}
	return e
}

func keyAddr(b [16]byte, is4 bool) netip.Addr {
	a := netip.AddrFrom16(b)
	if is4 {
		return a.Unmap()
	}
	return a
}

// String renders the key's entry.
func (k Key) String() string { return k.Entry().String() }

// Compare orders keys: a total order, not Entry.Compare's.
func (k Key) Compare(o Key) int {
	if c := bytes.Compare(k.a[:], o.a[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(k.proto, o.proto); c != 0 {
		return c
	}
	if c := cmp.Compare(k.port, o.port); c != 0 {
		return c
	}
	if c := bytes.Compare(k.b[:], o.b[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(k.bits, o.bits); c != 0 {
		return c
	}
	return cmp.Compare(k.flags, o.flags)
}
