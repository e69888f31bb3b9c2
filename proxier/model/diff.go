package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Precedes reports whether Service a has precedence over Service b for a
// virtual server both want: the older Service (creation time) holds it, and
// between Services created in the same second, the lower namespace/name.
// Every kind of sync and `ipvs-proxy status` decide conflicts by this rule
// alone, so a resync never hands a virtual server to another Service.
func Precedes(a, b *ServicePlan) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	if a.Service.Namespace != b.Service.Namespace {
		return a.Service.Namespace < b.Service.Namespace
	}
	return a.Service.Name < b.Service.Name
}

// Conflict is a virtual server that Loser wants and Holder holds.
type Conflict struct {
	VirtualServer ktypes.VSKey
	Holder, Loser types.NamespacedName
}

func (c Conflict) String() string {
	return fmt.Sprintf("virtual server %s is held by Service %s, which is older", c.VirtualServer, c.Holder)
}

// Want is a virtual server that the kernel should hold, with the Service
// that holds it.
type Want struct {
	Service types.NamespacedName
	VSPlan
}

// Desired is what the kernel should hold: the virtual servers (each with
// its one holder), the addresses to bind to the proxy's interface and the
// Service ranges to route as local through it.
type Desired struct {
	VirtualServers map[ktypes.VSKey]Want
	Addresses      map[netip.Addr]bool
	Routes         map[netip.Prefix]bool
	// Excluded are the ranges of --exclude-cidrs (Ownership.ExcludeCIDRs):
	// what no one wants there is never deleted nor unbound, as kube-proxy
	// never cleans them up, even once a Service that wanted them is gone.
	Excluded []netip.Prefix
}

// Routed reports whether one of the wanted routes holds a.
func (d Desired) Routed(a netip.Addr) bool { return routed(d.Routes, a) }

// Route wants p routed as local through the interface, and its anchor
// bound (RangeAnchor).
func (d Desired) Route(p netip.Prefix) {
	p = p.Masked()
	d.Routes[p] = true
	if a, ok := RangeAnchor(p); ok {
		d.Addresses[a] = true
	}
}

// RangeAnchor is the address kept bound to the interface beside an IPv4
// Service range routed through it: the range's network address, which the
// apiserver never gives a Service. Linux removes every route through an
// interface when the interface's last IPv4 address is removed
// (fib_disable_ip), so without it, unbinding the last externalIP or
// LoadBalancer IP (its Service deleted) would take the range's route
// along and leave every clusterIP of the node unreachable until a full
// read found the route missing. IPv6 keeps routes when its addresses go:
// an IPv6 prefix has no anchor.
func RangeAnchor(p netip.Prefix) (netip.Addr, bool) {
	if !p.Addr().Is4() || !p.IsValid() {
		return netip.Addr{}, false
	}
	return p.Masked().Addr(), true
}

// Anchors returns the anchors of routes (RangeAnchor), as a set.
func Anchors(routes map[netip.Prefix]bool) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for p := range routes {
		if a, ok := RangeAnchor(p); ok {
			out[a] = true
		}
	}
	return out
}

