package ipset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// Kernel implements Interface over one nfnetlink socket in the network
// namespace that was current when NewKernel was called.
type Kernel struct {
	mu    sync.Mutex // serializes the library's requests
	h     *netlink.Handle
	batch *nlbatch.Socket  // entry writes
	names *nl.SocketHandle // dumps (List, ListNames); its sequence numbers go on across requests
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
	b, err := nlbatch.Open(unix.NETLINK_NETFILTER)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	names, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		h.Close()
		b.Close()
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	k := &Kernel{h: h, batch: b, names: &nl.SocketHandle{Socket: names}, owner: Owned}
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
	k.batch.Close()
	k.names.Socket.Close()
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

// List implements Interface: one dump of the set, read in place
// (setReader).
func (k *Kernel) List(name string) (Set, error) {
	r := setReader{want: name}
	err := k.dump(name, 0, r.message)
	if errors.Is(err, unix.ENOENT) {
		return Set{}, fmt.Errorf("ipset: list %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Set{}, fmt.Errorf("ipset: list %s: %w", name, err)
	}
	return r.set, nil
}

// ListNames implements Interface. It asks the kernel for the names alone
// (IPSET_FLAG_LIST_SETNAME, what `ipset list -n` sends), one message per
// set: the library's dump of all sets carries every entry, 2 s of reading
// and parsing at 50,000 entries under emulation.
func (k *Kernel) ListNames() ([]string, error) {
	var names []string
	err := k.dump("", ipsetFlagListSetName, func(msg []byte) error {
		if len(msg) < 4 {
			return errors.New("short ipset message")
		}
		return eachAttr(msg[4:], func(typ uint16, v []byte) error {
			if n := cString(v); typ == nl.IPSET_ATTR_SETNAME && n != "" {
				names = append(names, n)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("ipset: list sets: %w", err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// dump runs an IPSET_CMD_LIST dump (of one set, or of all when name is
// empty) with the command-level flags on the dump socket (in the
// namespace of NewKernel), handing each message to fn; fn's first error
// ends it. The kernel's ipset-specific error numbers become nl.IPSetError.
func (k *Kernel) dump(name string, flags uint32, fn func(msg []byte) error) error {
	req := nl.NewNetlinkRequest(nl.IPSET_CMD_LIST|(unix.NFNL_SUBSYS_IPSET<<8), unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	if name != "" {
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	}
	if flags != 0 {
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FLAGS|int(nl.NLA_F_NET_BYTEORDER), binary.BigEndian.AppendUint32(nil, flags)))
	}
	// One handle for every request: each gets a new sequence number, so
	// that what is left of a dump cut short (a receive error) is skipped
	// by the next request instead of taken for its answer.
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: k.names}
	var ferr error
	err := k.call(func() error {
		return req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
			ferr = fn(msg)
			return ferr == nil
		})
	})
	if errno := syscall.Errno(0); errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		err = nl.IPSetError(uintptr(errno))
	}
	if err == nil {
		err = ferr
	}
	return err
}

// ipsetFlagListSetName is the kernel's IPSET_FLAG_LIST_SETNAME (bit 1 of
// the command-level IPSET_ATTR_FLAGS): a dump of names, types and families.
const ipsetFlagListSetName = 1 << 1

// Add implements Interface: many entries per netlink message (as `ipset
// restore` sends them) and many messages per system call.
func (k *Kernel) Add(name string, entries ...Entry) error {
	return k.write("add", name, entries, nl.IPSET_CMD_ADD)
}

// Del implements Interface, like Add.
func (k *Kernel) Del(name string, entries ...Entry) error {
	return k.write("del", name, entries, nl.IPSET_CMD_DEL)
}

// msgEntryBytes bounds the entries of one message. The kernel echoes a
// whole message with the error of one of its entries.
const msgEntryBytes = 16 << 10

// write adds or deletes entries in bulk. A message holds many entries, each
// numbered (IPSET_ATTR_LINENO); the kernel applies them in order and stops
// at one it refuses, whose number its error carries. The entries after it
// are sent again, so that every entry the kernel accepts is written; the
// error names each refused entry. A message refused whole without a number
// (before it read one) is sent again one entry per message. Without
// NLM_F_EXCL, adding a present entry or deleting an absent one is no error.
func (k *Kernel) write(op, name string, entries []Entry, cmd int) error {
	if err := k.mustOwn(op, name); err != nil {
		return err
	}
	var errs []error
	todo, single := entries, false
	for len(todo) > 0 {
		msgs, bounds := entryMessages(name, cmd, todo, single)
		var again []Entry
		for j, r := range k.batch.Exchange(msgs) {
			if r.Err == nil {
				continue
			}
			part := todo[bounds[j]:bounds[j+1]]
			i, numbered := failedEntry(r.Echo, len(part))
			switch {
			case numbered:
				errs = append(errs, entryError(op, name, part[i], r.Err))
				again = append(again, part[i+1:]...)
			case len(part) == 1 || errors.Is(r.Err, unix.ENOENT): // no such set: all fail
				for _, e := range part {
					errs = append(errs, entryError(op, name, e, r.Err))
				}
			default:
				single = true
				again = append(again, part...)
			}
		}
		todo = again
	}
	return errors.Join(errs...)
}

// entryError is the error of one entry a write did not make: an
// EntryError when the kernel refused that entry on its own (a full set, an
// entry its type does not take), which callers charge to whoever wanted
// it; otherwise (no such set, EPERM, ENOMEM, a protocol error) the node's,
// naming the entry.
func entryError(op, name string, e Entry, err error) error {
	var errno syscall.Errno
	switch {
	case errors.Is(err, unix.ENOENT):
		err = ErrNotFound
	case errors.As(err, &errno) && int(errno) == ipsetErrHashFull && e.Addr.IsValid():
		// Each type numbers its own errors from the same base; only hash
		// sets' entries have an address (a bitmap:port's code there is
		// its range error).
		return &EntryError{Op: op, Set: name, Entry: e, Err: ErrSetFull}
	case errors.As(err, &errno) && refusesEntry(int(errno)):
		return &EntryError{Op: op, Set: name, Entry: e, Err: nl.IPSetError(uintptr(errno))}
	case errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE:
		err = nl.IPSetError(uintptr(errno))
	}
	return fmt.Errorf("ipset: %s %s %s: %w", op, name, e, err)
}

// ipsetErrHashFull is the hash types' IPSET_ERR_HASH_FULL, the first of
// their own error codes (the kernel's ip_set_hash.h).
const ipsetErrHashFull = nl.IPSET_ERR_TYPE_SPECIFIC

// refusesEntry reports whether an ipset error code is about the entry
// itself: the types' own codes (a full hash, a port out of a bitmap's
// range, a missing protocol) and an address or prefix the set does not
// take.
func refusesEntry(code int) bool {
	switch code {
	case nl.IPSET_ERR_IPADDR_IPV4, nl.IPSET_ERR_IPADDR_IPV6, nl.IPSET_ERR_INVALID_CIDR:
		return true
	}
	return code >= nl.IPSET_ERR_TYPE_SPECIFIC
}

// entryMessages packs entries into messages of cmd on set name (one each
// if single); message j holds entries[bounds[j]:bounds[j+1]], numbered
// from 1.
func entryMessages(name string, cmd int, entries []Entry, single bool) ([]nlbatch.Message, []int) {
	var msgs []nlbatch.Message
	bounds := []int{0}
	for start := 0; start < len(entries); {
		b := nlbatch.Attrs{unix.AF_INET, nl.NFNETLINK_V0, 0, 0} // nfgenmsg
		b = b.U8(nl.IPSET_ATTR_PROTOCOL, nl.IPSET_PROTOCOL)
		b = b.String(nl.IPSET_ATTR_SETNAME, name)
		b = b.U32(nl.IPSET_ATTR_LINENO, 0) // asks for the failing entry's number
		end := start
		b = b.Nest(nl.IPSET_ATTR_ADT, func(a nlbatch.Attrs) nlbatch.Attrs {
			for end < len(entries) && (end == start || (!single && len(a) < msgEntryBytes)) {
				n := uint32(end - start + 1)
				a = a.Nest(nl.IPSET_ATTR_DATA, func(d nlbatch.Attrs) nlbatch.Attrs {
					return entryAttrs(d, entries[end]).U32(nl.IPSET_ATTR_LINENO, n)
				})
				end++
			}
			return a
		})
		msgs = append(msgs, nlbatch.Message{Type: uint16(cmd | unix.NFNL_SUBSYS_IPSET<<8), Data: b})
		bounds = append(bounds, end)
		start = end
	}
	return msgs, bounds
}

// failedEntry finds, in the echo of a message that ipset refused, the
// number of the entry it refused, as an index among n.
func failedEntry(echo []byte, n int) (int, bool) {
	const skip = unix.NLMSG_HDRLEN + 4 // the message's header, nfgenmsg
	if len(echo) < skip {
		return 0, false
	}
	attrs, err := nl.ParseRouteAttr(echo[skip:])
	if err != nil {
		return 0, false
	}
	for _, a := range attrs {
		if a.Attr.Type&nl.NLA_TYPE_MASK == nl.IPSET_ATTR_LINENO && len(a.Value) == 4 {
			if line := int(binary.NativeEndian.Uint32(a.Value)); line >= 1 && line <= n {
				return line - 1, true
			}
		}
	}
	return 0, false
}

// entryAttrs appends the attributes of one entry: what each type reads
// (see Entry), addresses and ports in network order as the kernel wants.
func entryAttrs(a nlbatch.Attrs, e Entry) nlbatch.Attrs {
	ip := func(a nlbatch.Attrs, typ uint16, addr netip.Addr) nlbatch.Attrs {
		return a.Nest(typ, func(n nlbatch.Attrs) nlbatch.Attrs {
			if addr.Is4() {
				return n.Bytes(nl.IPSET_ATTR_IPADDR_IPV4|nl.NLA_F_NET_BYTEORDER, addr.AsSlice())
			}
			return n.Bytes(nl.IPSET_ATTR_IPADDR_IPV6|nl.NLA_F_NET_BYTEORDER, addr.AsSlice())
		})
	}
	if e.Addr.IsValid() {
		a = ip(a, nl.IPSET_ATTR_IP, e.Addr)
	}
	if e.Net.IsValid() {
		if e.Addr.IsValid() { // hash:ip,port,net: the net is the second element
			a = ip(a, nl.IPSET_ATTR_IP2, e.Net.Addr()).U8(nl.IPSET_ATTR_CIDR2, uint8(e.Net.Bits()))
		} else { // hash:net
			a = ip(a, nl.IPSET_ATTR_IP, e.Net.Addr()).U8(nl.IPSET_ATTR_CIDR, uint8(e.Net.Bits()))
		}
	}
	if e.Addr2.IsValid() {
		a = ip(a, nl.IPSET_ATTR_IP2, e.Addr2)
	}
	if e.Proto != 0 {
		a = a.U8(nl.IPSET_ATTR_PROTO, uint8(e.Proto))
	}
	if e.Proto != 0 || e.Port != 0 || (!e.Addr.IsValid() && !e.Net.IsValid()) {
		a = a.BE16(nl.IPSET_ATTR_PORT|nl.NLA_F_NET_BYTEORDER, e.Port)
	}
	return a
}
