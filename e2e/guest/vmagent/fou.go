package main

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fouAddCmd makes the kernel's fou module listen on a UDP port and
// decapsulate what arrives there (the VM's busybox ip has no `ip fou`):
// with --gue, Generic UDP Encapsulation, whose header names the inner
// protocol; without, plain foo-over-UDP of --ipproto.
func fouAddCmd(args []string) error {
	fs := newFlags("fou-add")
	port := fs.Int("port", 0, "UDP port to decapsulate on")
	gue := fs.Bool("gue", false, "GUE (the inner protocol is in its header)")
	ipproto := fs.Int("ipproto", unix.IPPROTO_IPIP, "inner protocol of plain fou")
	v6 := fs.Bool("6", false, "listen on IPv6")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *port <= 0 || *port > 65535 {
		return fmt.Errorf("%w: fou-add: --port is required", errUsage)
	}
	f := netlink.Fou{Family: netlink.FAMILY_V4, Port: *port, EncapType: netlink.FOU_ENCAP_DIRECT, Protocol: *ipproto}
	if *gue {
		f.EncapType, f.Protocol = netlink.FOU_ENCAP_GUE, 0
	}
	if *v6 {
		f.Family = netlink.FAMILY_V6
	}
	if err := netlink.FouAdd(f); err != nil {
		return fmt.Errorf("fou-add: %w", err)
	}
	return nil
}