func routed(routes map[netip.Prefix]bool, a netip.Addr) bool {
	for p := range routes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Assign decides who holds each virtual server that plans want, by
// Precedes, and lists the conflicts (sorted by virtual server, then
// loser). A virtual server on an excluded address is wanted as any other:
// --exclude-cidrs only keeps the unwanted ones from being cleaned up
// (Desired.Excluded).
func Assign(plans []*ServicePlan, own Ownership) (Desired, []Conflict) {
	d := Desired{VirtualServers: map[ktypes.VSKey]Want{}, Addresses: map[netip.Addr]bool{}, Routes: map[netip.Prefix]bool{},
		Excluded: own.ExcludeCIDRs}
	holder := map[ktypes.VSKey]*ServicePlan{}
	var conflicts []Conflict
	for _, p := range plans {
		for _, vs := range p.VirtualServers {
			if vs.Bound() {
				d.Addresses[vs.Address] = true
			}
			h, taken := holder[vs.VSKey]
			if taken && Precedes(h, p) {
				conflicts = append(conflicts, Conflict{VirtualServer: vs.VSKey, Holder: h.Service, Loser: p.Service})
				continue
			}
			if taken {
				conflicts = append(conflicts, Conflict{VirtualServer: vs.VSKey, Holder: p.Service, Loser: h.Service})
			}
			holder[vs.VSKey] = p
			d.VirtualServers[vs.VSKey] = Want{Service: p.Service, VSPlan: vs}
		}
	}
	// A holder displaced later in the loop left conflicts naming it as
	// holder: name the final one.
	for i := range conflicts {
		conflicts[i].Holder = holder[conflicts[i].VirtualServer].Service
	}
	slices.SortFunc(conflicts, func(a, b Conflict) int {
		if c := a.VirtualServer.Compare(b.VirtualServer); c != 0 {
			return c
		}
		return strings.Compare(a.Loser.String(), b.Loser.String())
	})
	return d, conflicts
}

// Kernel is a view of the part of the kernel that ipvs-proxy owns: its
// virtual servers, the real servers of those that were read, the
// addresses bound to its interface and the ranges routed as local through
// it. The reconciler keeps one current with its own writes; `ipvs-proxy
// status` reads one whole.
type Kernel struct {
	VirtualServers map[ktypes.VSKey]ktypes.VirtualServer
	// RealServers holds the destinations of the virtual servers that were
	// read; Diff reads it only for virtual servers in its scope.
	RealServers map[ktypes.VSKey][]ktypes.RealServer
	Bound       map[netip.Addr]bool
	Routes      map[netip.Prefix]bool
	perAddr     map[netip.Addr]int // virtual servers on each address
}

// Routed reports whether one of the kernel's routes holds a.
func (k *Kernel) Routed(a netip.Addr) bool { return routed(k.Routes, a) }

// NewKernel returns a view holding vss and bound (and no routes).
func NewKernel(vss []ktypes.VirtualServer, bound []netip.Addr) *Kernel {
	k := &Kernel{VirtualServers: make(map[ktypes.VSKey]ktypes.VirtualServer, len(vss)), RealServers: map[ktypes.VSKey][]ktypes.RealServer{},
		Bound: make(map[netip.Addr]bool, len(bound)), Routes: map[netip.Prefix]bool{}, perAddr: make(map[netip.Addr]int, len(vss))}
	for _, vs := range vss {
		k.PutVirtualServer(vs)
	}
	for _, a := range bound {
		k.Bound[a] = true
	}
	return k
}

// Reserve sizes the view for the n virtual servers and addresses a sync
// is about to write, when it holds none (a cold start), so that its tables
// do not grow, rehashing, as the writes are recorded.
func (k *Kernel) Reserve(n int) {
	if len(k.VirtualServers) > 0 || len(k.Bound) > 0 {
		return
	}
	k.VirtualServers = make(map[ktypes.VSKey]ktypes.VirtualServer, n)
	k.perAddr = make(map[netip.Addr]int, n)
	k.Bound = make(map[netip.Addr]bool, n)
}

// PutVirtualServer records a virtual server as added or updated.
func (k *Kernel) PutVirtualServer(vs ktypes.VirtualServer) {
	if _, ok := k.VirtualServers[vs.VSKey]; !ok {
		k.perAddr[vs.Address]++
	}
	k.VirtualServers[vs.VSKey] = vs
}

// DeleteVirtualServer records a virtual server as deleted.
func (k *Kernel) DeleteVirtualServer(key ktypes.VSKey) {
	if _, ok := k.VirtualServers[key]; !ok {
		return
	}
	delete(k.VirtualServers, key)
	delete(k.RealServers, key)
	if k.perAddr[key.Address]--; k.perAddr[key.Address] <= 0 {
		delete(k.perAddr, key.Address)
	}
}

// OnAddress counts the virtual servers on an address.
func (k *Kernel) OnAddress(a netip.Addr) int { return k.perAddr[a] }

// Scope limits a diff: All, or the listed virtual servers and addresses,
// and the routes when Routes (All includes them). Room, when not zero, is
// about how many operations the caller expects: Diff makes room for them
// instead of counting them first (one more look-up of every virtual
// server and address in want and have).
type Scope struct {
	All       bool
	Keys      []ktypes.VSKey
	Addresses []netip.Addr
	Routes    bool
	Room      int
}

// Diff returns the operations that make the kernel (have) hold want, within
// scope, in the order they must be applied: routes (a full scope only),
// binds, then each virtual server in key order (added or updated with its
// real servers, or deleted), then unbinds, then unroutes. An unwanted
// address is unbound only when no virtual server of the kernel's stays on
// it or a wanted route holds it (the virtual servers stay owned through
// the route); an unwanted route is deleted only when every virtual server
// of the kernel's that stays in it is on a bound address. A virtual server
// in have whose real servers were not read is treated as having none. A
// wanted real server marked Drain is never added: it is kept at weight 0
// while have counts connections on it, and deleted once it counts none
// (see Draining); so is a TCP real server the plan no longer has
// (keptWhileBusy). Ordered virtual servers (sh, dh, mh) keep neither, and
// their real servers in one order (diffOrdered).
func Diff(want Desired, have *Kernel, scope Scope) []ktypes.Op {
	keys, addrs := scope.Keys, scope.Addresses
	if scope.All {
		keys = make([]ktypes.VSKey, 0, len(want.VirtualServers)+len(have.VirtualServers))
		for k := range want.VirtualServers {
			keys = append(keys, k)
		}
		for k := range have.VirtualServers {
			if _, ok := want.VirtualServers[k]; !ok {
				keys = append(keys, k)
			}
		}
		addrs = make([]netip.Addr, 0, len(want.Addresses)+len(have.Bound))
		for a := range want.Addresses {
			addrs = append(addrs, a)
		}
		for a := range have.Bound {
			if !want.Addresses[a] {
				addrs = append(addrs, a)
			}
		}
	}
	keys = slices.Clone(keys)
	slices.SortFunc(keys, ktypes.VSKey.Compare)
	keys = slices.Compact(keys)
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)

	var routes, unroutes []netip.Prefix
	if scope.All || scope.Routes {
		for _, p := range sortedPrefixes(want.Routes) {
			if !have.Routes[p] {
				routes = append(routes, p)
			}
		}
		for _, p := range sortedPrefixes(have.Routes) {
			if !want.Routes[p] {
				unroutes = append(unroutes, p)
			}
		}
	}
	// Sized for the caller's Room, else for what is surely written:
	// routes, binds, and the virtual servers missing from the kernel with
	// their real servers (a cold sync's 10,000s of ops, which append
	// would copy as they grow: one op more than the room, the route of a
	// routed cold sync, copied all 30,000 of 10,000 Services into a new
	// array at the end, 10 MB alive beside the old 8).
	n := scope.Room
	if n == 0 {
		n = opsAtLeast(want, have, keys, addrs) + len(routes) + len(unroutes)
	}
	var ops []ktypes.Op
	if n > 0 {
		ops = make([]ktypes.Op, 0, n)
	}
	for _, p := range routes {
		ops = append(ops, ktypes.Op{Kind: ktypes.OpRoute, Prefix: p})
	}
	for _, a := range addrs {
		if want.Addresses[a] && !have.Bound[a] {
			ops = append(ops, ktypes.Op{Kind: ktypes.OpBind, Address: a})
		}
	}
	deleted := map[netip.Addr]int{}
	for _, k := range keys {
		w, wanted := want.VirtualServers[k]
		cur, inKernel := have.VirtualServers[k]
		switch {
		case wanted:
			ops = diffVirtualServer(ops, w, cur, inKernel, have.RealServers[k])
		case inKernel && !InRanges(want.Excluded, k.Address):
			ops = append(ops, ktypes.Op{Kind: ktypes.OpDeleteVirtualServer, VirtualServer: cur})
			deleted[k.Address]++
		}
	}
	for _, a := range addrs {
		if !want.Addresses[a] && have.Bound[a] && !InRanges(want.Excluded, a) && (have.OnAddress(a) == deleted[a] || want.Routed(a)) {
			ops = append(ops, ktypes.Op{Kind: ktypes.OpUnbind, Address: a})
		}
	}
	for _, p := range unroutes {
		if !strandedIn(p, want, have, deleted) {
			ops = append(ops, ktypes.Op{Kind: ktypes.OpUnroute, Prefix: p})
		}
	}
	return ops
}

