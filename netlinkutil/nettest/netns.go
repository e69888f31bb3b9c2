// Package nettest builds small networks out of network namespaces and drives
// traffic through them. It runs INSIDE the test VM: the guest agent's
// subcommands (vmagent netns|serve|hit) wrap it for host-side tests, and Go
// test binaries that run inside the VM call it directly.
//
// A typical layout: one namespace per backend ("pod") and one per client,
// each joined to the root namespace by a veth pair, with the root side as
// the namespace's default gateway. The root namespace then routes between
// them (net.ipv4.ip_forward=1) and IPVS sees every connection.
//
// Inside the test VM, keep clear of 10.0.2.0/24: it is QEMU's user network
// on the VM's eth0 (10.0.2.2 is slirp's gateway, 10.0.2.100 the apiserver
// forward), so a namespace there is unreachable.
package nettest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// MaxNameLen is the longest namespace name AddNetns accepts: the root-side
// veth is named "vh-" + name and interface names have at most 15 bytes.
const MaxNameLen = 12

// netnsDir is where named namespaces are bind-mounted (as by `ip netns`).
const netnsDir = "/var/run/netns"

// NetnsConfig describes the addresses of a namespace made by AddNetns.
type NetnsConfig struct {
	// HostAddr is the root-side veth address with its prefix
	// (10.0.1.1/24); it is the namespace's IPv4 default gateway.
	HostAddr netip.Prefix
	// Addr is the namespace-side address (10.0.1.2/24).
	Addr netip.Prefix
	// Addr6 is an optional IPv6 namespace address (fd00:1::2/64), and
	// HostAddr6 the root side's; it defaults to the first address of
	// Addr6's prefix (fd00:1::1/64).
	HostAddr6 netip.Prefix
	Addr6     netip.Prefix
}

// HostVeth is the name of the root-side veth of namespace name.
func HostVeth(name string) string { return "vh-" + name }

