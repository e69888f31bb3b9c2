// Package ipset manages the kernel's IP sets over netlink (the ip_set
// subsystem of nfnetlink, through vishvananda/netlink's Ipset calls; the
// `ipset` binary is never run). The iptables glue keeps every per-Service
// datum in sets, so that its rules stay constant in number.
//
// Interface is the kernel: one call per operation, writes of many entries in
// one call (in bulk: many entries per netlink message). Kernel implements it; package ipset/fake holds an in-memory fake
// that records calls and injects errors. Syncer keeps sets equal to desired
// contents by difference, with a view of what the kernel holds, or by
// building a new set and swapping it in.
//
// Ownership: ipvs-proxy touches only sets whose name starts with Prefix.
// Both implementations refuse to write any other set unless told otherwise
// (WithOwner, for `ipvs-proxy cleanup --kube-proxy`).
package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Prefix starts the name of every set ipvs-proxy owns.
const Prefix = "IPVSP-"

// MaxNameLen is the longest set name the kernel accepts (IPSET_MAXNAMELEN
// without the terminating NUL).
const MaxNameLen = 31

// DefaultMaxElem is the capacity of hash sets created without one. Hash sets
// allocate as they grow; this only bounds them (the kernel's default,
// 65536, is too small for large clusters' hairpin entries).
const DefaultMaxElem = 1 << 20

// Type is an ipset type.
type Type string

// The set types ipvs-proxy uses.
const (
	HashIP        Type = "hash:ip"
	HashIPPort    Type = "hash:ip,port"
	HashIPPortIP  Type = "hash:ip,port,ip"
	HashIPPortNet Type = "hash:ip,port,net"
	HashNet       Type = "hash:net"
	BitmapPort    Type = "bitmap:port"
)

// Family is a set's address family: IPv4 or IPv6 for hash sets, None for
// bitmap:port (which matches both).
type Family uint8

// Families.
const (
	None Family = 0
	IPv4 Family = unix.AF_INET
	IPv6 Family = unix.AF_INET6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "inet"
	case IPv6:
		return "inet6"
	}
	return "none"
}

