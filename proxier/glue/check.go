package glue

import (
	"context"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
)

// The periodic full sync's reads run off the sync loop. Reading every set
// (one dump each, a few seconds per 10,000 entries under emulation) and
// the rules (iptables-save) is most of a full sync's time, and a change
// that arrived meanwhile would wait for it. So a periodic full sync starts
// a check: a goroutine reads the sets and the rules and hands them to the
// loop (and asks it for a sync); the loop's syncs go on meanwhile, and the
// first one after the read repairs the drift the read shows. A set entry
// written by the loop since the read began is taken from the glue's view,
// not from the read, which may show it before or after that write
// (ipset.Syncer.SyncRead); the rules are written only by the loop's full
// syncs and checks, so a read of them stays true until the check applies.
// The glue's state is the loop's alone: the goroutine reads the kernel
// and nothing else of the glue.

var _ consumer.BackgroundConsumer = (*Glue)(nil)

// checkResult is what a check read.
type checkResult struct {
	sets  map[setID]setRead
	saved map[ipset.Family]savedRead
	// setRead and rulesRead are the reads' times.
	setRead, rulesRead time.Duration
}

type setRead struct {
	set ipset.Set
	err error
}

type savedRead struct {
	saved Saved
	err   error
}

// SetWake implements consumer.BackgroundConsumer: wake asks the sync loop
// for a sync. Call it before the first Sync.
func (g *Glue) SetWake(wake func()) { g.wake = wake }

// Pending implements consumer.BackgroundConsumer: a check's read is done
// and waits for a sync to apply it.
func (g *Glue) Pending() bool { return g.check.Done() }

// startCheck starts reading the served families' sets and rules off the
// loop; from now on the Syncer records what the loop writes to the sets.
func (g *Glue) startCheck() {
	ids := setIDs(g.cfg.IPv4, g.cfg.IPv6)
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = id.name()
	}
	g.syncer.Track(names...)
	sets, clk := g.sets, g.clock
	ipt := map[ipset.Family]*IPTables{}
	for _, fam := range g.families() {
		ipt[fam] = g.ipt[fam] // nil: syncRules reports the missing tools
	}
	g.check.Start(func() checkResult {
		res := checkResult{sets: map[setID]setRead{}, saved: map[ipset.Family]savedRead{}}
		start := clk.Now()
		for _, id := range ids {
			s, err := sets.List(id.name())
			res.sets[id] = setRead{s, err}
		}
		res.setRead = clk.Since(start)
		for fam, t := range ipt {
			if t != nil {
				saved, err := t.Save(context.Background())
				res.saved[fam] = savedRead{saved, err}
			}
		}
		res.rulesRead = clk.Since(start) - res.setRead
		return res
	}, g.wake)
}

// applyCheck repairs what a finished check found, if one is there and
// still wanted (a full sync in the loop since makes it stale).
func (g *Glue) applyCheck(st *Stats) []error {
	res, took, ok := g.check.Take()
	if !ok {
		return nil
	}
	st.Checked = true
	st.CheckSetRead, st.CheckRulesRead, st.CheckTook = res.setRead, res.rulesRead, took
	var errs []error
	added, deleted := st.Added, st.Deleted
	for _, id := range setIDs(g.cfg.IPv4, g.cfg.IPv6) {
		r := res.sets[id]
		s, err := g.syncer.SyncRead(g.specOf(id), g.refs[id], r.set, r.err)
		st.add(s)
		if err := g.afterSetSync(id, err); err != nil {
			errs = append(errs, err)
		}
	}
	st.CheckAdded, st.CheckDeleted = st.Added-added, st.Deleted-deleted
	rulesStart := g.clock.Now()
	n, err := g.syncRules(false, res.saved)
	st.RulesTime += g.clock.Since(rulesStart)
	st.Restores += n
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}