// AddNetns creates the named network namespace name (visible to
// `ip netns` as /var/run/netns/NAME), a veth pair with HostVeth(name) in the
// current namespace and "eth0" inside, the addresses of c, and default
// routes via the root-side addresses. IPv6 addresses skip duplicate address
// detection so they work at once. On error, what was made is removed.
func AddNetns(name string, c NetnsConfig) (err error) {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("netns name %q: want 1 to %d bytes", name, MaxNameLen)
	}
	if !c.HostAddr.IsValid() || !c.Addr.IsValid() || !c.HostAddr.Addr().Is4() || !c.Addr.Addr().Is4() {
		return fmt.Errorf("netns %s: need IPv4 host and namespace addresses, got %v and %v", name, c.HostAddr, c.Addr)
	}
	if c.Addr6.IsValid() && !c.HostAddr6.IsValid() {
		c.HostAddr6 = netip.PrefixFrom(c.Addr6.Masked().Addr().Next(), c.Addr6.Bits())
		if c.HostAddr6.Addr() == c.Addr6.Addr() {
			return fmt.Errorf("netns %s: %v is the default root-side address; give another", name, c.Addr6)
		}
	}
	if c.HostAddr6.IsValid() != c.Addr6.IsValid() {
		return fmt.Errorf("netns %s: IPv6 root-side address %v without a namespace address", name, c.HostAddr6)
	}
	for _, p := range []netip.Prefix{c.HostAddr6, c.Addr6} {
		if p.IsValid() && !p.Addr().Is6() {
			return fmt.Errorf("netns %s: %v is not an IPv6 address", name, p)
		}
	}

	ns, err := newNamedNetns(name)
	if err != nil {
		return err
	}
	defer ns.Close()
	defer func() {
		if err != nil {
			_ = DelNetns(name)
		}
	}()

	hostName, peerName := HostVeth(name), "vp-"+name
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peerName}); err != nil {
		return fmt.Errorf("netns %s: add veth %s: %w", name, hostName, err)
	}
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	peer, err := netlink.LinkByName(peerName)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		return fmt.Errorf("netns %s: move %s into it: %w", name, peerName, err)
	}
	if err := addAddr(netlink.AddrAdd, host, c.HostAddr); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if c.HostAddr6.IsValid() {
		if err := addAddr(netlink.AddrAdd, host, c.HostAddr6); err != nil {
			return fmt.Errorf("netns %s: %w", name, err)
		}
	}
	// No duplicate address detection on either end: with it, the
	// link-local addresses stay tentative for a second or two after the
	// link comes up, and the first IPv6 connections through it time out.
	if err := setSysctl("", "net/ipv6/conf/"+hostName+"/accept_dad", "0"); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("netns %s: set %s up: %w", name, hostName, err)
	}

	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netns %s: netlink handle: %w", name, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("netns %s: set lo up: %w", name, err)
	}
	p, err := h.LinkByName(peerName)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := h.LinkSetName(p, "eth0"); err != nil {
		return fmt.Errorf("netns %s: rename %s to eth0: %w", name, peerName, err)
	}
	if err := addAddr(h.AddrAdd, p, c.Addr); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if c.Addr6.IsValid() {
		if err := addAddr(h.AddrAdd, p, c.Addr6); err != nil {
			return fmt.Errorf("netns %s: %w", name, err)
		}
	}
	if err := setSysctl(name, "net/ipv6/conf/eth0/accept_dad", "0"); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := h.LinkSetUp(p); err != nil {
		return fmt.Errorf("netns %s: set eth0 up: %w", name, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: net.IP(c.HostAddr.Addr().AsSlice())}); err != nil {
		return fmt.Errorf("netns %s: default route via %s: %w", name, c.HostAddr.Addr(), err)
	}
	if c.HostAddr6.IsValid() {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: p.Attrs().Index, Gw: net.IP(c.HostAddr6.Addr().AsSlice())}); err != nil {
			return fmt.Errorf("netns %s: IPv6 default route via %s: %w", name, c.HostAddr6.Addr(), err)
		}
	}
	return nil
}

// newNamedNetns creates the named namespace without leaving the calling
// thread in it.
func newNamedNetns(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("netns %s: current namespace: %w", name, err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name) // switches this thread into it
	if restoreErr := netns.Set(orig); restoreErr != nil {
		// The thread stays locked: it dies with this goroutine instead of
		// running other goroutines in the wrong namespace.
		if err == nil {
			ns.Close()
		}
		return 0, fmt.Errorf("netns %s: back to the original namespace: %w", name, restoreErr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		return 0, fmt.Errorf("netns %s: create: %w", name, err)
	}
	return ns, nil
}

func addAddr(add func(netlink.Link, *netlink.Addr) error, l netlink.Link, p netip.Prefix) error {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := add(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// setSysctl writes /proc/sys/<key> in the named namespace ("" for the
// current one).
func setSysctl(ns, key, value string) error {
	return Do(ns, func() error {
		if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", key, err)
		}
		return nil
	})
}

// DelNetns deletes the root-side veth of namespace name (which takes its
// peer along) and the namespace itself. Parts already gone are no error.
func DelNetns(name string) error {
	var errs []error
	if l, err := netlink.LinkByName(HostVeth(name)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: delete %s: %w", name, HostVeth(name), err))
		}
	}
	if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
		if err := netns.DeleteNamed(name); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: delete: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Do runs fn with the calling goroutine's thread in the named network
// namespace, then moves it back. name "" runs fn where it is. Sockets that
// fn opens stay in the namespace for their lifetime, so fn can open a
// listener or dial and hand the socket out; goroutines that fn starts do
// NOT run in the namespace.
func Do(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %s: current namespace: %w", name, err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %s: enter: %w", name, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// Keep the thread locked: it is in the wrong namespace and must die
		// with this goroutine rather than run others.
		return errors.Join(fnErr, fmt.Errorf("netns %s: leave: %w", name, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}
