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

var _ consumer.Yielder = (*Glue)(nil)

// checkReadTimeout bounds a check's iptables-save, in place of the loop's
// toolTimeout: the read holds nothing up and runs at a lower priority
// (Config.Background), so on a starved node it is slow, not stuck. Killed
// at a minute (issue 45, case 7 at 5,000 Services: ip6tables-nft-save),
// the check failed and its fallback, a full sync in the loop, held the
// loop 49 s with changes waiting.
const checkReadTimeout = 5 * time.Minute

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
// and waits for a sync to apply it, or its repair is under way.
func (g *Glue) Pending() bool { return g.check.Done() || g.repair != nil }

// Yield implements consumer.Yielder: the next Sync leaves a finished
// check's repair to the one after, unless the last Sync yielded too.
func (g *Glue) Yield() { g.yield = !g.yielded }

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
	g.check.Start(g.cfg.Background, func() checkResult {
		res := checkResult{sets: map[setID]setRead{}, saved: map[ipset.Family]savedRead{}}
		start := clk.Now()
		for _, id := range ids {
			s, err := sets.List(id.name())
			res.sets[id] = setRead{s, err}
		}
		res.setRead = clk.Since(start)
		for fam, t := range ipt {
			if t != nil {
				saved, err := t.SaveWithin(context.Background(), checkReadTimeout)
				res.saved[fam] = savedRead{saved, err}
			}
		}
		res.rulesRead = clk.Since(start) - res.setRead
		return res
	}, g.wake)
}

// checkRepair is a finished check being applied, a few sets a sync: the
// sets still to repair (still tracked by the Syncer), and what the
// repair did so far.
type checkRepair struct {
	res            checkResult
	took           time.Duration
	left           []setID
	added, deleted int
	rebuilt        int
}

// defaultRepairEntries is about how many entries read a sync repairs: a
// set is never split, so a sync repairs at least one.
const defaultRepairEntries = 4096

// applyCheck repairs what a finished check found, if one is there and
// still wanted (a full sync in the loop since makes it stale): a few sets
// each sync, about repairEntries entries, so that a change never waits
// for the whole table's comparison; the rules once every set is done.
func (g *Glue) applyCheck(st *Stats) []error {
	if g.repair == nil {
		res, took, ok := g.check.Take()
		if !ok {
			return nil
		}
		g.repair = &checkRepair{res: res, took: took, left: setIDs(g.cfg.IPv4, g.cfg.IPv6)}
	}
	rp := g.repair
	var errs []error
	added, deleted, rebuilt := st.Added, st.Deleted, st.Rebuilt
	for n := 0; len(rp.left) > 0 && n < g.repairEntries; rp.left = rp.left[1:] {
		id := rp.left[0]
		r := rp.res.sets[id]
		n += len(r.set.Entries)
		s, err := g.syncer.SyncRead(g.specOf(id), g.refs[id], r.set, r.err)
		st.add(s)
		if err := g.afterSetSync(id, err); err != nil {
			errs = append(errs, err)
		}
	}
	rp.added, rp.deleted, rp.rebuilt = rp.added+st.Added-added, rp.deleted+st.Deleted-deleted, rp.rebuilt+st.Rebuilt-rebuilt
	if len(rp.left) > 0 {
		return errs
	}
	g.repair = nil
	st.Checked = true
	st.CheckSetRead, st.CheckRulesRead, st.CheckTook = rp.res.setRead, rp.res.rulesRead, rp.took
	st.CheckAdded, st.CheckDeleted, st.CheckRebuilt = rp.added, rp.deleted, rp.rebuilt
	rulesStart := g.clock.Now()
	n, err := g.syncRules(false, rp.res.saved)
	st.RulesTime += g.clock.Since(rulesStart)
	st.Restores += n
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}
