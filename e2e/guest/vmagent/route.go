package main

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// ecmpRouteCmd replaces the route to --dst with one over several next
// hops (busybox's ip has no nexthop): the outside host's ECMP route to a
// LoadBalancer IP over the nodes, as a router's would be. --weights gives
// each next hop's weight (default 1 each).
func ecmpRouteCmd(args []string) error {
	fs := newFlags("ecmp-route")
	var dst netip.Prefix
	fs.Var(prefixFlag{&dst}, "dst", "the route's destination (192.168.56.220/32)")
	via := fs.String("via", "", "next hops, comma-separated, in order")
	weights := fs.String("weights", "", "their weights, comma-separated (default 1 each)")
	dev := fs.String("dev", "eth1", "the interface the next hops are on")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !dst.IsValid() || *via == "" {
		return fmt.Errorf("%w: ecmp-route: need --dst and --via", errUsage)
	}
	link, err := netlink.LinkByName(*dev)
	if err != nil {
		return fmt.Errorf("ecmp-route: interface %s: %w", *dev, err)
	}
	hops, err := nextHops(link.Attrs().Index, strings.Split(*via, ","), *weights)
	if err != nil {
		return err
	}
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}, MultiPath: hops}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("ecmp-route: replace the route to %s via %s: %w", dst, *via, err)
	}
	return nil
}

// nextHops are the next hops of an ecmp-route on the interface of index
// link, weights the flag's value.
func nextHops(link int, via []string, weights string) ([]*netlink.NexthopInfo, error) {
	var ws []string
	if weights != "" {
		if ws = strings.Split(weights, ","); len(ws) != len(via) {
			return nil, fmt.Errorf("%w: ecmp-route: %d weights for %d next hops", errUsage, len(ws), len(via))
		}
	}
	var hops []*netlink.NexthopInfo
	for i, v := range via {
		gw, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%w: ecmp-route: next hop %q: %w", errUsage, v, err)
		}
		w := 1
		if ws != nil {
			if w, err = strconv.Atoi(strings.TrimSpace(ws[i])); err != nil || w < 1 || w > 256 {
				return nil, fmt.Errorf("%w: ecmp-route: weight %q: want 1 to 256", errUsage, ws[i])
			}
		}
		hops = append(hops, &netlink.NexthopInfo{LinkIndex: link, Gw: gw.AsSlice(), Hops: w - 1})
	}
	return hops, nil
}
