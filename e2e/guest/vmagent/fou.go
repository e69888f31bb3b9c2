package main

import (
	"encoding/binary"
	"fmt"

	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The kernel's fou generic netlink interface (uapi linux/fou.h).
const (
	fouCmdAdd      = 1
	fouVersion     = 1
	fouAttrPort    = 1 // be16
	fouAttrAF      = 2 // u8
	fouAttrIPProto = 3 // u8
	fouAttrType    = 4 // u8
	fouEncapDirect = 1
	fouEncapGUE    = 2
)

// fouAddCmd makes the kernel's fou module listen on a UDP port and
// decapsulate what arrives there (the VM's busybox ip has no `ip fou`):
// with --gue, Generic UDP Encapsulation, whose header names the inner
// protocol; without, plain foo-over-UDP of --ipproto. The request carries
// only the attributes that apply (no protocol with GUE).
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
	fam, err := netlink.GenlFamilyGet("fou")
	if err != nil {
		return fmt.Errorf("fou-add: the fou family (is the module loaded?): %w", err)
	}
	ae := mnl.NewAttributeEncoder()
	ae.Bytes(fouAttrPort, binary.BigEndian.AppendUint16(nil, uint16(*port)))
	af := uint8(unix.AF_INET)
	if *v6 {
		af = unix.AF_INET6
	}
	ae.Uint8(fouAttrAF, af)
	if *gue {
		ae.Uint8(fouAttrType, fouEncapGUE)
	} else {
		ae.Uint8(fouAttrType, fouEncapDirect)
		ae.Uint8(fouAttrIPProto, uint8(*ipproto))
	}
	attrs, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("fou-add: %w", err)
	}
	c, err := mnl.Dial(unix.NETLINK_GENERIC, nil)
	if err != nil {
		return fmt.Errorf("fou-add: %w", err)
	}
	defer c.Close()
	msg := mnl.Message{
		Header: mnl.Header{Type: mnl.HeaderType(fam.ID), Flags: mnl.Request | mnl.Acknowledge},
		Data:   append([]byte{fouCmdAdd, fouVersion, 0, 0}, attrs...),
	}
	if _, err := c.Execute(msg); err != nil {
		return fmt.Errorf("fou-add: %w", err)
	}
	return nil
}
