package netlinkutil

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// IPVS generic netlink commands and attributes (linux/ip_vs.h).
const (
	ipvsGenlVersion = 1

	ipvsCmdNewService = 1
	ipvsCmdSetService = 2
	ipvsCmdDelService = 3
	ipvsCmdNewDest    = 5
	ipvsCmdSetDest    = 6
	ipvsCmdDelDest    = 7
	ipvsCmdGetDest    = 8

	ipvsCmdAttrService = 1
	ipvsCmdAttrDest    = 2

	ipvsSvcAttrAF        = 1
	ipvsSvcAttrProtocol  = 2
	ipvsSvcAttrAddr      = 3
	ipvsSvcAttrPort      = 4
	ipvsSvcAttrSchedName = 6
	ipvsSvcAttrFlags     = 7
	ipvsSvcAttrTimeout   = 8
	ipvsSvcAttrNetmask   = 9

	ipvsDestAttrAddr      = 1
	ipvsDestAttrPort      = 2
	ipvsDestAttrFwdMethod = 3
	ipvsDestAttrWeight    = 4
	ipvsDestAttrUThresh   = 5
	ipvsDestAttrLThresh   = 6
	ipvsDestAttrActive    = 7
	ipvsDestAttrInactive  = 8
	ipvsDestAttrAF        = 11
	ipvsDestAttrTunType   = 13 // u8, since Linux 5.2
	ipvsDestAttrTunPort   = 14 // be16
	ipvsDestAttrTunFlags  = 15 // u16, since Linux 5.3
)

var ipvsCommands = map[ktypes.OpKind]uint8{
	ktypes.OpAddVirtualServer:    ipvsCmdNewService,
	ktypes.OpUpdateVirtualServer: ipvsCmdSetService,
	ktypes.OpDeleteVirtualServer: ipvsCmdDelService,
	ktypes.OpAddRealServer:       ipvsCmdNewDest,
	ktypes.OpUpdateRealServer:    ipvsCmdSetDest,
	ktypes.OpDeleteRealServer:    ipvsCmdDelDest,
}

// encodeWrite renders one write as an IPVS generic netlink request, with
// the attributes that the kernel requires of it (and that the one-at-a-time
// calls send): the whole service for an add or update of one, its key
// otherwise; the whole destination for an add or update of one.
func encodeWrite(w Write) ([]byte, error) {
	cmd, ok := ipvsCommands[w.Kind]
	if !ok {
		return nil, fmt.Errorf("%s is not an IPVS write", w.Kind)
	}
	vs := w.VirtualServer
	if !vs.Address.IsValid() || (w.Kind >= ktypes.OpAddRealServer && w.Kind <= ktypes.OpDeleteRealServer && !w.RealServer.Address.IsValid()) {
		return nil, fmt.Errorf("%s: invalid address", w)
	}
	b := nlbatch.Attrs{cmd, ipvsGenlVersion, 0, 0} // genlmsghdr
	b = b.Nest(ipvsCmdAttrService, func(a nlbatch.Attrs) nlbatch.Attrs {
		a = appendServiceKey(a, vs.VSKey)
		if cmd == ipvsCmdNewService || cmd == ipvsCmdSetService {
			k := toKernelVS(vs)
			a = a.String(ipvsSvcAttrSchedName, k.SchedName)
			// struct ip_vs_flags: the flags, and the mask of those set.
			flags := binary.NativeEndian.AppendUint32(nil, k.Flags)
			a = a.Bytes(ipvsSvcAttrFlags, binary.NativeEndian.AppendUint32(flags, 0xffffffff))
			a = a.U32(ipvsSvcAttrTimeout, k.Timeout)
			a = a.U32(ipvsSvcAttrNetmask, k.Netmask)
		}
		return a
	})
	if cmd >= ipvsCmdNewDest {
		rs := w.RealServer
		var fwd kernelFwd
		if cmd != ipvsCmdDelDest { // a delete names any destination, whatever its method
			var err error
			if fwd, err = kernelForward(rs); err != nil {
				return nil, fmt.Errorf("%s: %w", w, err)
			}
		}
		b = b.Nest(ipvsCmdAttrDest, func(a nlbatch.Attrs) nlbatch.Attrs {
			a = a.Bytes(ipvsDestAttrAddr, rs.Address.AsSlice())
			a = a.BE16(ipvsDestAttrPort, rs.Port)
			a = a.U16(ipvsDestAttrAF, family(rs.Address))
			if cmd != ipvsCmdDelDest {
				a = appendForward(a, fwd)
				a = a.U32(ipvsDestAttrWeight, uint32(rs.Weight))
				a = a.U32(ipvsDestAttrUThresh, 0)
				a = a.U32(ipvsDestAttrLThresh, 0)
			}
			return a
		})
	}
	return b, nil
}