// opsAtLeast counts the operations Diff surely makes for keys and addrs:
// binds, and the virtual servers missing from have with their real
// servers.
func opsAtLeast(want Desired, have *Kernel, keys []ktypes.VSKey, addrs []netip.Addr) int {
	n := 0
	for _, a := range addrs {
		if want.Addresses[a] && !have.Bound[a] {
			n++
		}
	}
	for _, k := range keys {
		if w, wanted := want.VirtualServers[k]; wanted {
			if _, inKernel := have.VirtualServers[k]; !inKernel {
				n += 1 + len(w.RealServers)
			}
		}
	}
	return n
}

// strandedIn reports whether a virtual server of the kernel that is not
// deleted stays in p on an address that will not be bound: deleting the
// route would leave it unowned.
func strandedIn(p netip.Prefix, want Desired, have *Kernel, deleted map[netip.Addr]int) bool {
	for k := range have.VirtualServers {
		a := k.Address
		if p.Contains(a) && have.OnAddress(a) > deleted[a] && !want.Addresses[a] && !have.Bound[a] {
			return true
		}
	}
	return false
}

func sortedPrefixes(m map[netip.Prefix]bool) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// diffVirtualServer appends the operations for one wanted virtual server.
func diffVirtualServer(ops []ktypes.Op, w Want, cur ktypes.VirtualServer, inKernel bool, rss []ktypes.RealServer) []ktypes.Op {
	vs := w.VirtualServer
	switch {
	case !inKernel:
		ops = append(ops, ktypes.Op{Kind: ktypes.OpAddVirtualServer, Service: w.Service, VirtualServer: vs})
		rss = nil
	case !cur.Equal(vs):
		ops = append(ops, ktypes.Op{Kind: ktypes.OpUpdateVirtualServer, Service: w.Service, VirtualServer: vs, WasVirtualServer: cur})
	}
	if vs.Ordered() {
		return diffOrdered(ops, w, rss, inKernel && cur.Scheduler == "mh")
	}
	have := make(map[ktypes.RSKey]ktypes.RealServer, len(rss))
	for _, rs := range rss {
		have[rs.RSKey] = rs
	}
	for _, rs := range w.RealServers {
		old, ok := have[rs.RSKey]
		if rs.Drain && (!ok || !old.Busy()) {
			continue // never added; deleted (left in have) once idle
		}
		delete(have, rs.RSKey)
		switch {
		case !ok:
			ops = append(ops, ktypes.Op{Kind: ktypes.OpAddRealServer, Service: w.Service, VirtualServer: vs, RealServer: rs})
		case old.Weight != rs.Weight || !old.SameForward(rs):
			ops = append(ops, updateRS(w, rs, old))
		}
	}
	gone := make([]ktypes.RealServer, 0, len(have))
	for _, rs := range have {
		gone = append(gone, rs)
	}
	slices.SortFunc(gone, func(a, b ktypes.RealServer) int { return a.RSKey.Compare(b.RSKey) })
	for _, rs := range gone {
		if keptWhileBusy(vs, rs) {
			if rs.Weight != 0 {
				ops = append(ops, updateRS(w, drained(rs), rs))
			}
			continue
		}
		ops = append(ops, ktypes.Op{Kind: ktypes.OpDeleteRealServer, Service: w.Service, VirtualServer: vs, RealServer: rs})
	}
	return ops
}

