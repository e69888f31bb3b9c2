package model

import (
	"slices"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Real servers of an Ordered virtual server (sh, dh, mh): the kernel builds
// the scheduler's table by walking the real-server list, and it puts a new
// real server at the list's head, so two nodes with the same endpoints but
// another history (an agent restart, a reboot, endpoints that came in
// another order) would map one client to different endpoints. Every node
// keeps the list in one order derived from the endpoint set alone, the
// canonical order: ascending by address and port from the head (a plan's
// real servers are sorted so). IPVS has no call that reorders a list; a real
// server is moved to the head by deleting it and adding it again at once
// (the kernel revives the same destination from its trash, so its
// connections go on).
//
// The set, too, is the slices' alone: an endpoint that no longer serves
// (Drain) and one that left the slices leave the list at once, on every
// node, even with connections (kept while busy, they would stay on the
// nodes that count connections and not on the others). A terminating
// endpoint that still serves stays at weight 0 on every node until it
// stops serving (for mh with the slots of its serving weight, see
// appendOrderedAdd).

// diffOrdered appends the operations that make the kernel's list of an
// Ordered virtual server (rss, in the kernel's order, head first) hold the
// plan's serving real servers in canonical order: deletes of the unwanted,
// weight updates of those that stay in place, then, from the last to the
// first, adds and moves of the canonical order's head part that is not
// already in place. The part kept in place is the longest tail of the
// canonical order that the list holds in that order, so an endpoint whose
// key sorts first costs one add, and one that sorts last moves every real
// server ahead of it.
//
// wasMH says whether the kernel's virtual server had mh already: one that
// did not (a scheduler changed to mh) may hold draining real servers
// added at weight 0, without mh's slots, so they are moved too.
func diffOrdered(ops []ktypes.Op, w Want, rss []ktypes.RealServer, wasMH bool) []ktypes.Op {
	vs := w.VirtualServer
	want := make([]ktypes.RealServer, 0, len(w.RealServers))
	for _, rs := range w.RealServers {
		if !rs.Drain {
			want = append(want, rs)
		}
	}
	pos := make(map[ktypes.RSKey]int, len(rss)) // in the list, and may stay in place
	weight := make(map[ktypes.RSKey]int32, len(rss))
	have := make(map[ktypes.RSKey]ktypes.RealServer, len(rss))
	for _, rs := range rss {
		i, ok := slices.BinarySearchFunc(want, rs.RSKey, func(rs ktypes.RealServer, k ktypes.RSKey) int { return rs.RSKey.Compare(k) })
		if !ok {
			ops = append(ops, ktypes.Op{Kind: ktypes.OpDeleteRealServer, Service: w.Service, VirtualServer: vs, RealServer: rs})
			continue
		}
		weight[rs.RSKey], have[rs.RSKey] = rs.Weight, rs
		if vs.Scheduler == "mh" && !wasMH && want[i].Weight == 0 {
			continue
		}
		pos[rs.RSKey] = len(pos)
	}
	k := inPlace(want, pos)
	for _, rs := range want[k:] {
		if old := have[rs.RSKey]; old.Weight != rs.Weight || !old.SameForward(rs) {
			ops = append(ops, updateRS(w, rs, old))
		}
	}
	for i := k - 1; i >= 0; i-- {
		rs := want[i]
		_, move := weight[rs.RSKey]
		if move {
			ops = append(ops, ktypes.Op{Kind: ktypes.OpDeleteRealServer, Service: w.Service, VirtualServer: vs,
				RealServer: ktypes.RealServer{RSKey: rs.RSKey, Weight: weight[rs.RSKey]}, Move: true})
		}
		ops = appendOrderedAdd(ops, w, rs, move)
	}
	return ops
}

// servingWeight is the weight of a real server whose endpoint serves.
const servingWeight = 1

// appendOrderedAdd appends the add (or a move's add) of rs. mh builds its
// table from a real server's last weight that was not 0 (last_weight):
// one set to weight 0 keeps its slots, one added at weight 0 has none. So
// that a draining real server holds its slots on every node, whether it
// drained there or was added (a restarted agent, a move) while draining,
// it is added at the serving weight and set to 0 at once.
func appendOrderedAdd(ops []ktypes.Op, w Want, rs ktypes.RealServer, move bool) []ktypes.Op {
	add := ktypes.Op{Kind: ktypes.OpAddRealServer, Service: w.Service, VirtualServer: w.VirtualServer, RealServer: rs, Move: move}
	if w.Scheduler != "mh" || rs.Weight != 0 {
		return append(ops, add)
	}
	add.RealServer.Weight = servingWeight
	return append(ops, add, updateRS(w, rs, add.RealServer))
}

// inPlace returns the index in want (canonical order) from which every
// real server is in the list (pos: its index among the kept ones) and in
// canonical order, so it can stay where it is.
func inPlace(want []ktypes.RealServer, pos map[ktypes.RSKey]int) int {
	k, next := len(want), len(pos)
	for k > 0 {
		p, ok := pos[want[k-1].RSKey]
		if !ok || p >= next {
			break
		}
		k, next = k-1, p
	}
	return k
}