// appendForward appends a destination's forwarding method and, for a
// tunnel, its type, port and flags (no checksum). An add or update sets
// all of them (the kernel zeroes what a request leaves out), so the kernel
// holds exactly the real server's method.
func appendForward(a nlbatch.Attrs, k kernelFwd) nlbatch.Attrs {
	a = a.U32(ipvsDestAttrFwdMethod, k.method)
	if k.method != ipvsFwdTunnel {
		return a
	}
	a = a.U8(ipvsDestAttrTunType, k.tunType)
	a = a.BE16(ipvsDestAttrTunPort, k.tunPort)
	return a.U16(ipvsDestAttrTunFlags, ipvsTunFlagNoCsum)
}

// appendServiceKey appends the attributes that name a virtual server.
func appendServiceKey(a nlbatch.Attrs, vs ktypes.VSKey) nlbatch.Attrs {
	a = a.U16(ipvsSvcAttrAF, family(vs.Address))
	a = a.U16(ipvsSvcAttrProtocol, uint16(vs.Protocol))
	a = a.Bytes(ipvsSvcAttrAddr, vs.Address.AsSlice())
	return a.BE16(ipvsSvcAttrPort, vs.Port)
}

// Apply implements IPVS: the writes go out pipelined on the batch socket.
func (k *kernelIPVS) Apply(writes []Write) []error {
	errs := make([]error, len(writes))
	msgs := make([]nlbatch.Message, 0, len(writes))
	idx := make([]int, 0, len(writes)) // writes[idx[j]] is msgs[j]
	for i, w := range writes {
		data, err := encodeWrite(w)
		if err != nil {
			errs[i] = err
			continue
		}
		msgs = append(msgs, nlbatch.Message{Type: k.familyID, Data: data})
		idx = append(idx, i)
	}
	if err := k.restoreNodestConns(); err != nil {
		return failAll(errs, writes, idx, err)
	}
	if hasMove(writes) {
		// Best effort: without it (a read-only /proc/sys) the moves are
		// still made, and only a packet in the moment between a move's
		// two writes could expire its connection.
		k.holdNodestConns()
	}
	for j, r := range k.batch.Exchange(msgs) {
		if r.Err != nil {
			errs[idx[j]] = WrapWrite(writes[idx[j]], r.Err)
		}
	}
	if err := k.restoreNodestConns(); err != nil {
		// The writes were made; the sync fails so that it comes again,
		// and the next batch sets the sysctl back first.
		for _, i := range idx {
			if writes[i].Move && errs[i] == nil {
				errs[i] = WrapWrite(writes[i], err)
			}
		}
	}
	return errs
}

// failAll gives every write of a batch not sent the same error.
func failAll(errs []error, writes []Write, idx []int, err error) []error {
	for _, i := range idx {
		errs[i] = WrapWrite(writes[i], err)
	}
	return errs
}

func hasMove(writes []Write) bool {
	for _, w := range writes {
		if w.Move {
			return true
		}
	}
	return false
}

// expireNodestConn is the sysctl that, at 1 (kube-proxy's setting and
// ours), makes IPVS expire the connections of a deleted real server: at
// their next packet, and in a sweep queued a jiffy after the delete.
const expireNodestConn = "net/ipv4/vs/expire_nodest_conn"

// holdNodestConns sets expire_nodest_conn to 0 (best effort) for a batch that moves real
// servers (a delete and an add of the same one, see ktypes.Op.Move);
// restoreNodestConns sets it back after the batch (or before the next one,
// if that failed). Between the two writes of a move the real server is
// missing: at 1, a packet of one of its connections in that moment would
// expire the connection (the add revives the same destination, but not a
// connection already expired), and the sweep might run before the add; at
// 0 the packet is dropped and retransmitted, and the connection goes on.
func (k *kernelIPVS) holdNodestConns() {
	old, err := k.sys.Ensure(expireNodestConn, "0")
	if err == nil && old != "0" {
		k.nodestRestore = old
	}
}

// restoreNodestConns tries three times; if it still fails, the batch's
// moves fail (their Service's sync comes again) and the next batch tries
// first.
func (k *kernelIPVS) restoreNodestConns() error {
	if k.nodestRestore == "" {
		return nil
	}
	var err error
	for range 3 {
		if _, err = k.sys.Ensure(expireNodestConn, k.nodestRestore); err == nil {
			k.nodestRestore = ""
			return nil
		}
	}
	return fmt.Errorf("set %s back to %s after moving real servers: %w", expireNodestConn, k.nodestRestore, err)
}

// family returns the address family of an address (AF_INET or AF_INET6).
func family(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}
