package ktypes

import (
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
)

// OpKind is the kind of a kernel operation.
type OpKind uint8

// The kinds of operations, in the order a sync applies them: addresses are
// bound before their virtual servers are added and unbound after they are
// deleted, so that a crash in between never leaves a virtual server that
// the ownership rule does not cover.
const (
	OpBind OpKind = iota
	OpAddVirtualServer
	OpUpdateVirtualServer
	OpAddRealServer
	OpUpdateRealServer
	OpDeleteRealServer
	OpDeleteVirtualServer
	OpUnbind
	// OpRoute comes before every bind and OpUnroute after every unbind
	// (Diff orders them so; the values are kept for the kinds above).
	OpRoute
	OpUnroute
)

var opNames = [...]string{"bind", "add-virtual-server", "update-virtual-server", "add-real-server",
	"update-real-server", "delete-real-server", "delete-virtual-server", "unbind", "route", "unroute"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op-%d", k)
}

// Op is one kernel write. Service is the Service it is for: the holder of
// the virtual server (zero for a virtual server no Service wants, and for
// addresses).
type Op struct {
	Kind    OpKind
	Service types.NamespacedName
	// VirtualServer is the wanted one (add, update), or the kernel's.
	VirtualServer VirtualServer
	// RealServer is the wanted one (add, update), or the kernel's.
	RealServer RealServer
	Address    netip.Addr
	// Prefix is a route's (OpRoute, OpUnroute).
	Prefix netip.Prefix
	// Was is what the kernel held before an update: its virtual server's
	// settings or its real server's weight and forwarding method.
	WasVirtualServer VirtualServer
	WasWeight        int32
	WasForward       Forward
	WasTunPort       uint16
	// Move marks the delete and the add that move a real server of an
	// Ordered virtual server to the head of the kernel's list (the only
	// way to reorder it): one follows the other in the same batch, and the
	// delete is not a removal (its UDP flows' conntrack entries are kept).
	Move bool
}

func (o Op) String() string {
	switch o.Kind {
	case OpBind, OpUnbind:
		return fmt.Sprintf("%s %s", o.Kind, o.Address)
	case OpRoute, OpUnroute:
		return fmt.Sprintf("%s %s", o.Kind, o.Prefix)
	case OpAddVirtualServer:
		return fmt.Sprintf("%s %s", o.Kind, o.VirtualServer)
	case OpUpdateVirtualServer:
		return fmt.Sprintf("%s %s (was %s)", o.Kind, o.VirtualServer, o.WasVirtualServer)
	case OpDeleteVirtualServer:
		return fmt.Sprintf("%s %s", o.Kind, o.VirtualServer.VSKey)
	case OpUpdateRealServer:
		was := RealServer{Weight: o.WasWeight, Forward: o.WasForward, TunPort: o.WasTunPort}
		if was.SameForward(o.RealServer) {
			return fmt.Sprintf("%s %s %s (was w=%d)", o.Kind, o.VirtualServer.VSKey, o.RealServer, o.WasWeight)
		}
		return fmt.Sprintf("%s %s %s (was w=%d %s)", o.Kind, o.VirtualServer.VSKey, o.RealServer, o.WasWeight, was.ForwardString())
	case OpDeleteRealServer:
		return fmt.Sprintf("%s %s %s%s", o.Kind, o.VirtualServer.VSKey, o.RealServer.RSKey, moveNote(o.Move))
	case OpAddRealServer:
		return fmt.Sprintf("%s %s %s%s", o.Kind, o.VirtualServer.VSKey, o.RealServer, moveNote(o.Move))
	}
	return fmt.Sprintf("%s %s %s", o.Kind, o.VirtualServer.VSKey, o.RealServer)
}

func moveNote(move bool) string {
	if move {
		return " (move to head)"
	}
	return ""
}
