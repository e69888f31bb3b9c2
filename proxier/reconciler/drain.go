package reconciler

// The real servers kept only while busy (ktypes.RealServer.Drain): read
// again every DrainCheck until their connections end.

import (
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// defaultDrainCheck is ReconcilerConfig.DrainCheck's default.
const defaultDrainCheck = 2 * time.Second

// drains are the virtual servers that keep a busy real server marked
// Drain, and when they are read again (zero: no check is scheduled).
type drains struct {
	keys map[ktypes.VSKey]bool
	next time.Time
}

// drainDue reports whether the check of the draining real servers is due.
func (r *Reconciler) drainDue(now time.Time) bool {
	return !r.draining.next.IsZero() && !now.Before(r.draining.next)
}

// noteDraining records which virtual servers in a sync's scope keep a busy
// real server marked Drain (by the kernel's real servers just read), and
// schedules their next check: the sync at DrainCheck from now reads them
// again, and the diff deletes each real server whose connections ended.
func (r *Reconciler) noteDraining(keys []ktypes.VSKey, want model.Desired, now time.Time) {
	for _, k := range keys {
		if w, ok := want.VirtualServers[k]; ok && model.Draining(w.VSPlan, r.kernel.RealServers[k]) {
			r.draining.keys[k] = true
		} else {
			delete(r.draining.keys, k)
		}
	}
	switch {
	case len(r.draining.keys) == 0:
		r.draining.keys = emptied(r.draining.keys)
		r.draining.next = time.Time{}
	case r.draining.next.IsZero():
		r.draining.next = now.Add(r.cfg.DrainCheck)
	}
}
