package tunnelend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Netlink is Net over vishvananda/netlink, in the network namespace of
// its handle (&netlink.Handle{}: the caller's thread's). AddFou always
// runs in the caller's thread's namespace.
type Netlink struct{ H *netlink.Handle }

// Rules implements Net.
func (n Netlink) Rules(priority int) ([]Rule, error) {
	f := netlink.NewRule()
	f.Priority = priority
	rs, err := n.H.RuleListFiltered(netlink.FAMILY_V4, f, netlink.RT_FILTER_PRIORITY)
	if err != nil {
		return nil, fmt.Errorf("list rules at %d: %w", priority, err)
	}
	out := make([]Rule, 0, len(rs))
	for _, r := range rs {
		mask := ^uint32(0)
		if r.Mask != nil {
			mask = *r.Mask
		}
		out = append(out, Rule{Priority: r.Priority, Mark: r.Mark, Mask: mask, Table: r.Table})
	}
	return out, nil
}

func toRule(r Rule) *netlink.Rule {
	nr := netlink.NewRule()
	nr.Family, nr.Priority, nr.Table, nr.Mark = netlink.FAMILY_V4, r.Priority, r.Table, r.Mark
	mask := r.Mask
	nr.Mask = &mask
	return nr
}

// AddRule implements Net.
func (n Netlink) AddRule(r Rule) error { return n.H.RuleAdd(toRule(r)) }

// DelRule implements Net.
func (n Netlink) DelRule(r Rule) error { return n.H.RuleDel(toRule(r)) }

// Routes implements Net.
func (n Netlink) Routes(table int) ([]Route, error) {
	rs, err := n.H.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes of table %d: %w", table, err)
	}
	out := make([]Route, 0, len(rs))
	for _, r := range rs {
		dst := "0.0.0.0/0"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		dev := ""
		if l, err := n.H.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		out = append(out, Route{Table: r.Table, Local: r.Type == unix.RTN_LOCAL, Dst: dst, Dev: dev})
	}
	return out, nil
}

func (n Netlink) toRoute(r Route) (*netlink.Route, error) {
	l, err := n.H.LinkByName(r.Dev)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r, err)
	}
	_, dst, err := net.ParseCIDR(r.Dst)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r, err)
	}
	nr := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Table: r.Table, Type: unix.RTN_UNICAST, Scope: unix.RT_SCOPE_LINK}
	if r.Local {
		nr.Type, nr.Scope = unix.RTN_LOCAL, unix.RT_SCOPE_HOST
	}
	return nr, nil
}

// AddRoute implements Net.
func (n Netlink) AddRoute(r Route) error {
	nr, err := n.toRoute(r)
	if err != nil {
		return err
	}
	return n.H.RouteAdd(nr)
}

// DelRoute implements Net.
func (n Netlink) DelRoute(r Route) error {
	nr, err := n.toRoute(r)
	if err != nil {
		return err
	}
	return n.H.RouteDel(nr)
}

// Link implements Net.
func (n Netlink) Link(name string) (Link, error) {
	l, err := n.H.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return Link{}, nil
	case err != nil:
		return Link{}, fmt.Errorf("read link %s: %w", name, err)
	}
	return Link{Exists: true, Up: l.Attrs().RawFlags&unix.IFF_UP != 0}, nil
}

// SetUp implements Net.
func (n Netlink) SetUp(name string) error {
	l, err := n.H.LinkByName(name)
	if err != nil {
		return fmt.Errorf("read link %s: %w", name, err)
	}
	return n.H.LinkSetUp(l)
}

// FouPorts implements Net.
func (n Netlink) FouPorts() ([]uint16, error) {
	fs, err := n.H.FouList(unix.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("list fou ports: %w", err)
	}
	var out []uint16
	for _, f := range fs {
		if f.EncapType == netlink.FOU_ENCAP_GUE {
			out = append(out, uint16(f.Port))
		}
	}
	return out, nil
}

// AddFou implements Net. It writes the request itself: vishvananda/netlink
// v1.3.1's FouAdd also sends FOU_ATTR_IPPROTO (0) with GUE, and the bed's
// 6.1 kernel refused that request with ERANGE (DSR.md; the kernel test
// logs what the library gets). Without the attribute the kernel takes it.
func (n Netlink) AddFou(port uint16) error {
	fam, err := n.H.GenlFamilyGet(netlink.FOU_GENL_NAME)
	if err != nil {
		return fmt.Errorf("fou generic netlink family: %w", err)
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: netlink.FOU_CMD_ADD, Version: 1})
	req.AddData(nl.NewRtAttr(netlink.FOU_ATTR_PORT, binary.BigEndian.AppendUint16(nil, port)))
	req.AddData(nl.NewRtAttr(netlink.FOU_ATTR_AF, []byte{unix.AF_INET}))
	req.AddData(nl.NewRtAttr(netlink.FOU_ATTR_TYPE, []byte{netlink.FOU_ENCAP_GUE}))
	if _, err := req.Execute(unix.NETLINK_GENERIC, 0); err != nil {
		return fmt.Errorf("add GUE port %d: %w", port, err)
	}
	return nil
}

// DelFou implements Net.
func (n Netlink) DelFou(port uint16) error {
	return n.H.FouDel(netlink.Fou{Family: unix.AF_INET, Port: int(port)})
}