// Of returns the family of an address.
func Of(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// Spec describes a set.
type Spec struct {
	Name   string
	Type   Type
	Family Family
	// MaxElem bounds hash sets; 0 means DefaultMaxElem.
	MaxElem uint32
	// PortFrom and PortTo are the range of a bitmap:port set.
	PortFrom, PortTo uint16
}

// Normalized fills defaults, so that specs compare equal to what the kernel
// reports.
func (s Spec) Normalized() Spec {
	if s.Type == BitmapPort {
		s.Family, s.MaxElem = None, 0
	} else {
		s.PortFrom, s.PortTo = 0, 0
		if s.MaxElem == 0 {
			s.MaxElem = DefaultMaxElem
		}
	}
	return s
}

// Validate checks the name and the type's parameters.
func (s Spec) Validate() error {
	if s.Name == "" || len(s.Name) > MaxNameLen || strings.ContainsAny(s.Name, " \t\n") {
		return fmt.Errorf("ipset: %q is not a valid set name (1 to %d characters, no spaces)", s.Name, MaxNameLen)
	}
	switch s.Type {
	case HashIP, HashIPPort, HashIPPortIP, HashIPPortNet, HashNet:
		if s.Family != IPv4 && s.Family != IPv6 {
			return fmt.Errorf("ipset: set %s: type %s needs family inet or inet6", s.Name, s.Type)
		}
	case BitmapPort:
		if s.PortFrom > s.PortTo {
			return fmt.Errorf("ipset: set %s: port range %d-%d is empty", s.Name, s.PortFrom, s.PortTo)
		}
	default:
		return fmt.Errorf("ipset: set %s: unsupported type %q", s.Name, s.Type)
	}
	return nil
}

// Entry is one member of a set; which fields count depends on the type:
//
//	hash:ip           Addr
//	hash:ip,port      Addr, Proto, Port
//	hash:ip,port,ip   Addr, Proto, Port, Addr2
//	hash:ip,port,net  Addr, Proto, Port, Net
//	hash:net          Net
//	bitmap:port       Port
//
// Entries are comparable, so that they can key maps.
type Entry struct {
	Addr  netip.Addr
	Proto ktypes.Protocol
	Port  uint16
	Addr2 netip.Addr
	Net   netip.Prefix
}

// String renders the entry as the ipset tool does ("10.96.0.1,tcp:80").
func (e Entry) String() string {
	var parts []string
	if e.Addr.IsValid() {
		parts = append(parts, e.Addr.String())
	}
	if e.Proto != 0 {
		parts = append(parts, strings.ToLower(e.Proto.String())+":"+fmt.Sprint(e.Port))
	} else if e.Port != 0 || (!e.Addr.IsValid() && !e.Net.IsValid()) {
		parts = append(parts, fmt.Sprint(e.Port))
	}
	if e.Addr2.IsValid() {
		parts = append(parts, e.Addr2.String())
	}
	if e.Net.IsValid() {
		parts = append(parts, e.Net.String())
	}
	return strings.Join(parts, ",")
}

// Compare orders entries by address, protocol, port, second address, net.
func (e Entry) Compare(o Entry) int {
	if c := e.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if e.Proto != o.Proto {
		if e.Proto < o.Proto {
			return -1
		}
		return 1
	}
	if e.Port != o.Port {
		if e.Port < o.Port {
			return -1
		}
		return 1
	}
	if c := e.Addr2.Compare(o.Addr2); c != 0 {
		return c
	}
	if c := e.Net.Addr().Compare(o.Net.Addr()); c != 0 {
		return c
	}
	return e.Net.Bits() - o.Net.Bits()
}

// Check reports whether e is a valid entry of a set of type t and family f.
func (t Type) Check(f Family, e Entry) error {
	addrOK := func(a netip.Addr) bool { return a.IsValid() && a.Zone() == "" && Of(a) == f && !a.Is4In6() }
	protoOK := e.Proto == ktypes.TCP || e.Proto == ktypes.UDP || e.Proto == ktypes.SCTP
	netOK := e.Net.IsValid() && Of(e.Net.Addr()) == f && e.Net.Bits() > 0 && e.Net == e.Net.Masked()
	var ok bool
	switch t {
	case HashIP:
		ok = addrOK(e.Addr) && e.Proto == 0 && e.Port == 0 && !e.Addr2.IsValid() && !e.Net.IsValid()
	case HashIPPort:
		ok = addrOK(e.Addr) && protoOK && !e.Addr2.IsValid() && !e.Net.IsValid()
	case HashIPPortIP:
		ok = addrOK(e.Addr) && protoOK && addrOK(e.Addr2) && !e.Net.IsValid()
	case HashIPPortNet:
		ok = addrOK(e.Addr) && protoOK && !e.Addr2.IsValid() && netOK
	case HashNet:
		ok = !e.Addr.IsValid() && e.Proto == 0 && e.Port == 0 && !e.Addr2.IsValid() && netOK
	case BitmapPort:
		ok = !e.Addr.IsValid() && e.Proto == 0 && !e.Addr2.IsValid() && !e.Net.IsValid()
	default:
		return fmt.Errorf("unsupported type %q", t)
	}
	if !ok {
		return fmt.Errorf("%q is not a valid %s entry of family %s", e, t, f)
	}
	return nil
}

// Set is a set as the kernel holds it.
type Set struct {
	Spec
	// Entries in kernel order.
	Entries []Entry
	// References counts the iptables rules that use the set.
	References uint32
}

// Errors.
var (
	// ErrNotFound: no set of that name.
	ErrNotFound = errors.New("no such set")
	// ErrNotOwned: a write to a set that ipvs-proxy does not own.
	ErrNotOwned = errors.New("set not owned by ipvs-proxy")
	// ErrMismatch: a set of that name exists with another type or
	// parameters.
	ErrMismatch = errors.New("set exists with other parameters")
	// ErrInUse: the set is referenced by iptables rules and cannot be
	// destroyed.
	ErrInUse = errors.New("set is in use by iptables rules")
	// ErrSetFull: a hash set holds maxelem entries and refused another.
	ErrSetFull = errors.New("set is full")
)

// EntryError is one entry that a write refused; the call's other entries
// were written (as the kernel does). Callers charge it to whoever wanted
// the entry.
type EntryError struct {
	Op, Set string
	Entry   Entry
	Err     error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("ipset: %s %s %s: %v", e.Op, e.Set, e.Entry, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// RefusedEntries returns err's EntryErrors (err may join many), and
// whether err is nothing but such errors: a write that failed for some
// entries only, with the set and the call sound.
func RefusedEntries(err error) (refused []*EntryError, only bool) {
	if err == nil {
		return nil, false
	}
	only = true
	var walk func(error)
	walk = func(e error) {
		// A joined error part by part (errors.As would stop at its first
		// EntryError), a wrapper through what it wraps.
		if joined, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range joined.Unwrap() {
				walk(inner)
			}
			return
		}
		switch x := e.(type) { //nolint:errorlint // wrappers are unwrapped one by one
		case *EntryError:
			refused = append(refused, x)
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		default:
			only = false
		}
	}
	walk(err)
	return refused, only && len(refused) > 0
}

// Interface is the kernel's IP sets.
type Interface interface {
	// Create creates a set. A set of that name with the same spec is no
	// error; one with another spec is ErrMismatch.
	Create(s Spec) error
	// Destroy destroys a set; a missing set is no error, a referenced one
	// ErrInUse.
	Destroy(name string) error
	// Swap exchanges the contents of two sets of the same type and family.
	Swap(a, b string) error
	// Flush empties a set.
	Flush(name string) error
	// List dumps one set with its entries (ErrNotFound if missing).
	List(name string) (Set, error)
	// ListNames lists the names of every set in the network namespace,
	// owned or not.
	ListNames() ([]string, error)
	// Add adds entries; present ones are no error. An entry refused
	// does not stop the others: the error names each refused one.
	Add(name string, entries ...Entry) error
	// Del deletes entries, like Add; absent ones are no error.
	Del(name string, entries ...Entry) error
	// Owns reports whether the implementation may write the named set.
	Owns(name string) bool
}

// Owner decides which sets an implementation may write.
type Owner func(name string) bool

// Owned is the default Owner: sets whose name starts with Prefix.
func Owned(name string) bool { return strings.HasPrefix(name, Prefix) }
