// Package netlinkutil is ipvs-proxy's only door to the kernel's IPVS table and
// to the links and addresses that carry virtual IPs. It reads and writes the
// plain values of package proxier/model, so that the reconciler can be tested
// against a fake that records calls and injects errors (see package
// netlinkutil/fake) and the same behaviour shown against the real kernel.
//
// Real servers carry their forwarding method (ktypes.Forward: NAT, an IPIP
// tunnel, GUE with its UDP port). Every real server write, batched or
// single, goes through one encoder (encodeWrite), which sends the method
// and, for tunnels, the tunnel type, port and flags (moby/ipvs has no
// tunnel attributes). Reads: destination dumps are decoded here
// (dumpRealServers); the bulk read of /proc/net/ip_vs shows "Tunnel"
// without type or port, so a virtual server with a tunnel destination is
// dumped again (one dump each; none when no tunnel exists). A method
// ipvs-proxy never writes (direct routing, ...) reads as ForwardForeign.
// In the kernel a connection keeps the method it was made with, but a
// tunnel's type and port are the destination's at each packet.
package netlinkutil

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// Timeouts are IPVS's connection timeouts; zero leaves a value unchanged.
type Timeouts struct {
	TCP, TCPFin, UDP time.Duration
}

// SchedulerUnavailable reports whether an error of AddVirtualServer or
// UpdateVirtualServer means the kernel lacks the virtual server's scheduler:
// IPVS answers ENOENT when it cannot find or load module ip_vs_<name>.
func SchedulerUnavailable(err error) bool { return errors.Is(err, syscall.ENOENT) }

// ErrOutcomeUnknown is wrapped by the error of a batched write whose answer
// the kernel could not queue (the socket's receive buffer overflowed): it
// may or may not have been applied, and the kernel must be read again.
var ErrOutcomeUnknown = nlbatch.ErrUnknown

// Write is one write of a batch (IPVS.Apply): a ktypes.Op of one of the
// virtual and real server kinds (not bind or unbind), whose VirtualServer
// is whole for an add or update of it (only its key counts otherwise) and
// whose RealServer is the real server of a real server write (only its key
// counts for a delete). The reconciler hands its diff's operations over as
// they are.
type Write = ktypes.Op

// WrapWrite gives a write's error the context that the one-at-a-time calls
// give it.
func WrapWrite(w Write, err error) error {
	vs, rs := w.VirtualServer, w.RealServer.RSKey
	switch w.Kind {
	case ktypes.OpAddVirtualServer:
		return fmt.Errorf("add IPVS service %s: %w", vs, err)
	case ktypes.OpUpdateVirtualServer:
		return fmt.Errorf("update IPVS service %s: %w", vs, err)
	case ktypes.OpDeleteVirtualServer:
		return fmt.Errorf("delete IPVS service %s: %w", vs.VSKey, err)
	case ktypes.OpAddRealServer:
		return fmt.Errorf("add IPVS destination %s to %s: %w", rs, vs.VSKey, err)
	case ktypes.OpUpdateRealServer:
		return fmt.Errorf("update IPVS destination %s of %s: %w", rs, vs.VSKey, err)
	case ktypes.OpDeleteRealServer:
		return fmt.Errorf("delete IPVS destination %s of %s: %w", rs, vs.VSKey, err)
	}
	return fmt.Errorf("%s: %w", w, err)
}

// IPVS is the kernel's IPVS table.
type IPVS interface {
	// ListVirtualServers dumps every virtual server in one netlink request.
	ListVirtualServers() ([]ktypes.VirtualServer, error)
	// ListRealServers dumps the destinations of one virtual server.
	ListRealServers(vs ktypes.VSKey) ([]ktypes.RealServer, error)
	// ListAllRealServers reads the destinations of every virtual server
	// (fwmark ones aside) in one pass, for a full resync: one read of the
	// kernel instead of one dump per virtual server. It may leave out
	// some virtual servers when other network namespaces have IPVS
	// virtual servers (see procTable); read those with ListRealServers.
	ListAllRealServers() (map[ktypes.VSKey][]ktypes.RealServer, error)
	// Apply makes the writes in order, many in flight at once, and returns
	// the error of each (nil: applied), with the context that the single
	// calls below give it. A failed write does not stop the others; one
	// that depends on a failed one fails in its turn (a real server added
	// to a virtual server whose add failed: ESRCH). An error wrapping
	// ErrOutcomeUnknown says the write's answer was lost.
	Apply(writes []Write) []error
	AddVirtualServer(vs ktypes.VirtualServer) error
	UpdateVirtualServer(vs ktypes.VirtualServer) error
	DeleteVirtualServer(vs ktypes.VSKey) error
	AddRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error
	UpdateRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error
	DeleteRealServer(vs ktypes.VSKey, rs ktypes.RSKey) error
	SetTimeouts(t Timeouts) error
	Close()
}

