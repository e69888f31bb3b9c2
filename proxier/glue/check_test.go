package glue

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/background/backgroundtest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// heldSets is the fake kernel of sets with its dumps held: once held, the
// first List takes a dump of every set, says so on read, then waits for
// release; that List and the following ones answer from the dump. A read
// off the loop so sees the sets as they were when it began, whatever the
// loop writes meanwhile. fail, if set, fails the List of that set.
type heldSets struct {
	*ipsetfake.Sets
	mu      sync.Mutex
	held    bool
	names   []string
	dump    map[string]ipset.Set
	errs    map[string]error
	read    chan struct{} // closed once the dump is taken
	release chan struct{}
	fail    string
}

func (h *heldSets) hold(names []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held, h.names, h.dump, h.errs = true, names, nil, nil
	h.read, h.release = make(chan struct{}), make(chan struct{})
}

func (h *heldSets) List(name string) (ipset.Set, error) {
	h.mu.Lock()
	if !h.held {
		h.mu.Unlock()
		return h.Sets.List(name)
	}
	if h.dump == nil {
		h.dump, h.errs = map[string]ipset.Set{}, map[string]error{}
		for _, n := range h.names {
			h.dump[n], h.errs[n] = h.Sets.List(n)
		}
		close(h.read)
		h.mu.Unlock()
		<-h.release
		h.mu.Lock()
	}
	defer h.mu.Unlock()
	if name == h.fail {
		return ipset.Set{}, errors.New("injected read failure")
	}
	return h.dump[name], h.errs[name]
}

// checkBed is a bed whose glue has a wake function, as in the agent.
type checkBed struct {
	*bed
	held  *heldSets
	woken chan struct{}
}

func newCheckBed(t *testing.T, cfg Config) *checkBed {
	t.Helper()
	b := &checkBed{bed: newBed(t, cfg), woken: make(chan struct{}, 8)}
	b.held = &heldSets{Sets: b.sets}
	b.g = New(cfg, b.held, b.g.ipt, b.links, zap.NewNop())
	b.g.SetWake(func() { b.woken <- struct{}{} })
	return b
}

func (b *checkBed) setNames() []string {
	var out []string
	for _, id := range setIDs(b.g.cfg.IPv4, b.g.cfg.IPv6) {
		out = append(out, id.name())
	}
	return out
}

func (b *checkBed) iptCalls() []string {
	b.ipt.mu.Lock()
	defer b.ipt.mu.Unlock()
	return slices.Clone(b.ipt.calls)
}

func (b *checkBed) waitWoken(t *testing.T) {
	t.Helper()
	select {
	case <-b.woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the check never asked for a sync")
	}
}