// updateRS is the in-place update of a real server of the kernel (old) to
// rs: its weight, its forwarding method, or both.
func updateRS(w Want, rs, old ktypes.RealServer) ktypes.Op {
	return ktypes.Op{Kind: ktypes.OpUpdateRealServer, Service: w.Service, VirtualServer: w.VirtualServer, RealServer: rs,
		WasWeight: old.Weight, WasForward: old.Forward, WasTunPort: old.TunPort}
}

// drained is a real server of the kernel at weight 0, kept while busy. It
// keeps its tunnel: a connection keeps its method, but a tunnel's type and
// port are read from the real server at each packet (ip_vs_tunnel_xmit),
// so rewriting them would move the connections to another encapsulation.
// A method ipvs-proxy does not write becomes NAT (new connections only,
// and there are none at weight 0).
func drained(rs ktypes.RealServer) ktypes.RealServer {
	out := ktypes.RealServer{RSKey: rs.RSKey}
	if rs.Forward <= ktypes.ForwardGUE {
		out.Forward, out.TunPort = rs.Forward, rs.TunPort
	}
	return out
}

// keptWhileBusy reports whether a real server of the kernel that the plan
// no longer has (its endpoint left every slice of the Service: relabelled
// out of the selector, the selector changed, a port renamed, the pod
// deleted) is kept at weight 0 instead of deleted: a TCP one that IPVS
// counts connections on, so that they end on their own terms as in
// kube-proxy's IPVS mode (deleting it would cut them at their next packet,
// expire_nodest_conn=1). It lasts as long as IPVS counts them: their end,
// or IPVS's idle timeout (--ipvs-tcp-timeout, the kernel's 15 minutes by
// default), or the virtual server's deletion. UDP and SCTP real servers go
// at once (kube-proxy's rule; their flows are scheduled afresh).
func keptWhileBusy(vs ktypes.VirtualServer, rs ktypes.RealServer) bool {
	return vs.Protocol == ktypes.TCP && rs.Busy() && !vs.Ordered()
}

// Draining reports whether the kernel's real servers (rss) of a wanted
// virtual server include a busy one that w marks Drain or no longer has
// (keptWhileBusy): Diff keeps it, and it must be looked at again until its
// connections end.
func Draining(w VSPlan, rss []ktypes.RealServer) bool {
	// Every sync's scope passes here: a binary search of the plan's real
	// servers (sorted, VSPlan.RealServers) per busy one, no allocation.
	for _, r := range rss {
		if !r.Busy() {
			continue
		}
		i, planned := slices.BinarySearchFunc(w.RealServers, r.RSKey, func(rs ktypes.RealServer, k ktypes.RSKey) int {
			return rs.RSKey.Compare(k)
		})
		if (planned && w.RealServers[i].Drain && !w.VirtualServer.Ordered()) || (!planned && keptWhileBusy(w.VirtualServer, r)) {
			return true
		}
	}
	return false
}
