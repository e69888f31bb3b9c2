package reconciler

// The real servers kept only while busy (ktypes.RealServer.Drain, and TCP
// ones the plan no longer has; model.Draining): read again every
// DrainCheck until their connections end.

import (
	"maps"
	"slices"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// defaultDrainCheck is Config.DrainCheck's default.
const defaultDrainCheck = 2 * time.Second

// drains are the virtual servers that keep a busy real server only while
// it is busy (model.Draining), and when they are read again (zero: no
// check is scheduled).
type drains struct {
	keys map[ktypes.VSKey]bool
	next time.Time
}

// due reports whether the check of the draining real servers is due.
func (d *drains) due(now time.Time) bool { return !d.next.IsZero() && !now.Before(d.next) }

// takeInto puts every draining virtual server into a sync's scope; the
// next check is scheduled after that sync (note).
func (d *drains) takeInto(sc *scopeSet) {
	for _, k := range d.take() {
		sc.keys[k] = true
	}
}

// take lists every draining virtual server for a sync's scope, as
// takeInto.
func (d *drains) take() []ktypes.VSKey {
	d.next = time.Time{}
	return slices.Collect(maps.Keys(d.keys))
}

// note records which virtual servers in a sync's scope keep a busy real
// server only while busy (by the kernel's real servers just read, have), and
// schedules their next check: the sync at check from now reads them again,
// and the diff deletes each real server whose connections ended.
func (d *drains) note(keys []ktypes.VSKey, want model.Desired, have map[ktypes.VSKey][]ktypes.RealServer, now time.Time, check time.Duration) {
	for _, k := range keys {
		if w, ok := want.VirtualServers[k]; ok && model.Draining(w.VSPlan, have[k]) {
			d.keys[k] = true
		} else {
			delete(d.keys, k)
		}
	}
	switch {
	case len(d.keys) == 0:
		d.keys = emptied(d.keys)
		d.next = time.Time{}
	case d.next.IsZero():
		d.next = now.Add(check)
	}
}