// StatsReader reads the traffic counters of every virtual server (fwmark
// ones aside) in one dump. A kernel IPVS handle is one; it must not be
// shared with another goroutine's handle.
type StatsReader interface {
	VirtualServerStats() (map[ktypes.VSKey]ktypes.Stats, error)
}

// Links manages the dummy interface that holds virtual IPs, and reads the
// node's own addresses.
type Links interface {
	// EnsureDummy creates the dummy link if missing and sets it up; the
	// link carries OwnerAlias, set on one that exists without it.
	EnsureDummy(name string) error
	// DeleteLink removes a link; a missing link is not an error.
	DeleteLink(name string) error
	// LinkInfo tells what a link is; ok is false when it does not exist.
	LinkInfo(name string) (info LinkInfo, ok bool, err error)
	// ListAddresses lists the addresses bound to a link (nil if it does not
	// exist).
	ListAddresses(link string) ([]netip.Addr, error)
	AddAddress(link string, addr netip.Addr) error
	DeleteAddress(link string, addr netip.Addr) error
	// NodeAddresses lists the unicast addresses of every link but loopback
	// and the links named in exclude.
	NodeAddresses(exclude ...string) ([]netip.Addr, error)
	// ListLocalRoutes lists the local routes that ipvs-proxy added
	// through a link (type local in the local table, tagged
	// RouteProtocol; nil if the link does not exist). Every address of
	// such a prefix is the node's own, as if bound, without one address
	// each.
	ListLocalRoutes(link string) ([]LocalRoute, error)
	// AddLocalRoute adds or replaces such a route.
	AddLocalRoute(link string, r LocalRoute) error
	// DeleteLocalRoute removes the route of r's prefix; a missing one is
	// not an error.
	DeleteLocalRoute(link string, r LocalRoute) error
}

// LocalRoute makes a prefix local.
type LocalRoute struct {
	Prefix netip.Prefix
	// Src is the source address of the node's own connections to the
	// prefix (the route's preferred source), which must be an address of
	// the node; invalid: none, and then IPv4 uses the destination itself
	// and IPv6 the loopback address (which cannot leave the node).
	Src netip.Addr
}

func (r LocalRoute) String() string {
	if r.Src.IsValid() {
		return r.Prefix.String() + " src " + r.Src.String()
	}
	return r.Prefix.String()
}

// RouteProtocol tags the local routes ipvs-proxy adds (rtm_protocol), so
// that they are told from the kernel's own routes for bound addresses and
// anyone else's (`ip route show table local proto 120`).
const RouteProtocol = 120

// OwnerAlias is the alias (IFLA_IFALIAS, `ip link` shows it) of the
// dummy links EnsureDummy makes or keeps: the mark by which `ipvs-proxy
// cleanup` knows a link as ipvs-proxy's own.
const OwnerAlias = "ipvs-proxy"

// LinkInfo is what a link is: its type ("dummy", "veth", ...) and alias.
type LinkInfo struct{ Type, Alias string }

// Owned reports whether the link is one EnsureDummy made or kept.
func (i LinkInfo) Owned() bool { return i.Type == "dummy" && i.Alias == OwnerAlias }

// KubeProxyInterface is kube-proxy's IPVS dummy interface.
const KubeProxyInterface = "kube-ipvs0"

// ProxyInterfaces are the dummy interfaces whose addresses are Service
// VIPs, never the node's own: the proxy's and kube-proxy's (which holds
// kube-proxy's VIPs until a takeover from it has finished). Node addresses
// are read excluding them: NodeAddresses(ProxyInterfaces(own)...).
func ProxyInterfaces(own string) []string {
	if own == "" || own == KubeProxyInterface {
		return []string{KubeProxyInterface}
	}
	return []string{own, KubeProxyInterface}
}

// Removal is an address or a link that the kernel announced removed.
type Removal struct {
	Link string     // the watched link
	Addr netip.Addr // the address removed from it; invalid: the link itself is gone
}

// NodeAddressWatcher reports changes of the node's own addresses.
type NodeAddressWatcher interface {
	// WatchNodeAddresses calls changed, on a goroutine of its own, when an
	// address is added to or removed from a link not named in exclude,
	// until ctx ends; onErr gets a lost subscription or overrun (changes
	// may be missing).
	WatchNodeAddresses(ctx context.Context, changed func(), onErr func(error), exclude ...string) error
}

// RemovalWatcher reports removals as the kernel announces them (route
// netlink's multicast groups), its own writes' included: an agent tells
// them from someone else's by its view of what it bound.
type RemovalWatcher interface {
	// WatchRemovals calls fn, on a goroutine of its own, for every address
	// removed from link and when link itself is removed, until ctx ends;
	// onErr gets a lost subscription or overrun (events may be missing).
	WatchRemovals(ctx context.Context, link string, fn func(Removal), onErr func(error)) error
}
