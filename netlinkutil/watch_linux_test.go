package netlinkutil

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// TestWatchRemovals: in a fresh namespace, the kernel's notifications of
// the watched link's removed addresses (both families) and of its own
// removal reach the callback; another link's removals and added addresses
// do not.
func TestWatchRemovals(t *testing.T) {
	nltest.InFreshNetns(t)
	for _, name := range []string{"vips0", "other0"} {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "-peer"}); err != nil {
			t.Fatalf("add veth %s: %v", name, err)
		}
	}
	l := newLinks(t)
	for _, a := range addrs("10.96.0.10", "10.96.0.11", "fd00:10:96::a") {
		if err := l.AddAddress("vips0", a); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.AddAddress("other0", netip.MustParseAddr("10.96.0.20")); err != nil {
		t.Fatal(err)
	}
	got := make(chan Removal, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := l.(RemovalWatcher).WatchRemovals(ctx, "vips0", func(r Removal) { got <- r }, func(err error) { t.Errorf("watch: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	next := func() (Removal, bool) {
		select {
		case r := <-got:
			return r, true
		case <-time.After(3 * time.Second):
			return Removal{}, false
		}
	}
	// The link's index is learned from the first (listed) notification:
	// give it a moment before the first removal.
	time.Sleep(100 * time.Millisecond)
	for _, step := range []struct {
		do   func() error
		want Removal
	}{
		{func() error { return l.DeleteAddress("other0", netip.MustParseAddr("10.96.0.20")) }, Removal{}},
		{func() error { return l.AddAddress("vips0", netip.MustParseAddr("10.96.0.12")) }, Removal{}},
		{func() error { return l.DeleteAddress("vips0", netip.MustParseAddr("10.96.0.10")) },
			Removal{Link: "vips0", Addr: netip.MustParseAddr("10.96.0.10")}},
		{func() error { return l.DeleteAddress("vips0", netip.MustParseAddr("fd00:10:96::a")) },
			Removal{Link: "vips0", Addr: netip.MustParseAddr("fd00:10:96::a")}},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		if step.want == (Removal{}) {
			continue
		}
		r, ok := next()
		if !ok || r != step.want {
			t.Fatalf("notification %+v (received: %v), want %+v", r, ok, step.want)
		}
	}
	// The link's removal: its remaining addresses may be announced first.
	if err := l.DeleteLink("vips0"); err != nil {
		t.Fatal(err)
	}
	for {
		r, ok := next()
		if !ok {
			t.Fatal("no notification of the link's removal")
		}
		if r == (Removal{Link: "vips0"}) {
			break
		}
		if r.Link != "vips0" || (r.Addr != netip.MustParseAddr("10.96.0.11") && r.Addr != netip.MustParseAddr("10.96.0.12") && !r.Addr.IsLinkLocalUnicast()) {
			t.Fatalf("unexpected notification %+v before the link's removal", r)
		}
	}
	select {
	case r := <-got:
		t.Errorf("a notification after the link's removal: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWatchNodeAddresses: an address added to or removed from a node link
// is reported; one on an excluded link (the proxy's VIPs) or a link-local
// one is not.
func TestWatchNodeAddresses(t *testing.T) {
	nltest.InFreshNetns(t)
	for _, name := range []string{"vips0", "eth9"} {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "-peer"}); err != nil {
			t.Fatalf("add veth %s: %v", name, err)
		}
	}
	l := newLinks(t)
	got := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := l.(NodeAddressWatcher).WatchNodeAddresses(ctx, func() { got <- struct{}{} }, func(err error) { t.Errorf("watch: %v", err) }, "vips0")
	if err != nil {
		t.Fatal(err)
	}
	changed := func(within time.Duration) bool {
		select {
		case <-got:
			return true
		case <-time.After(within):
			return false
		}
	}
	for _, step := range []struct {
		what string
		do   func() error
		want bool
	}{
		{"a VIP bound", func() error { return l.AddAddress("vips0", netip.MustParseAddr("10.96.0.10")) }, false},
		{"a link-local address", func() error { return l.AddAddress("eth9", netip.MustParseAddr("fe80::99")) }, false},
		{"a node address added", func() error { return l.AddAddress("eth9", netip.MustParseAddr("192.168.9.10")) }, true},
		{"a node address removed", func() error { return l.DeleteAddress("eth9", netip.MustParseAddr("192.168.9.10")) }, true},
		{"a VIP unbound", func() error { return l.DeleteAddress("vips0", netip.MustParseAddr("10.96.0.10")) }, false},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		within := 3 * time.Second
		if !step.want {
			within = 300 * time.Millisecond
		}
		if c := changed(within); c != step.want {
			t.Errorf("%s: reported %v, want %v", step.what, c, step.want)
		}
		for changed(50 * time.Millisecond) { // one change may bring several notifications
		}
	}
}
