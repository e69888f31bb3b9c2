package ipset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Kernel implements Interface over one nfnetlink socket in the network
// namespace that was current when NewKernel was called.
type Kernel struct {
	mu    sync.Mutex // serializes requests on the sockets
	h     *netlink.Handle
	raw   *nl.SocketHandle // for the requests the library gets wrong
	owner Owner
}

var _ Interface = (*Kernel)(nil)

// Option configures NewKernel.
type Option func(*Kernel)

// WithOwner replaces the ownership rule (default: Owned).
func WithOwner(o Owner) Option { return func(k *Kernel) { k.owner = o } }

// NewKernel opens a netfilter netlink socket and checks that the kernel
// speaks the ipset protocol.
func NewKernel(opts ...Option) (*Kernel, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	k := &Kernel{h: h, raw: &nl.SocketHandle{Socket: s}, owner: Owned}
	for _, o := range opts {
		o(k)
	}
	if err := k.call(func() error { _, _, err := k.h.IpsetProtocol(); return err }); err != nil {
		k.Close()
		return nil, fmt.Errorf("ipset: the kernel does not answer the ipset protocol (is the ip_set module loaded?): %w", err)
	}
	return k, nil
}

// Close closes the sockets.
func (k *Kernel) Close() {
	k.h.Close()
	k.raw.Socket.Close()
}

// Owns implements Interface.
func (k *Kernel) Owns(name string) bool { return k.owner(name) }

// call runs one library call under the lock. The library type-asserts the
// kernel's errors and panics on anything else; such a panic becomes an error.
func (k *Kernel) call(fn func() error) (err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("netlink library failure: %v", r)
		}
	}()
	return fn()
}

func (k *Kernel) mustOwn(op, name string) error {
	if !k.owner(name) {
		return fmt.Errorf("ipset: %s %s: %w", op, name, ErrNotOwned)
	}
	return nil
}

// isIPSetErr reports whether err is the kernel's ipset-specific error code.
func isIPSetErr(err error, code int) bool {
	var ie nl.IPSetError
	return errors.As(err, &ie) && int(ie) == code
}

// Create implements Interface.
func (k *Kernel) Create(s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := k.mustOwn("create", s.Name); err != nil {
		return err
	}
	s = s.Normalized()
	opts := netlink.IpsetCreateOptions{
		// Without NLM_F_EXCL: an identical set is no error.
		Replace:     true,
		Family:      uint8(s.Family),
		MaxElements: s.MaxElem,
		PortFrom:    s.PortFrom,
		PortTo:      s.PortTo,
	}
	err := k.call(func() error { return k.h.IpsetCreate(s.Name, string(s.Type), opts) })
	if isIPSetErr(err, nl.IPSET_ERR_EXIST_SETNAME2) || errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ipset: create %s (%s %s): %w", s.Name, s.Type, s.Family, ErrMismatch)
	}
	if err != nil {
		return fmt.Errorf("ipset: create %s (%s %s): %w", s.Name, s.Type, s.Family, err)
	}
	return nil
}

// Destroy implements Interface.
func (k *Kernel) Destroy(name string) error {
	if err := k.mustOwn("destroy", name); err != nil {
		return err
	}
	err := k.call(func() error { return k.h.IpsetDestroy(name) })
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case isIPSetErr(err, nl.IPSET_ERR_BUSY) || errors.Is(err, unix.EBUSY):
		return fmt.Errorf("ipset: destroy %s: %w", name, ErrInUse)
	}
	return fmt.Errorf("ipset: destroy %s: %w", name, err)
}

// Swap implements Interface.
func (k *Kernel) Swap(a, b string) error {
	if err := errors.Join(k.mustOwn("swap", a), k.mustOwn("swap", b)); err != nil {
		return err
	}
	if err := k.call(func() error { return k.h.IpsetSwap(a, b) }); err != nil {
		return fmt.Errorf("ipset: swap %s %s: %w", a, b, err)
	}
	return nil
}

// Flush implements Interface.
func (k *Kernel) Flush(name string) error {
	if err := k.mustOwn("flush", name); err != nil {
		return err
	}
	if err := k.call(func() error { return k.h.IpsetFlush(name) }); err != nil {
		return fmt.Errorf("ipset: flush %s: %w", name, err)
	}
	return nil
}