// TestPeriodicFullSyncLetsChangesThrough: a periodic full sync reads the
// sets and the rules off the loop. While that read is held, the full sync
// has returned, and a change is written by a partial sync that reads
// nothing and runs no iptables tool. Once the read is done, the glue asks
// for a sync, and that sync repairs exactly the drift the read found
// (a set entry deleted, one added, a rule deleted behind its back), without
// rewriting the change the read did not see; the sets end as a full sync in
// the loop would leave them.
func TestPeriodicFullSyncLetsChangesThrough(t *testing.T) {
	b := newCheckBed(t, dualStack)
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	if st := b.sync(t, true); st.CheckStarted || st.Reads == 0 || st.Restores == 0 {
		t.Fatalf("the first sync %+v; want it whole in the loop", st)
	}

	// Drift behind the glue's back.
	_ = b.sets.Del("IPVSP-CLUSTER-IP", ipset.Entry{Addr: addr("10.96.0.2"), Proto: tcp, Port: 80})
	_ = b.sets.Add("IPVSP-VIP", ipset.Entry{Addr: addr("10.96.9.9")})
	b.ipt.mu.Lock()
	b.ipt.tables("nft4")["nat"].rules["IPVSP-POSTROUTING"] = nil
	b.ipt.mu.Unlock()

	b.held.hold(b.setNames())
	b.sets.ResetCalls()
	ipt := len(b.iptCalls())
	st := b.sync(t, true) // the periodic full sync
	if !st.CheckStarted || st.Reads != 0 || st.Restores != 0 || st.Added+st.Deleted != 0 {
		t.Errorf("periodic full sync %+v; want a check started and nothing read or written in the loop", st)
	}
	select {
	case <-b.held.read:
	case <-time.After(10 * time.Second):
		t.Fatal("the check did not read the sets")
	}
	reads := len(b.sets.Calls()) // the check's dumps, off the loop
	if reads != len(b.setNames()) {
		t.Errorf("the check dumped %d sets; want %d", reads, len(b.setNames()))
	}

	// A change while the read is held: written at once, nothing else.
	p2 := service(2)
	b.g.SetPlan(p2.Service, p2)
	if b.g.Pending() {
		t.Error("Pending before the check's read is done")
	}
	st = b.sync(t, false)
	if st.Checked || st.Reads != 0 || st.Restores != 0 {
		t.Errorf("partial sync during the check %+v; want no read and no restore", st)
	}
	changeWrites := b.sets.Calls()[reads:]
	want := []ipsetfake.Call{
		"Add IPVSP-CLUSTER-IP 10.96.0.3,tcp:80",
		"Add IPVSP-EXTERNAL 10.0.2.15,tcp:30002",
		"Add IPVSP-VIP 10.96.0.3", // protection before acceptance
		"Add IPVSP-SERVICE 10.0.2.15,tcp:30002 10.96.0.3,tcp:80",
		"Add IPVSP-HAIRPIN 10.100.0.4,tcp:8080,10.100.0.4",
	}
	if diff := cmp.Diff(want, changeWrites); diff != "" {
		t.Errorf("calls of the partial sync during the check (-want +got):\n%s", diff)
	}
	if got := b.iptCalls()[ipt:]; len(got) != 0 {
		t.Errorf("iptables runs while the check's read is held: %q", got)
	}

	close(b.held.release)
	b.waitWoken(t)
	if !b.g.Pending() {
		t.Fatal("the check woke the loop but is not pending")
	}
	b.sets.ResetCalls()
	st = b.sync(t, false)
	if !st.Checked || st.Restores != 1 {
		t.Errorf("the sync after the check %+v; want the check applied with one restore (IPv4's nat table)", st)
	}
	want = []ipsetfake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.2,tcp:80", "Del IPVSP-VIP 10.96.9.9"}
	if diff := cmp.Diff(want, b.sets.Writes()); diff != "" {
		t.Errorf("repair writes (-want +got):\n%s", diff)
	}
	if in := RestoreInput(Rules(RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}), ParseSave(b.ipt.dump("nft4")), Owned); in != "" {
		t.Errorf("rules still differ:\n%s", in)
	}
	if b.g.Pending() {
		t.Error("still pending after the check was applied")
	}

	// The same Services synced by a fresh glue, whole: the same sets.
	b.sameAsFresh(t, "the check", p1, p2)

	// The next periodic full sync starts another check.
	b.held.held = false
	if st := b.sync(t, true); !st.CheckStarted {
		t.Errorf("second periodic full sync %+v; want another check", st)
	}
	b.waitWoken(t)
	if st := b.sync(t, false); !st.Checked || st.Added+st.Deleted+st.Restores != 0 {
		t.Errorf("second check %+v; want it applied with nothing to repair", st)
	}
}

// TestCheckFailureFallsBackToTheLoop: a check whose read fails fails the
// sync that applies it, naming the set; the next full sync runs whole in
// the loop and repairs the set.
func TestCheckFailureFallsBackToTheLoop(t *testing.T) {
	b := newCheckBed(t, Config{Interface: "ipvs-proxy0", IPv4: true})
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	b.sync(t, true)
	_ = b.sets.Del("IPVSP-SERVICE", ipset.Entry{Addr: addr("10.96.0.2"), Proto: tcp, Port: 80})

	b.held.hold(b.setNames())
	b.held.fail = "IPVSP-SERVICE"
	close(b.held.release)
	b.sync(t, true)
	b.waitWoken(t)
	if _, err := b.g.SyncStats(false); err == nil || !strings.Contains(err.Error(), "IPVSP-SERVICE") {
		t.Fatalf("applying a failed check: %v; want an error naming IPVSP-SERVICE", err)
	}
	b.held.held = false
	st := b.sync(t, true)
	if st.CheckStarted || st.Reads == 0 {
		t.Errorf("full sync after a failure %+v; want it whole in the loop", st)
	}
	if got := b.sets.Entries("IPVSP-SERVICE"); !slices.Contains(got, "10.96.0.2,tcp:80") {
		t.Errorf("IPVSP-SERVICE = %v; want the entry repaired", got)
	}
}

