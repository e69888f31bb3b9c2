package proxier

// The real servers kept only while busy (model.RealServer.Drain): read
// again every DrainCheck until their connections end.

import (
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// defaultDrainCheck is ReconcilerConfig.DrainCheck's default.
const defaultDrainCheck = 2 * time.Second

// drainDue reports whether the check of the draining real servers is due.
func (r *Reconciler) drainDue(now time.Time) bool {
	return !r.drainNext.IsZero() && !now.Before(r.drainNext)
}

// noteDraining records which virtual servers in a sync's scope keep a busy
// real server marked Drain (by the kernel's real servers just read), and
// schedules their next check: the sync at DrainCheck from now reads them
// again, and the diff deletes each real server whose connections ended.
func (r *Reconciler) noteDraining(keys []model.VSKey, want model.Desired, now time.Time) {
	for _, k := range keys {
		if w, ok := want.VirtualServers[k]; ok && model.Draining(w.VSPlan, r.kernel.RealServers[k]) {
			r.draining[k] = true
		} else {
			delete(r.draining, k)
		}
	}
	switch {
	case len(r.draining) == 0:
		r.draining = emptied(r.draining)
		r.drainNext = time.Time{}
	case r.drainNext.IsZero():
		r.drainNext = now.Add(r.cfg.DrainCheck)
	}
}
