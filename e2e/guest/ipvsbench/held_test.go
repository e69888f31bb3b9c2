package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
)

// TestHeld: a VIP counts as programmed when it is bound to the interface
// (kube-proxy, ipvs-proxy's default) or in a range routed as local
// through it (ipvs-proxy with --route-service-cidrs); an address of
// neither, or a route through another link, does not.
func TestHeld(t *testing.T) {
	links := fake.NewLinks()
	for _, err := range []error{
		links.EnsureDummy("ipvs-proxy0"),
		links.EnsureDummy("other0"),
		links.AddAddress("ipvs-proxy0", netip.MustParseAddr("203.0.113.5")),
		links.AddLocalRoute("ipvs-proxy0", netlinkutil.LocalRoute{Prefix: netip.MustParsePrefix("10.96.0.0/16")}),
		links.AddLocalRoute("other0", netlinkutil.LocalRoute{Prefix: netip.MustParsePrefix("10.97.0.0/16")}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	svc := func(vips ...string) []Service {
		var out []Service
		for _, v := range vips {
			out = append(out, Service{VIP: v, Port: 80})
		}
		return out
	}
	if err := held(links, "ipvs-proxy0", svc("10.96.0.10", "10.96.255.254", "203.0.113.5")); err != nil {
		t.Errorf("bound and routed VIPs: %v", err)
	}
	for _, vip := range []string{"10.97.0.10", "203.0.113.6", "bogus"} {
		if err := held(links, "ipvs-proxy0", svc("10.96.0.10", vip)); err == nil || !strings.Contains(err.Error(), vip) {
			t.Errorf("%s: got %v, want an error naming it", vip, err)
		}
	}
}