// TestCheckDroppedByAFullSyncInTheLoop: a check still under way when a
// failed sync's full retry runs whole in the loop is of no use: its result
// is dropped (nothing pending, nothing applied), and the next periodic
// full sync starts a new one.
func TestCheckDroppedByAFullSyncInTheLoop(t *testing.T) {
	b := newCheckBed(t, Config{Interface: "ipvs-proxy0", IPv4: true})
	b.sync(t, true)
	b.held.hold(b.setNames())
	if st := b.sync(t, true); !st.CheckStarted {
		t.Fatalf("periodic full sync %+v; want a check", st)
	}
	<-b.held.read

	b.sets.InjectErrors(func(c ipsetfake.Call) error {
		if strings.HasPrefix(string(c), "Add IPVSP-CLUSTER-IP") {
			return errors.New("injected")
		}
		return nil
	})
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	if _, err := b.g.SyncStats(false); err == nil {
		t.Fatal("the partial sync did not fail")
	}
	b.sets.InjectErrors(nil)
	close(b.held.release)
	b.waitWoken(t)
	b.held.held = false

	st := b.sync(t, true) // the consumer's retry, full
	if st.CheckStarted || st.Checked || st.Reads == 0 {
		t.Errorf("retry %+v; want it whole in the loop", st)
	}
	if b.g.Pending() {
		t.Error("the dropped check is still pending")
	}
	if got := b.sets.Entries("IPVSP-CLUSTER-IP"); !slices.Equal(got, []string{"10.96.0.2,tcp:80"}) {
		t.Errorf("IPVSP-CLUSTER-IP = %v", got)
	}
	if st := b.sync(t, true); !st.CheckStarted {
		t.Errorf("the next periodic full sync %+v; want a new check", st)
	}
	b.waitWoken(t)
	if st := b.sync(t, false); !st.Checked || st.Added+st.Deleted+st.Restores != 0 {
		t.Errorf("the new check %+v; want it applied with nothing to repair", st)
	}
}

// TestCheckRepairYieldsAndGoesSetBySet: a finished check's repair is made
// a few sets a sync (here one entry's worth: a set a sync), and a sync
// carrying a change (Yield) writes the change alone, once: the sync after
// it repairs even if asked to yield again. The sets end as a whole sync in
// the loop would leave them, and the check ends with the rules.
func TestCheckRepairYieldsAndGoesSetBySet(t *testing.T) {
	b := newCheckBed(t, dualStack)
	b.g.repairEntries = 1
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	b.sync(t, true)
	_ = b.sets.Del("IPVSP-CLUSTER-IP", ipset.Entry{Addr: addr("10.96.0.2"), Proto: tcp, Port: 80})
	_ = b.sets.Add("IPVSP-VIP", ipset.Entry{Addr: addr("10.96.9.9")})
	b.held.hold(b.setNames())
	b.sync(t, true) // the periodic full sync: the check starts
	close(b.held.release)
	b.waitWoken(t)

	p2 := service(2)
	b.g.SetPlan(p2.Service, p2)
	b.sets.ResetCalls()
	b.g.Yield()
	if st := b.sync(t, false); st.Sets != 5 || st.Checked || !b.g.Pending() {
		t.Errorf("the sync with a change: %d sets synced, checked %v, pending %v; want the change's 5 sets alone and the check still pending",
			st.Sets, st.Checked, b.g.Pending())
	}
	if w := b.sets.Writes(); len(w) != 5 || slices.ContainsFunc(w, func(c ipsetfake.Call) bool { return strings.Contains(string(c), "10.96.9.9") }) {
		t.Errorf("writes of the sync with a change: %q; want the change's alone", w)
	}
	syncs := 0
	for b.g.Pending() {
		b.g.Yield() // yields only every other sync
		st := b.sync(t, false)
		if syncs++; syncs > 2*len(b.setNames()) {
			t.Fatal("the repair does not end")
		}
		if st.Checked != !b.g.Pending() {
			t.Errorf("sync %d: checked %v but pending %v", syncs, st.Checked, b.g.Pending())
		}
	}
	if syncs < 3 {
		t.Errorf("the repair took %d syncs; want one set (with an entry) a sync", syncs)
	}
	b.sameAsFresh(t, "the repair", p1, p2)
}

// sameAsFresh checks that the sets are those a fresh glue's whole sync of
// the plans makes.
func (b *checkBed) sameAsFresh(t *testing.T, after string, plans ...*model.ServicePlan) {
	t.Helper()
	ref := newBed(t, b.g.cfg)
	for _, p := range plans {
		ref.g.SetPlan(p.Service, p)
	}
	ref.sync(t, true)
	if diff := cmp.Diff(ref.sets.Dump(), b.sets.Dump()); diff != "" {
		t.Errorf("sets after %s (-a fresh full sync +got):\n%s", after, diff)
	}
}

