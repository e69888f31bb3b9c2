package netlinkutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernelLinks implements Links with vishvananda/netlink in the network
// namespace that was current when NewLinks was called. It is not safe for
// concurrent use.
type kernelLinks struct {
	h *netlink.Handle
	// cache holds links by name for address writes, so that binding
	// 10,000 VIPs costs 10,000 requests, not 20,000. An entry is dropped
	// when a write through it fails (the link may have been re-created).
	cache map[string]netlink.Link
}

// NewLinks opens a route netlink socket in the current network namespace.
func NewLinks() (Links, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open route netlink socket: %w", err)
	}
	return &kernelLinks{h: h, cache: map[string]netlink.Link{}}, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func (l *kernelLinks) EnsureDummy(name string) error {
	link, err := l.h.LinkByName(name)
	switch {
	case isNotFound(err):
		delete(l.cache, name)
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("create dummy interface %s (is the dummy module available?): %w", name, err)
		}
		if link, err = l.h.LinkByName(name); err != nil {
			return fmt.Errorf("look up new interface %s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("look up interface %s: %w", name, err)
	case link.Type() != "dummy":
		return fmt.Errorf("interface %s exists but is of type %q, not dummy", name, link.Type())
	}
	// Marked when made, or when found without the mark (made before links
	// carried it, or by hand): run uses it, so cleanup may remove it.
	if link.Attrs().Alias != OwnerAlias {
		if err := l.h.LinkSetAlias(link, OwnerAlias); err != nil {
			return fmt.Errorf("mark interface %s as ipvs-proxy's (alias %s): %w", name, OwnerAlias, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := l.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set interface %s up: %w", name, err)
		}
	}
	return nil
}

func (l *kernelLinks) DeleteLink(name string) error {
	link, err := l.h.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up interface %s: %w", name, err)
	}
	delete(l.cache, name)
	if err := l.h.LinkDel(link); err != nil {
		return fmt.Errorf("delete interface %s: %w", name, err)
	}
	return nil
}

func (l *kernelLinks) LinkInfo(name string) (LinkInfo, bool, error) {
	link, err := l.h.LinkByName(name)
	if isNotFound(err) {
		return LinkInfo{}, false, nil
	}
	if err != nil {
		return LinkInfo{}, false, fmt.Errorf("look up interface %s: %w", name, err)
	}
	return LinkInfo{Type: link.Type(), Alias: link.Attrs().Alias}, true, nil
}

func (l *kernelLinks) ListAddresses(name string) ([]netip.Addr, error) {
	link, err := l.h.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up interface %s: %w", name, err)
	}
	addrs, err := l.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
}

// link returns a link by name, from the cache when it is there.
func (l *kernelLinks) link(name string) (netlink.Link, error) {
	if link, ok := l.cache[name]; ok {
		return link, nil
	}
	link, err := l.h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	l.cache[name] = link
	return link, nil
}

func (l *kernelLinks) AddAddress(name string, a netip.Addr) error {
	link, err := l.link(name)
	if err != nil {
		return fmt.Errorf("look up interface %s: %w", name, err)
	}
	addr := hostAddr(a)
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD // a VIP must be usable at once
	}
	if err := l.h.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		delete(l.cache, name)
		return fmt.Errorf("bind %s to %s: %w", a, name, err)
	}
	return nil
}

func (l *kernelLinks) DeleteAddress(name string, a netip.Addr) error {
	link, err := l.link(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up interface %s: %w", name, err)
	}
	err = l.h.AddrDel(link, hostAddr(a))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		delete(l.cache, name)
		return fmt.Errorf("unbind %s from %s: %w", a, name, err)
	}
	return nil
}

func (l *kernelLinks) NodeAddresses(exclude ...string) ([]netip.Addr, error) {
	// The addresses are read before the links, and an address counts only
	// if its link is in the later list: a link removed or re-created
	// (with a new index) in between, as the proxy's own interface is when
	// the reconciler repairs it while the glue reads, never passes its
	// addresses off as the node's.
	addrs, err := l.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	links, err := l.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	node := map[int]bool{}
	for _, link := range links {
		a := link.Attrs()
		node[a.Index] = a.Flags&net.FlagLoopback == 0 && !slices.Contains(exclude, a.Name)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if !node[a.LinkIndex] {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
			continue
		}
		out = append(out, ip)
	}
	return out, nil
}

// localRoute is the netlink route of r through link.
func localRoute(link netlink.Link, r LocalRoute) *netlink.Route {
	p := r.Prefix.Masked()
	nr := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Table:     unix.RT_TABLE_LOCAL,
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
		Protocol:  RouteProtocol,
	}
	if r.Src.IsValid() {
		nr.Src = net.IP(r.Src.AsSlice())
	}
	return nr
}

func (l *kernelLinks) ListLocalRoutes(name string) ([]LocalRoute, error) {
	link, err := l.h.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up interface %s: %w", name, err)
	}
	filter := &netlink.Route{LinkIndex: link.Attrs().Index, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL,
		Protocol: RouteProtocol}
	var out []LocalRoute
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := l.h.RouteListFiltered(fam, filter,
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return nil, fmt.Errorf("list local routes of %s: %w", name, err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			if !ok {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			lr := LocalRoute{Prefix: netip.PrefixFrom(a.Unmap(), ones)}
			if src, ok := netip.AddrFromSlice(r.Src); ok {
				lr.Src = src.Unmap()
			}
			out = append(out, lr)
		}
	}
	return out, nil
}

func (l *kernelLinks) AddLocalRoute(name string, r LocalRoute) error {
	link, err := l.link(name)
	if err != nil {
		return fmt.Errorf("look up interface %s: %w", name, err)
	}
	if err := l.h.RouteReplace(localRoute(link, r)); err != nil {
		delete(l.cache, name)
		return fmt.Errorf("route %s as local through %s: %w", r, name, err)
	}
	return nil
}

func (l *kernelLinks) DeleteLocalRoute(name string, r LocalRoute) error {
	link, err := l.link(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up interface %s: %w", name, err)
	}
	nr := localRoute(link, LocalRoute{Prefix: r.Prefix}) // any source
	err = l.h.RouteDel(nr)
	if err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		delete(l.cache, name)
		return fmt.Errorf("delete local route %s through %s: %w", r.Prefix, name, err)
	}
	return nil
}
