package netlinkutil

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	_ RemovalWatcher     = (*kernelLinks)(nil)
	_ NodeAddressWatcher = (*kernelLinks)(nil)
)

// WatchRemovals implements RemovalWatcher with two route netlink
// subscriptions (links, with the existing ones listed first, and
// addresses) in the current network namespace. An address counts when it
// leaves the link's current index; once the link is gone its addresses'
// removals are left to the link's.
func (l *kernelLinks) WatchRemovals(ctx context.Context, link string, fn func(Removal), onErr func(error)) error {
	done := make(chan struct{})
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 1024)
	report := func(err error) {
		if ctx.Err() == nil { // (closing the subscriptions fails their reads)
			onErr(fmt.Errorf("kernel notifications: %w", err))
		}
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ListExisting: true, ErrorCallback: report}); err != nil {
		close(done)
		return fmt.Errorf("subscribe to link notifications: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: report,
		ReceiveBufferSize: 1 << 20}); err != nil {
		close(done)
		return fmt.Errorf("subscribe to address notifications: %w", err)
	}
	go func() {
		defer close(done)
		index := 0 // the link's, once known; 0 while it does not exist
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-links:
				if !ok {
					report(errors.New("link subscription closed"))
					return
				}
				if u.Attrs() == nil || u.Attrs().Name != link {
					continue
				}
				if u.Header.Type == unix.RTM_DELLINK {
					index = 0
					fn(Removal{Link: link})
					continue
				}
				index = u.Attrs().Index
			case u, ok := <-addrs:
				if !ok {
					report(errors.New("address subscription closed"))
					return
				}
				if u.NewAddr || index == 0 || u.LinkIndex != index {
					continue
				}
				if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok {
					fn(Removal{Link: link, Addr: a.Unmap()})
				}
			}
		}
	}()
	return nil
}

// WatchNodeAddresses implements NodeAddressWatcher with a route netlink
// address subscription in the current network namespace. Whether a link is
// excluded is looked up once per link index (so that binding 10,000 VIPs to
// the proxy's interface costs no lookups beyond the first).
func (l *kernelLinks) WatchNodeAddresses(ctx context.Context, changed func(), onErr func(error), exclude ...string) error {
	done := make(chan struct{})
	addrs := make(chan netlink.AddrUpdate, 1024)
	report := func(err error) {
		if ctx.Err() == nil {
			onErr(fmt.Errorf("kernel notifications of node addresses: %w", err))
		}
	}
	// Links are looked up in the namespace of the subscription (the
	// caller's), whatever thread the goroutine runs on.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open route netlink socket: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: report,
		ReceiveBufferSize: 1 << 20}); err != nil {
		close(done)
		h.Close()
		return fmt.Errorf("subscribe to address notifications: %w", err)
	}
	go func() {
		defer close(done)
		defer h.Close()
		skip := map[int]bool{} // link index -> excluded
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-addrs:
				if !ok {
					report(errors.New("address subscription closed"))
					return
				}
				if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok && (a.IsLinkLocalUnicast() || a.IsLoopback()) {
					continue // never a node address (a pod's veth brings one)
				}
				excluded, known := skip[u.LinkIndex]
				if !known {
					// A link gone already had its removal reported by
					// its addresses' own notifications, or has none.
					link, err := h.LinkByIndex(u.LinkIndex)
					excluded = err == nil && slices.Contains(exclude, link.Attrs().Name)
					if err == nil {
						skip[u.LinkIndex] = excluded
					}
				}
				if !excluded {
					changed()
				}
			}
		}
	}()
	return nil
}
