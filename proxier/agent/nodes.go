package agent

// Nodes: the agent watches every Node, kept compact (model.Node: about 200
// bytes each). Its own Node gives the zone, whether it is leaving and its
// podCIDRs; every Node's addresses are kept from Services
// (model.BuildConfig.OtherNodes) and from the Service ranges routed as
// local (saneRanges).

import (
	"net/netip"
	"slices"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// nodeOf is the Node an informer delivered (model.Compact made it, or
// makes it here); a tombstone holds the last one the cache had, or only
// its key (then the Node has only its name).
func nodeOf(obj any) (*model.Node, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if d.Obj == nil {
			return &model.Node{Name: d.Key}, d.Key != ""
		}
		obj = d.Obj
	}
	obj, _ = model.Compact(obj)
	n, ok := obj.(*model.Node)
	return n, ok && n != nil
}

func (t *tracker) onNode(obj any, deleted bool) {
	n, ok := nodeOf(obj)
	if !ok {
		return
	}
	if n.Name == t.nodeName {
		t.onOwnNode(n, deleted)
		return
	}
	t.onOtherNode(n, deleted)
}

// onOwnNode takes this node's facts: a change of its zone rebuilds every
// plan; a change of its addresses rechecks the Service ranges.
func (t *tracker) onOwnNode(n *model.Node, deleted bool) {
	var addrs []netip.Addr
	if !deleted {
		addrs = n.Addresses
	}
	t.mu.Lock()
	t.node.eligible = !deleted && !n.Leaving
	t.node.podCIDRs = n.PodCIDRs
	zoneChanged := n.Zone != t.node.zone
	t.node.zone = n.Zone
	addrsChanged := !slices.Equal(addrs, t.node.objAddrs)
	t.node.objAddrs = addrs
	t.nodes.stale = t.nodes.stale || addrsChanged
	if zoneChanged {
		t.rebuild = true
		t.queuedLocked()
	}
	t.mu.Unlock()
	if zoneChanged || addrsChanged {
		t.wake()
	}
}

// onOtherNode takes another Node's addresses: the Services that name an
// address it gained or lost as an externalIP or LoadBalancer IP are built
// again (model.BuildConfig.OtherNodes), and the Service ranges rechecked.
func (t *tracker) onOtherNode(n *model.Node, deleted bool) {
	var addrs []netip.Addr
	if !deleted {
		addrs = n.Addresses
	}
	t.mu.Lock()
	old := t.nodes.byName[n.Name]
	if slices.Equal(old, addrs) {
		t.mu.Unlock()
		return
	}
	if len(addrs) == 0 {
		delete(t.nodes.byName, n.Name)
	} else {
		t.nodes.byName[n.Name] = addrs
	}
	t.nodes.stale = true
	var dirty []types.NamespacedName
	if !t.rebuild { // a rebuild builds them all anyway (the initial list)
		moved := map[netip.Addr]bool{}
		for _, a := range symmetricDifference(old, addrs) {
			moved[a] = true
		}
		for name, svc := range t.services {
			if model.UsesExternalAddress(svc, moved) {
				dirty = append(dirty, name)
			}
		}
	}
	t.mu.Unlock()
	now := t.clock.Now()
	for _, name := range dirty {
		t.markDirty(name, now)
	}
	t.wake()
}

// symmetricDifference is the addresses in a or b but not both.
func symmetricDifference(a, b []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	return out
}

// nodeAddrs are every Node's addresses as the informer delivered them:
// the other Nodes' by name, and the map the plans read
// (model.BuildConfig.OtherNodes), made again when stale.
type nodeAddrs struct {
	byName map[string][]netip.Addr
	// others maps each other Node's address to its name; it is never
	// changed once made (a sync's plans hold it), only replaced.
	others map[netip.Addr]string
	stale  bool
}

// othersLocked is the map of the other Nodes' addresses, made again if
// stale; t.mu is held. It reports whether it was made again.
func (t *tracker) othersLocked() (map[netip.Addr]string, bool) {
	if !t.nodes.stale {
		return t.nodes.others, false
	}
	others := othersOf(t.nodes.byName)
	t.nodes.others, t.nodes.stale = others, false
	return others, true
}

