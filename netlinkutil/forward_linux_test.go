package netlinkutil

import (
	"encoding/binary"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink/nl"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// destAttrs encodes a real server write and returns its destination's
// attributes by number (values as the kernel would read them: u32 and u16
// host order, ports network order, u8 as is).
func destAttrs(t *testing.T, w Write) map[uint16][]byte {
	t.Helper()
	b, err := encodeWrite(w)
	if err != nil {
		t.Fatal(err)
	}
	top, err := nl.ParseRouteAttr(b[nl.SizeofGenlmsg:])
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16][]byte{}
	for _, a := range top {
		if a.Attr.Type&nl.NLA_TYPE_MASK != ipvsCmdAttrDest {
			continue
		}
		attrs, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range attrs {
			out[d.Attr.Type&nl.NLA_TYPE_MASK] = d.Value
		}
	}
	return out
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// TestEncodeForward: an add or update of a real server carries its
// forwarding method as linux/ip_vs.h numbers it (MASQ 0, TUNNEL 2), and a
// tunnel its type (IPIP 0, GUE 1), port (network order) and flags (0, no
// checksum); NAT sends no tunnel attribute; a delete sends no method; a
// method ipvs-proxy does not know is refused, never sent as NAT, but a
// destination with such a method can be deleted.
func TestEncodeForward(t *testing.T) {
	vs := ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.96.0.10:80", ktypes.TCP), Scheduler: "rr"}
	for _, tc := range []struct {
		name string
		kind ktypes.OpKind
		rs   string
		want map[uint16][]byte // attributes 3 (method) and 13-15 (tunnel)
	}{
		{"nat add", ktypes.OpAddRealServer, "10.244.1.2:8080", map[uint16][]byte{ipvsDestAttrFwdMethod: u32(0)}},
		{"tunnel add", ktypes.OpAddRealServer, "10.244.1.2:8080 tunnel", map[uint16][]byte{ipvsDestAttrFwdMethod: u32(2),
			ipvsDestAttrTunType: {0}, ipvsDestAttrTunPort: {0, 0}, ipvsDestAttrTunFlags: {0, 0}}},
		{"gue update", ktypes.OpUpdateRealServer, "10.244.1.2:8080@0 gue:6080", map[uint16][]byte{ipvsDestAttrFwdMethod: u32(2),
			ipvsDestAttrTunType: {1}, ipvsDestAttrTunPort: {0x17, 0xc0}, ipvsDestAttrTunFlags: {0, 0}}},
		{"nat update", ktypes.OpUpdateRealServer, "10.244.1.2:8080", map[uint16][]byte{ipvsDestAttrFwdMethod: u32(0)}},
		{"delete", ktypes.OpDeleteRealServer, "10.244.1.2:8080 gue:6080", map[uint16][]byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := destAttrs(t, Write{Kind: tc.kind, VirtualServer: vs, RealServer: ktypestest.RS(tc.rs)})
			fwd := map[uint16][]byte{}
			for _, a := range []uint16{ipvsDestAttrFwdMethod, ipvsDestAttrTunType, ipvsDestAttrTunPort, ipvsDestAttrTunFlags} {
				if v, ok := got[a]; ok {
					fwd[a] = v
				}
			}
			if diff := cmp.Diff(tc.want, fwd); diff != "" {
				t.Errorf("forwarding attributes (-want +got):\n%s", diff)
			}
		})
	}
	rs := ktypestest.RS("10.244.1.2:8080")
	rs.Forward = ForwardForeign
	for _, kind := range []ktypes.OpKind{ktypes.OpAddRealServer, ktypes.OpUpdateRealServer} {
		if _, err := encodeWrite(Write{Kind: kind, VirtualServer: vs, RealServer: rs}); err == nil {
			t.Errorf("%s: encoded a real server with forwarding method %s", kind, rs.Forward)
		}
	}
	// The kernel's destination of a method ipvs-proxy never writes can be
	// deleted.
	if _, err := encodeWrite(Write{Kind: ktypes.OpDeleteRealServer, VirtualServer: vs, RealServer: rs}); err != nil {
		t.Errorf("delete of a destination forwarded by %s: %v", rs.Forward, err)
	}
}

// TestDecodeDest: a destination dump's answer (as the kernel's
// ip_vs_genl_fill_dest writes it) decodes to the real server with its
// method: masquerade, IPIP, GUE with its port, and a method ipvs-proxy
// never writes (direct routing, 3) as ForwardForeign.
func TestDecodeDest(t *testing.T) {
	dest := func(method uint32, tunType uint8, tunPort uint16) []byte {
		b := nlbatch.Attrs{ipvsCmdGetDest, ipvsGenlVersion, 0, 0}
		return b.Nest(ipvsCmdAttrDest, func(a nlbatch.Attrs) nlbatch.Attrs {
			a = a.Bytes(ipvsDestAttrAddr, []byte{10, 244, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
			a = a.BE16(ipvsDestAttrPort, 8080)
			a = a.U32(ipvsDestAttrFwdMethod, method)
			a = a.U32(ipvsDestAttrWeight, 1)
			a = a.U32(ipvsDestAttrActive, 2)
			a = a.U32(ipvsDestAttrInactive, 3)
			a = a.U16(ipvsDestAttrAF, syscall.AF_INET)
			a = a.U8(ipvsDestAttrTunType, tunType)
			a = a.BE16(ipvsDestAttrTunPort, tunPort)
			return a.U16(ipvsDestAttrTunFlags, 0)
		})
	}
	foreign := ktypestest.RS("10.244.1.2:8080#2.3")
	foreign.Forward = ForwardForeign
	for _, tc := range []struct {
		msg  []byte
		want ktypes.RealServer
	}{
		{dest(0, 0, 0), ktypestest.RS("10.244.1.2:8080#2.3")},
		{dest(2, 0, 0), ktypestest.RS("10.244.1.2:8080#2.3 tunnel")},
		{dest(2, 1, 6080), ktypestest.RS("10.244.1.2:8080#2.3 gue:6080")},
		{dest(3, 0, 0), foreign},
	} {
		got, err := decodeDest(tc.msg)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got, addrCmp); diff != "" {
			t.Errorf("decoded (-want +got):\n%s", diff)
		}
	}
}
