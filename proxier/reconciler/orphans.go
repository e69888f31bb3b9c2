package reconciler

// The failed writes that no Service answers for.

import (
	"net/netip"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// orphans are the writes no Service is answerable for (a virtual server
// no Service wants, an address to unbind) that failed: retried with one
// backoff.
type orphans struct {
	Backoff
	keys  map[ktypes.VSKey]bool
	addrs map[netip.Addr]bool
}

func newOrphans() orphans {
	return orphans{keys: map[ktypes.VSKey]bool{}, addrs: map[netip.Addr]bool{}}
}

// add records a failed write no Service answers for: a virtual server no
// Service wants, an address to bind or unbind.
func (o *orphans) add(op ktypes.Op) {
	if op.Kind == ktypes.OpUnbind || op.Kind == ktypes.OpBind {
		o.addrs[op.Address] = true
	} else {
		o.keys[op.VirtualServer.VSKey] = true
	}
}

// takeInto moves the failed writes into a sync's scope.
func (o *orphans) takeInto(sc *scopeSet) {
	for k := range o.keys {
		sc.keys[k] = true
	}
	for a := range o.addrs {
		sc.addrs[a] = true
	}
	o.clear()
}

// clear forgets the failed writes (a full sync looks at everything).
func (o *orphans) clear() {
	o.keys = emptied(o.keys)
	o.addrs = emptied(o.addrs)
}

// settle schedules the retry after a sync in which some failed, or resets
// the backoff when nothing is left to retry.
func (o *orphans) settle(failed bool, now time.Time, base, maxDelay time.Duration) {
	switch {
	case failed:
		o.Fail(now, base, maxDelay)
	case len(o.keys) == 0 && len(o.addrs) == 0:
		o.Backoff = Backoff{}
	}
}