// othersOf maps each address of the Nodes (by name) to its Node's name.
func othersOf(byName map[string][]netip.Addr) map[netip.Addr]string {
	others := make(map[netip.Addr]string, 2*len(byName))
	for name, addrs := range byName {
		for _, a := range addrs {
			if old, ok := others[a]; !ok || name < old { // one name, whatever the map's order
				others[a] = name
			}
		}
	}
	return others
}

// NodeFacts is what run reads of the Nodes, for `ipvs-proxy status`: this
// node's Node (nil when missing) and the other Nodes' addresses
// (model.BuildConfig.OtherNodes).
func NodeFacts(nodes []*model.Node, self string) (own *model.Node, others map[netip.Addr]string) {
	byName := map[string][]netip.Addr{}
	for _, n := range nodes {
		if n.Name == self {
			own = n
		} else if len(n.Addresses) > 0 {
			byName[n.Name] = n.Addresses
		}
	}
	return own, othersOf(byName)
}

// SaneRanges keeps the Service ranges that run routes as local: those
// that hold none of the node's own addresses (nodeAddrs, the kernel's and
// its Node's) nor another Node's (others).
func SaneRanges(ranges []netip.Prefix, nodeAddrs []netip.Addr, others map[netip.Addr]string) []netip.Prefix {
	addrs := slices.Clone(nodeAddrs)
	for a := range others {
		addrs = append(addrs, a)
	}
	keep, _ := saneRanges(ranges, addrs)
	return keep
}

// refusedRange is a Service range not routed as local because it holds an
// address of a Node (saneRanges); source is the object that asked for it
// (a ServiceCIDR), nil when the configuration named it.
type refusedRange struct {
	prefix netip.Prefix
	addr   netip.Addr
	source *corev1.ObjectReference
}

// saneRanges splits the Service ranges into those that may be routed as
// local and those that hold one of addrs (the node's own addresses and
// every Node's): routed as local, such a range would take the node's
// traffic to that address (its own address, a neighbour's: the node
// network) into the node, and partition it.
func saneRanges(ranges []netip.Prefix, addrs []netip.Addr) (keep []netip.Prefix, refused []refusedRange) {
	for _, p := range ranges {
		i := slices.IndexFunc(addrs, p.Contains)
		if i < 0 {
			keep = append(keep, p)
			continue
		}
		refused = append(refused, refusedRange{prefix: p, addr: addrs[i]})
	}
	return keep, refused
}

// rangesLocked is the Service ranges a sync routes, checked against every
// Node's address when the ranges or the addresses changed (recheck); t.mu
// is held. It reports whether they changed since the last sync (a change
// rebuilds every plan) and the ranges newly refused.
func (t *tracker) rangesLocked(recheck bool) (ranges []netip.Prefix, changed bool, refused []refusedRange) {
	r := &t.ranges
	if !r.changed && !recheck {
		return r.routed, false, nil
	}
	addrs := slices.Concat(t.node.all, t.node.objAddrs)
	for a := range t.nodes.others {
		addrs = append(addrs, a)
	}
	keep, out := saneRanges(r.prefixes, addrs) // SaneRanges, with what was refused
	changed = r.changed || !slices.Equal(keep, r.routed)
	for _, x := range out {
		if !slices.ContainsFunc(r.refused, func(y refusedRange) bool { return y.prefix == x.prefix }) {
			x.source = r.sources[x.prefix]
			refused = append(refused, x)
		}
	}
	r.routed, r.refused, r.changed = keep, out, false
	if changed {
		t.rebuild = true
	}
	return keep, changed, refused
}

// reportRefusedRanges logs each range newly refused and raises a Warning
// Event on the ServiceCIDR that asked for it, or on this Node when the
// configuration named it.
func (r *reporter) refusedRanges(node string, refused []refusedRange) {
	for _, x := range refused {
		r.log.Warn("Service range holds a node's address: not routed as local (the node would take that address's traffic); its clusterIPs are bound one by one",
			zap.Stringer("range", x.prefix), zap.Stringer("address", x.addr))
		if r.recorder == nil {
			continue
		}
		ref := x.source
		if ref == nil {
			ref = model.NodeRef(node)
		}
		r.recorder.Eventf(ref, corev1.EventTypeWarning, "ServiceRangeNotRouted",
			"Service range %s holds the node address %s: not routed as local on node %s (it would take that address's traffic); its clusterIPs are bound one by one",
			x.prefix, x.addr, node)
	}
}
