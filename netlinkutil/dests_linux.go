package netlinkutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// dumpRealServers reads one virtual server's destinations by generic
// netlink (IPVS_CMD_GET_DEST), in the kernel's list order, on the dump
// socket (the namespace of NewIPVS). It decodes the attributes itself:
// moby/ipvs's Destination has no tunnel type nor port.
func (k *kernelIPVS) dumpRealServers(vs ktypes.VSKey) ([]ktypes.RealServer, error) {
	req := nl.NewNetlinkRequest(int(k.familyID), unix.NLM_F_DUMP)
	hdr := nlbatch.Attrs{ipvsCmdGetDest, ipvsGenlVersion, 0, 0} // genlmsghdr
	req.AddRawData(hdr.Nest(ipvsCmdAttrService, func(a nlbatch.Attrs) nlbatch.Attrs { return appendServiceKey(a, vs) }))
	// One handle for every request: each gets its own sequence number, so
	// what is left of a dump cut short is skipped by the next one.
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: k.dumps}
	var out []ktypes.RealServer
	var derr error
	err := req.ExecuteIter(unix.NETLINK_GENERIC, 0, func(msg []byte) bool {
		var rs ktypes.RealServer
		if rs, derr = decodeDest(msg); derr != nil {
			return false
		}
		out = append(out, rs)
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("dump IPVS destinations of %s: %w", vs, err)
	}
	return out, nil
}

// decodeDest decodes one answer of a destination dump: a genlmsghdr, then
// IPVS_CMD_ATTR_DEST with the destination's attributes.
func decodeDest(msg []byte) (ktypes.RealServer, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return ktypes.RealServer{}, errors.New("short generic netlink message")
	}
	top, err := nl.ParseRouteAttr(msg[nl.SizeofGenlmsg:])
	if err != nil {
		return ktypes.RealServer{}, fmt.Errorf("decode destination: %w", err)
	}
	for _, a := range top {
		if a.Attr.Type&nl.NLA_TYPE_MASK == ipvsCmdAttrDest {
			attrs, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return ktypes.RealServer{}, fmt.Errorf("decode destination: %w", err)
			}
			return destFromAttrs(attrs)
		}
	}
	return ktypes.RealServer{}, errors.New("decode destination: no destination attribute")
}

// destFromAttrs builds a real server from a destination's attributes.
func destFromAttrs(attrs []syscall.NetlinkRouteAttr) (ktypes.RealServer, error) {
	var rs ktypes.RealServer
	var fwd kernelFwd
	var addr []byte
	af := uint16(unix.AF_INET)
	for _, a := range attrs {
		v := a.Value
		switch t := a.Attr.Type & nl.NLA_TYPE_MASK; {
		case t == ipvsDestAttrAddr:
			addr = v
		case t == ipvsDestAttrAF && len(v) >= 2:
			af = binary.NativeEndian.Uint16(v)
		case t == ipvsDestAttrPort && len(v) >= 2:
			rs.Port = binary.BigEndian.Uint16(v)
		case t == ipvsDestAttrFwdMethod && len(v) >= 4:
			fwd.method = binary.NativeEndian.Uint32(v)
		case t == ipvsDestAttrWeight && len(v) >= 4:
			rs.Weight = int32(binary.NativeEndian.Uint32(v))
		case t == ipvsDestAttrActive && len(v) >= 4:
			rs.ActiveConns = int32(binary.NativeEndian.Uint32(v))
		case t == ipvsDestAttrInactive && len(v) >= 4:
			rs.InactiveConns = int32(binary.NativeEndian.Uint32(v))
		case t == ipvsDestAttrTunType && len(v) >= 1:
			fwd.tunType = v[0]
		case t == ipvsDestAttrTunPort && len(v) >= 2:
			fwd.tunPort = binary.BigEndian.Uint16(v)
		}
	}
	n := 4
	if af == unix.AF_INET6 {
		n = 16
	}
	if len(addr) < n {
		return ktypes.RealServer{}, fmt.Errorf("decode destination: address of %d bytes for family %d", len(addr), af)
	}
	a, _ := netip.AddrFromSlice(addr[:n])
	rs.Address = a
	rs.Forward, rs.TunPort = fwd.forward()
	return rs, nil
}
