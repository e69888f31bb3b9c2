package agent

// The bound on how many changed Services one sync takes.

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

const (
	// batchAim is how long a sync that carries changes should take: the
	// most a change that arrives during one waits for it to end. On a
	// node whose CPU goes elsewhere a write costs 100 times its idle cost
	// (issue 45, case 7: 126 ms): a sync of every change then took 40-90
	// s, the changes that came meanwhile waited for all of it, and the
	// loop's liveness limit (90 s) was within reach.
	batchAim = 5 * time.Second
	// batchFloor is the fewest Services a bounded sync takes: below it a
	// sync's fixed costs (the glue's, the kernel's addresses) dominate,
	// and a small sync says little of the cost per Service.
	batchFloor = 8
	// batchOverdue is how long a change waits before it goes first
	// beside the UDP Services'.
	batchOverdue = 6 * batchAim
	// batchWeight is the weight of the newest observed sync in the cost
	// per Service (an exponential average).
	batchWeight = 0.5
)

// syncBatch bounds the changed Services a sync takes from what the recent
// syncs cost per Service: as many as batchAim allows, at least batchFloor.
// On a node with CPU to spare the bound is above any backlog (5 ms a
// Service at 10,000: 1,000 a sync) and changes go whole, as before; on a
// starved one the backlog goes in syncs of about batchAim, UDP Services
// and the oldest changes first (pickBatch).
type syncBatch struct {
	perService time.Duration // zero: no sync observed yet, no bound
}

// limit is the most changed Services the next sync takes; 0: no bound.
func (b *syncBatch) limit() int {
	if b.perService <= 0 {
		return 0
	}
	return max(int(batchAim/b.perService), batchFloor)
}

// observe takes a partial sync's time (its build and IPVS writes) and its
// number of changed Services. Syncs of fewer than batchFloor say little (their fixed costs)
// and are not taken.
func (b *syncBatch) observe(took time.Duration, services int) {
	if services < batchFloor || took <= 0 {
		return
	}
	per := took / time.Duration(services)
	if b.perService <= 0 {
		b.perService = per
		return
	}
	b.perService = time.Duration(batchWeight*float64(per) + (1-batchWeight)*float64(b.perService))
}

// pickBatch returns the names of dirty to sync now, at most limit (0: all):
// the Services with a UDP port first (a UDP client stays on a gone
// backend until its real server and conntrack entries go: it gets no
// reset, as the reconciler's udpLosses says), and with them any change
// older than batchOverdue at now (so that UDP churn cannot hold the others
// back for ever), then the oldest changes; ties by name.
func pickBatch(dirty map[types.NamespacedName]time.Time, services map[types.NamespacedName]*model.Service, limit int, now time.Time) []types.NamespacedName {
	names := make([]types.NamespacedName, 0, len(dirty))
	for n := range dirty {
		names = append(names, n)
	}
	if limit <= 0 || len(names) <= limit {
		return names
	}
	first := func(n types.NamespacedName) int {
		if hasUDP(services[n]) || now.Sub(dirty[n]) > batchOverdue {
			return 0
		}
		return 1
	}
	slices.SortFunc(names, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(first(a), first(b)), dirty[a].Compare(dirty[b]),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return names[:limit]
}

// hasUDP reports whether s (nil: removed) has a UDP port.
func hasUDP(s *model.Service) bool {
	return s != nil && slices.ContainsFunc(s.Spec.Ports, func(p model.ServicePort) bool { return p.Protocol == corev1.ProtocolUDP })
}