// TestFailedRepairKeepsFullSyncsInTheLoop: a check's repair whose restore
// fails fails the sync; a partial sync after it (nothing for it to write)
// succeeds, but the consumer's full retry still runs whole in the loop and
// fails again while iptables-restore fails, instead of starting another
// check and returning nil: that nil counted as the retry's success, and
// the node was reported healthy between the failures (TestChaosNodes:
// /healthz 200 for 20 s in a glue that failed for 3 minutes).
func TestFailedRepairKeepsFullSyncsInTheLoop(t *testing.T) {
	b := newCheckBed(t, Config{Interface: "ipvs-proxy0", IPv4: true})
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	b.sync(t, true)
	b.ipt.put("nft4", "nat", "IPVSP-POSTROUTING", "-s 192.0.2.45/32 -j RETURN") // drift only a restore repairs
	b.ipt.mu.Lock()
	b.ipt.fail = func(tool string) error {
		if strings.HasSuffix(tool, "-restore") {
			return errors.New("injected: iptables-restore failed")
		}
		return nil
	}
	b.ipt.mu.Unlock()

	if st := b.sync(t, true); !st.CheckStarted { // the periodic full sync
		t.Fatalf("periodic full sync %+v; want a check", st)
	}
	b.waitWoken(t)
	if _, err := b.g.SyncStats(false); err == nil {
		t.Fatal("the check's repair succeeded with iptables-restore failing")
	}
	b.sync(t, false) // between the retries: nothing to write
	for retry := 1; retry <= 2; retry++ {
		st, err := b.g.SyncStats(true)
		if err == nil || st.CheckStarted {
			t.Fatalf("full retry %d: %+v, %v; want it whole in the loop, failing", retry, st, err)
		}
		b.sync(t, false)
	}
	b.ipt.mu.Lock()
	b.ipt.fail = nil
	b.ipt.mu.Unlock()
	if st := b.sync(t, true); st.CheckStarted || st.Restores == 0 {
		t.Errorf("full retry once iptables-restore works: %+v; want the rules restored in the loop", st)
	}
	if st := b.sync(t, true); !st.CheckStarted {
		t.Errorf("the next periodic full sync %+v; want a check again", st)
	}
}

// TestCheckStartsThroughBackground: the check's read off the loop is
// started by Config.Background (the agent's lower priority), once per
// check; the first full sync, whole in the loop, starts none.
func TestCheckStartsThroughBackground(t *testing.T) {
	var bg backgroundtest.Counting
	cfg := dualStack
	cfg.Background = bg.Start
	b := newCheckBed(t, cfg)
	p1 := service(1)
	b.g.SetPlan(p1.Service, p1)
	if st := b.sync(t, true); st.CheckStarted || bg.Count() != 0 {
		t.Fatalf("the first sync %+v started %d reads; want it whole in the loop, none started", st, bg.Count())
	}
	if st := b.sync(t, true); !st.CheckStarted {
		t.Fatalf("periodic full sync %+v; want a check started", st)
	}
	b.waitWoken(t)
	if n := bg.Count(); n != 1 {
		t.Errorf("the check's read started %d times through Config.Background; want 1", n)
	}
}

// TestCheckReadsRulesWithinItsOwnLimit: the loop's iptables-save is
// killed after toolTimeout; a check's, off the loop at a lower priority,
// gets checkReadTimeout, so that on a starved node a slow read does not
// fail the check and send the glue's next full sync into the loop.
func TestCheckReadsRulesWithinItsOwnLimit(t *testing.T) {
	b := newCheckBed(t, Config{Interface: "ipvs-proxy0", IPv4: true})
	saves := func() []time.Duration {
		b.ipt.mu.Lock()
		defer b.ipt.mu.Unlock()
		var out []time.Duration
		for i, c := range b.ipt.calls {
			if strings.HasSuffix(c, "-save") {
				out = append(out, b.ipt.limits[i])
			}
		}
		return out
	}
	b.sync(t, true)
	inLoop := saves()
	if len(inLoop) == 0 || slices.ContainsFunc(inLoop, func(d time.Duration) bool { return d <= 0 || d > toolTimeout }) {
		t.Fatalf("the first sync's saves had %v left; want each bounded by %s", inLoop, toolTimeout)
	}
	if st := b.sync(t, true); !st.CheckStarted {
		t.Fatalf("periodic full sync %+v; want a check started", st)
	}
	b.waitWoken(t)
	checked := saves()[len(inLoop):]
	if len(checked) != 1 || checked[0] <= toolTimeout || checked[0] > checkReadTimeout {
		t.Errorf("the check's saves had %v left; want one, more than %s and at most %s", checked, toolTimeout, checkReadTimeout)
	}
}
