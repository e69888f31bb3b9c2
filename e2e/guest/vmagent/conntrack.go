package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// conntrackCmd prints the kernel's connection tracking entries of both
// families (the VM has no conntrack tool), one per line, those to --port
// only when it is given: what a test logs when a connection through a VIP
// broke.
func conntrackCmd(args []string, stdout io.Writer) error {
	fs := newFlags("conntrack")
	port := fs.Uint("port", 0, "only entries whose original destination port is this")
	if err := parse(fs, args); err != nil {
		return err
	}
	var lines []string
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
		if err != nil {
			return fmt.Errorf("list conntrack entries of family %d: %w", family, err)
		}
		for _, f := range flows {
			if *port != 0 && uint(f.Forward.DstPort) != *port {
				continue
			}
			lines = append(lines, f.String())
		}
	}
	slices.Sort(lines)
	_, err := fmt.Fprintln(stdout, strings.Join(lines, "\n"))
	return err
}