// List implements Interface.
func (k *Kernel) List(name string) (Set, error) {
	var res *netlink.IPSetResult
	err := k.call(func() error {
		var err error
		res, err = k.h.IpsetList(name)
		return err
	})
	if errors.Is(err, unix.ENOENT) {
		return Set{}, fmt.Errorf("ipset: list %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Set{}, fmt.Errorf("ipset: list %s: %w", name, err)
	}
	return fromResult(res)
}

// ListNames implements Interface. The library's dump of all sets carries
// their entries too; a large set spans several messages, hence the dedup.
func (k *Kernel) ListNames() ([]string, error) {
	var res []netlink.IPSetResult
	err := k.call(func() error {
		var err error
		res, err = k.h.IpsetListAll()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ipset: list sets: %w", err)
	}
	var names []string
	for _, r := range res {
		if r.SetName != "" && !slices.Contains(names, r.SetName) {
			names = append(names, r.SetName)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Add implements Interface: one netlink message per entry on the one socket.
func (k *Kernel) Add(name string, entries ...Entry) error {
	return k.write("add", name, entries, nl.IPSET_CMD_ADD, k.h.IpsetAdd)
}

// Del implements Interface.
func (k *Kernel) Del(name string, entries ...Entry) error {
	return k.write("del", name, entries, nl.IPSET_CMD_DEL, k.h.IpsetDel)
}

func (k *Kernel) write(op, name string, entries []Entry, cmd int, fn func(string, *netlink.IPSetEntry) error) error {
	if err := k.mustOwn(op, name); err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	return k.call(func() error {
		for _, e := range entries {
			var err error
			if !e.Addr.IsValid() && !e.Net.IsValid() {
				err = k.portEntry(cmd, name, e.Port)
			} else {
				ne := toNetlink(e)
				// Replace (no NLM_F_EXCL): adding a present entry or deleting
				// an absent one is no error.
				ne.Replace = true
				err = fn(name, ne)
			}
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					err = ErrNotFound
				}
				return fmt.Errorf("ipset: %s %s %s: %w", op, name, e, err)
			}
		}
		return nil
	})
}

// portEntry adds or deletes a bitmap:port entry. The library always sends a
// protocol with a port, which bitmap:port rejects ("invalid protocol"), so
// this request is built here. Without NLM_F_EXCL, adding a present entry or
// deleting an absent one is no error. Callers hold k.mu.
func (k *Kernel) portEntry(cmd int, name string, port uint16) error {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(cmd))
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: k.raw}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	buf := make([]byte, 2)
	binary.BigEndian.PutUint16(buf, port)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), buf))
	data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_LINENO | nl.NLA_F_NET_BYTEORDER, Value: 0})
	req.AddData(data)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	var errno syscall.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		err = nl.IPSetError(uintptr(errno))
	}
	return err
}

func ipOf(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

func toNetlink(e Entry) *netlink.IPSetEntry {
	ne := &netlink.IPSetEntry{}
	if e.Addr.IsValid() {
		ne.IP = ipOf(e.Addr)
	}
	if e.Proto != 0 {
		p := uint8(e.Proto)
		ne.Protocol = &p
	}
	if e.Proto != 0 || e.Port != 0 || (!e.Addr.IsValid() && !e.Net.IsValid()) {
		port := e.Port
		ne.Port = &port
	}
	if e.Addr2.IsValid() {
		ne.IP2 = ipOf(e.Addr2)
	}
	if e.Net.IsValid() {
		if e.Addr.IsValid() { // hash:ip,port,net: the net is the second element
			ne.IP2, ne.CIDR2 = ipOf(e.Net.Addr()), uint8(e.Net.Bits())
		} else { // hash:net
			ne.IP, ne.CIDR = ipOf(e.Net.Addr()), uint8(e.Net.Bits())
		}
	}
	return ne
}

func addrOf(ip net.IP) (netip.Addr, bool) {
	if ip4 := ip.To4(); ip4 != nil && len(ip) == net.IPv4len {
		ip = ip4
	}
	return netip.AddrFromSlice(ip)
}

func fromResult(r *netlink.IPSetResult) (Set, error) {
	s := Set{
		Spec: Spec{Name: r.SetName, Type: Type(r.TypeName), Family: Family(r.Family), MaxElem: r.MaxElements,
			PortFrom: r.PortFrom, PortTo: r.PortTo},
		References: r.References,
	}
	if s.Type == BitmapPort {
		s.Family = None
	}
	for _, ne := range r.Entries {
		e, err := fromNetlink(s.Type, ne)
		if err != nil {
			return s, fmt.Errorf("ipset: set %s: %w", s.Name, err)
		}
		s.Entries = append(s.Entries, e)
	}
	return s, nil
}

func fromNetlink(t Type, ne netlink.IPSetEntry) (Entry, error) {
	var e Entry
	bad := func() (Entry, error) { return Entry{}, fmt.Errorf("cannot read a %s entry %+v", t, ne) }
	addr := func(ip net.IP) (netip.Addr, bool) {
		if ip == nil {
			return netip.Addr{}, false
		}
		return addrOf(ip)
	}
	var ok bool
	switch t {
	case HashNet:
		a, ok := addr(ne.IP)
		if !ok {
			return bad()
		}
		e.Net = netip.PrefixFrom(a, int(ne.CIDR))
		return e, nil
	case BitmapPort:
		if ne.Port == nil {
			return bad()
		}
		e.Port = *ne.Port
		return e, nil
	}
	if e.Addr, ok = addr(ne.IP); !ok {
		return bad()
	}
	if t == HashIP {
		return e, nil
	}
	if ne.Port == nil || ne.Protocol == nil {
		return bad()
	}
	e.Port, e.Proto = *ne.Port, model.Protocol(*ne.Protocol)
	switch t {
	case HashIPPortIP:
		if e.Addr2, ok = addr(ne.IP2); !ok {
			return bad()
		}
	case HashIPPortNet:
		a, ok := addr(ne.IP2)
		if !ok {
			return bad()
		}
		e.Net = netip.PrefixFrom(a, int(ne.CIDR2))
	}
	return e, nil
}
