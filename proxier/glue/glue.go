// Package glue is the iptables glue of ipvs-proxy: what IPVS alone does not
// do. Connections are masqueraded where the client's address would not
// route back (clusterIP traffic from outside the cluster CIDR, external
// traffic under externalTrafficPolicy Cluster, hairpin), LoadBalancer source
// ranges are enforced, node ports and Service ports are accepted, and new
// connections to a VIP on a port that is no Service are rejected.
//
// The number of iptables rules is constant (Rules, a pure function of the
// configuration); every per-Service datum is an ipset entry (ServiceEntries,
// a pure function of a plan). Glue implements consumer.Consumer: it keeps
// each Service's entries, updates the sets by difference on every sync, and
// on a full sync also re-reads the sets and the rules and repairs drift.
//
// Ownership: the glue creates, changes and deletes only sets named
// "IPVSP-*", chains named "IPVSP-*", and the rules in built-in chains that
// jump to those chains. Other sets, chains and rules are never touched.
package glue

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/background"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Config configures the glue.
type Config struct {
	// Interface is the proxy's dummy interface (its addresses are not node
	// addresses).
	Interface string
	// NodePortAddresses are the prefixes of the node's own addresses
	// (--nodeport-addresses; empty means all). When a LoadBalancer's
	// source range holds one of them, the node itself may reach the
	// LoadBalancer IP.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pods' prefixes (--cluster-cidr, or the Node's
	// podCIDRs under --detect-local-mode NodeCIDR): traffic from them is
	// in-cluster (local) traffic.
	ClusterCIDRs []netip.Prefix
	// LocalBridge and LocalInterfacePrefix tell in-cluster traffic by the
	// interface it arrives on instead (--detect-local-mode
	// BridgeInterface, InterfaceNamePrefix).
	LocalBridge, LocalInterfacePrefix string
	// MasqueradeAll masquerades all traffic to clusterIPs.
	MasqueradeAll bool
	// AcceptServices accepts Service traffic ahead of the host's firewall
	// (RuleConfig.AcceptServices).
	AcceptServices bool
	// IPv4 and IPv6 are the families served.
	IPv4, IPv6 bool
	// Clock is the proxier's clock (Config.Clock); default the real one.
	Clock clock.PassiveClock
	// Background starts the check's read off the sync loop (the agent's
	// Config.Background); default a plain goroutine.
	Background background.Start
}

// Glue programs the iptables glue. It is a consumer.Consumer and, like the
// reconciler, is driven by the proxier's one sync loop.
type Glue struct {
	cfg    Config
	syncer *ipset.Syncer
	sets   ipset.Interface
	ipt    map[ipset.Family]*IPTables
	links  netlinkutil.Links
	log    *zap.Logger
	clock  clock.PassiveClock

	plans   map[types.NamespacedName]*model.ServicePlan
	contrib map[types.NamespacedName]held
	// refs counts the Services that want each entry: what each set should
	// hold. The Syncer keeps no copy of a set synced to its Counts (an
	// ipset.Mirrored): they also record which entries changed since.
	refs map[setID]*ipset.Counts
	// dirty holds the sets to sync: an entry's membership changed, or
	// the last sync of the set failed.
	dirty     map[setID]struct{}
	nodeAddrs []netip.Addr
	ranges    []netip.Prefix // SetServiceRanges
	// redirects are each Service's in-cluster redirects (RuleConfig's
	// Redirects); rulesDirty says they changed since the rules were
	// last written, so a partial sync writes the rules too.
	redirects  map[types.NamespacedName][]Redirect
	rulesDirty bool

	// Failures charged to Services (failures.go): the Services whose
	// entries each set refused at its last sync, those kept out of
	// SERVICE because a set restricting them refused theirs, and the sets
	// whose last sync had entries refused (written again: Retry).
	refused  map[setID]map[types.NamespacedName]string
	withheld map[types.NamespacedName]bool
	partial  map[setID]struct{}
	// sizes are the hash sets' maxelem (nextMaxElem).
	sizes map[setID]uint32

	synced bool // a full sync has succeeded
	failed bool // a sync failed since the last whole one in the loop: the next full one runs in the loop

	// A periodic full sync reads the kernel off the sync loop (see
	// check.go): wake asks the loop for a sync when the read is done (nil:
	// full syncs run whole in the loop), check is that read.
	wake  func()
	check *consumer.OffLoop[checkResult]
	// yield: this sync leaves a finished check for the next (Yield);
	// yielded: the last one did.
	yield, yielded bool
	// repair is a finished check being applied, set by set, about
	// repairEntries entries read a sync.
	repair        *checkRepair
	repairEntries int
}

var _ consumer.Consumer = (*Glue)(nil)

// New returns the glue. ipt holds the iptables tools of each served family.
func New(cfg Config, sets ipset.Interface, ipt map[ipset.Family]*IPTables, links netlinkutil.Links, log *zap.Logger) *Glue {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Background == nil {
		cfg.Background = background.Go
	}
	g := &Glue{
		cfg: cfg, syncer: ipset.NewSyncer(sets), sets: sets, ipt: ipt, links: links, log: log, clock: cfg.Clock,
		plans:     map[types.NamespacedName]*model.ServicePlan{},
		contrib:   map[types.NamespacedName]held{},
		redirects: map[types.NamespacedName][]Redirect{},
		refs:      map[setID]*ipset.Counts{},
		dirty:     map[setID]struct{}{},
		check:     consumer.NewOffLoop[checkResult](cfg.Clock),

		repairEntries: defaultRepairEntries,

		refused:  map[setID]map[types.NamespacedName]string{},
		withheld: map[types.NamespacedName]bool{},
		partial:  map[setID]struct{}{},
		sizes:    map[setID]uint32{},
	}
	for _, id := range setIDs(cfg.IPv4, cfg.IPv6) {
		g.refs[id] = ipset.NewCounts()
		g.dirty[id] = struct{}{}
	}
	for _, fam := range g.families() {
		for _, e := range cidrEntries(cfg.ClusterCIDRs, fam) {
			g.ref(setID{setClusterCIDR, fam}, e.Key(), 1)
		}
	}
	return g
}

// SetServiceRanges sets the Service ranges routed as local through the
// interface, whose addresses are protected: written by the next sync.
func (g *Glue) SetServiceRanges(ranges []netip.Prefix) {
	for _, fam := range g.families() {
		for _, e := range cidrEntries(g.ranges, fam) {
			g.ref(setID{setServiceRange, fam}, e.Key(), -1)
		}
		for _, e := range cidrEntries(ranges, fam) {
			g.ref(setID{setServiceRange, fam}, e.Key(), 1)
		}
	}
	g.ranges = slices.Clone(ranges)
}

// Name implements consumer.Consumer.
func (g *Glue) Name() string { return "iptables glue" }

func (g *Glue) families() []ipset.Family {
	var out []ipset.Family
	if g.cfg.IPv4 {
		out = append(out, ipset.IPv4)
	}
	if g.cfg.IPv6 {
		out = append(out, ipset.IPv6)
	}
	return out
}

// ruleConfig is the rule configuration of a family.
func (g *Glue) ruleConfig(fam ipset.Family) RuleConfig {
	c := RuleConfig{Family: fam, MasqueradeAll: g.cfg.MasqueradeAll, AcceptServices: g.cfg.AcceptServices,
		BridgeInterface: g.cfg.LocalBridge, InterfacePrefix: g.cfg.LocalInterfacePrefix, Redirects: g.redirectsFor(fam)}
	for _, p := range g.cfg.ClusterCIDRs {
		if ipset.Of(p.Addr()) != fam {
			continue
		}
		if p.Bits() == 0 { // every source is in the cluster: never masquerade
			return RuleConfig{Family: fam, MasqueradeAll: g.cfg.MasqueradeAll, AcceptServices: g.cfg.AcceptServices,
				Redirects: c.Redirects}
		}
		c.ClusterCIDR = true
	}
	return c
}

// specOf is a set's spec for the entries it is to hold now.
func (g *Glue) specOf(id setID) ipset.Spec {
	size := nextMaxElem(g.sizes[id], g.refs[id].Len())
	g.sizes[id] = size
	return id.spec(size)
}

// ref changes the count of an entry and marks its set dirty when the entry
// appears or disappears. (Which entries changed, the Counts record once
// their set was synced: until then every sync of the set compares it
// whole, and a record would be a second copy of every entry.)
func (g *Glue) ref(id setID, e ipset.Key, delta int32) {
	refs, ok := g.refs[id]
	if !ok {
		return // a family that is not served
	}
	if refs.Add(e, delta) {
		g.dirty[id] = struct{}{}
	}
}

// SetPlan implements consumer.Consumer.
func (g *Glue) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	if plan == nil {
		delete(g.plans, name)
	} else {
		g.plans[name] = plan
	}
	g.recompute(name)
	if r := redirectsOf(plan); !slices.Equal(r, g.redirects[name]) {
		if len(r) == 0 {
			delete(g.redirects, name)
		} else {
			g.redirects[name] = r
		}
		g.rulesDirty = true
	}
}

// Backend is the iptables backend the glue writes with ("" without tools).
func (g *Glue) Backend() Backend {
	for _, fam := range []ipset.Family{ipset.IPv4, ipset.IPv6} {
		if t := g.ipt[fam]; t != nil {
			return t.Backend
		}
	}
	return ""
}

// redirectsFor lists every Service's redirects of a family, sorted.
func (g *Glue) redirectsFor(fam ipset.Family) []Redirect {
	var out []Redirect
	for _, rs := range g.redirects {
		for _, r := range rs {
			if ipset.Of(r.VIP) == fam {
				out = append(out, r)
			}
		}
	}
	slices.SortFunc(out, Redirect.compare)
	return out
}

// recompute replaces a Service's entries with those of its current plan.
func (g *Glue) recompute(name types.NamespacedName) {
	next := g.entriesOf(name)
	prev := g.contrib[name]
	// Both lists are sorted and hold each entry once: one merge finds
	// what came and what went, and what stays is not counted up and
	// down (a node-address change keeps most of a Service's entries).
	i, j := 0, 0
	for i < len(next) || j < len(prev) {
		c := 0
		switch {
		case i == len(next):
			c = 1
		case j == len(prev):
			c = -1
		default:
			c = next[i].compare(prev[j])
		}
		switch {
		case c < 0:
			g.ref(next[i].set.id(), next[i].k, 1)
			i++
		case c > 0:
			g.ref(prev[j].set.id(), prev[j].k, -1)
			j++
		default:
			i++
			j++
		}
	}
	if len(next) == 0 {
		delete(g.contrib, name)
	} else {
		g.contrib[name] = next
	}
	if ce := g.log.Check(zap.DebugLevel, "set entries of a Service"); ce != nil && (len(prev) > 0 || len(next) > 0) {
		ce.Write(zap.String("service", name.String()), zap.Int("entries", len(next)), zap.Int("before", len(prev)))
	}
}

// Stats describe one glue sync.
type Stats struct {
	Sets       int // sets synced
	Reads      int // set dumps
	Added      int
	Deleted    int
	Rebuilt    int // sets rebuilt and swapped in
	Restores   int // iptables-restore runs
	Duration   time.Duration
	NodeChange bool
	// The parts of Duration: reading the node's addresses, reading the
	// sets, writing them (the rest of the sets' time), and the iptables
	// rules (iptables-save and iptables-restore).
	AddressTime, SetReadTime, SetWriteTime, RulesTime time.Duration
	// CheckStarted: a periodic full sync started its read off the loop.
	// Checked: the sync applied such a read (the repairs are counted
	// above; CheckAdded and CheckDeleted are those of the read's sets
	// alone), which took CheckTook off the loop, of which CheckSetRead
	// reading the sets and CheckRulesRead running iptables-save.
	CheckStarted, Checked                   bool
	CheckAdded, CheckDeleted, CheckRebuilt  int
	CheckSetRead, CheckRulesRead, CheckTook time.Duration
}

// Sync implements consumer.Consumer. A partial sync writes the difference of
// the sets that changed, from memory; a full one (and the first) re-reads
// the node's addresses, every set and the iptables rules, and repairs them.
// Once SetWake gave it a way to ask for a sync, a periodic full sync (after
// a first one that succeeded, and while syncs succeed) reads the sets and
// rules off the sync loop, and a later sync repairs what that read found
// (see check.go): the loop's partial syncs are never held up by it.
func (g *Glue) Sync(full bool) error {
	inLoop := full && !g.background(full)
	st, err := g.SyncStats(full)
	logAt := g.log.Debug
	if inLoop || !g.synced || st.Duration >= slowSync {
		logAt = g.log.Info
	}
	logAt("iptables glue synced", zap.Bool("full", inLoop || !g.synced), zap.Bool("checkStarted", st.CheckStarted),
		zap.Int("sets", st.Sets), zap.Int("added", st.Added), zap.Int("deleted", st.Deleted), zap.Int("rebuilt", st.Rebuilt),
		zap.Int("restores", st.Restores), zap.Duration("addresses", st.AddressTime),
		zap.Duration("setRead", st.SetReadTime), zap.Duration("setWrite", st.SetWriteTime),
		zap.Duration("rules", st.RulesTime), zap.Duration("took", st.Duration))
	if st.Checked {
		g.log.Info("iptables glue checked", zap.Duration("setRead", st.CheckSetRead), zap.Duration("rulesRead", st.CheckRulesRead),
			zap.Duration("readTook", st.CheckTook), zap.Int("added", st.CheckAdded), zap.Int("deleted", st.CheckDeleted),
			zap.Int("rebuilt", st.CheckRebuilt), zap.Int("restores", st.Restores), zap.Duration("took", st.Duration))
	}
	return err
}

// slowSync is the time from which a partial sync is logged at info level,
// with its parts (a full one in the loop always is).
const slowSync = time.Second

// background reports whether a full sync asked for now reads the kernel off
// the loop.
func (g *Glue) background(full bool) bool {
	return full && g.synced && !g.failed && g.wake != nil
}

// SyncStats is Sync, returning what it did.
func (g *Glue) SyncStats(full bool) (Stats, error) {
	start := g.clock.Now()
	first := !g.synced
	background := g.background(full)
	full = full || first
	inLoop := full && !background // the whole full sync, here
	yield := g.yield
	g.yield, g.yielded = false, false
	var st Stats
	var errs []error
	if full {
		if err := g.refreshNodeAddresses(&st); err != nil {
			errs = append(errs, err)
		}
		st.AddressTime = g.clock.Since(start)
	}
	if inLoop {
		g.syncer.Forget()
		g.check.Drop() // a check under way is of no use now
		g.repair = nil
	}
	setsStart := g.clock.Now()
	// Sets first: the rules refer to them, and iptables-restore fails on a
	// missing set.
	for _, id := range setIDs(g.cfg.IPv4, g.cfg.IPv6) {
		if _, dirty := g.dirty[id]; !inLoop && !dirty {
			continue
		}
		// In the loop every set is read again; otherwise the Syncer
		// writes what changed since the set's last sync (or, after a
		// failed write, reads it again).
		s, err := g.syncer.Sync(g.specOf(id), g.refs[id], inLoop)
		st.add(s)
		if err := g.afterSetSync(id, err); err != nil {
			errs = append(errs, err)
		}
	}
	st.SetWriteTime = g.clock.Since(setsStart) - st.SetReadTime
	if inLoop {
		err := g.timedSyncRules(&st, first)
		if err != nil {
			errs = append(errs, err)
		}
		if err == nil && len(errs) == 0 && first {
			// Sets of a family no longer served, of an older version, or
			// a crashed rebuild's leftover: only after the rules that used
			// them are gone, and only once every set is synced (a rebuild
			// under way resumes from its temporary set). Listing every set
			// costs, so only at start-up.
			errs = append(errs, g.destroyStaleSets()...)
		}
	} else {
		if g.rulesDirty {
			// Redirects changed: the rules are written now, with an
			// iptables-save in the loop (Services with direct server
			// return only).
			if err := g.timedSyncRules(&st, false); err != nil {
				errs = append(errs, err)
			}
		}
		g.yielded = yield && g.Pending()
		if !g.yielded {
			errs = append(errs, g.applyCheck(&st)...)
		}
		if background && !g.check.Running() && g.repair == nil {
			g.startCheck()
			st.CheckStarted = true
		}
	}
	err := errors.Join(errs...)
	if inLoop && err == nil {
		g.synced = true
	}
	// Only a whole sync in the loop clears a failure: a partial sync
	// that had nothing to write proves nothing of the rules, and a full
	// retry that started a check instead would return nil unrepaired.
	if err != nil || inLoop {
		g.failed = err != nil
	}
	st.Duration = g.clock.Since(start)
	return st, err
}

// timedSyncRules is syncRules in the loop, counted in st.
func (g *Glue) timedSyncRules(st *Stats, first bool) error {
	start := g.clock.Now()
	n, err := g.syncRules(first, nil)
	st.Restores += n
	st.RulesTime = g.clock.Since(start)
	return err
}

// add counts one set's sync.
func (st *Stats) add(s ipset.Stats) {
	st.Sets++
	st.Reads += s.Reads
	st.SetReadTime += s.ReadTime
	st.Added += s.Added
	st.Deleted += s.Deleted
	if s.Rebuilt {
		st.Rebuilt++
	}
}

// setError names the Services whose entries a failed set write concerned.
func (g *Glue) setError(id setID, err error) error {
	var services []string
	ref := refOf(id)
	for name, c := range g.contrib {
		if slices.ContainsFunc(c, func(se setEntry) bool { return se.set == ref }) {
			services = append(services, name.String())
			if len(services) == 5 {
				services = append(services, "...")
				break
			}
		}
	}
	slices.Sort(services)
	g.log.Error("ipset update failed", zap.String("set", id.name()), zap.Strings("services", services), zap.Error(err))
	return fmt.Errorf("set %s: %w", id.name(), err)
}

// refreshNodeAddresses reads the node's addresses; when they change, the
// entries of the Services with firewalled LoadBalancer IPs are recomputed
// (the addresses decide the node's own access to them).
func (g *Glue) refreshNodeAddresses(st *Stats) error {
	all, err := g.links.NodeAddresses(netlinkutil.ProxyInterfaces(g.cfg.Interface)...)
	if err != nil {
		return fmt.Errorf("read node addresses: %w", err)
	}
	addrs := model.FilterNodePortAddresses(all, g.cfg.NodePortAddresses)
	if slices.Equal(addrs, g.nodeAddrs) {
		return nil
	}
	g.nodeAddrs = addrs
	st.NodeChange = true
	for name, plan := range g.plans {
		if usesNodeAddresses(plan) {
			g.recompute(name)
		}
	}
	return nil
}

// warnDefaultDrop warns, at start, where the host's filter INPUT drops by
// default and Service traffic is not accepted ahead of the host's rules:
// it is then dropped unless the host's own rules accept it (node ports,
// and pods' connections to clusterIPs, which are local addresses).
func (g *Glue) warnDefaultDrop(fam ipset.Family, have Saved) {
	t := have["filter"]
	if g.cfg.AcceptServices || t == nil || (t.Policies["INPUT"] != "DROP" && t.Policies["INPUT"] != "REJECT") {
		return
	}
	g.log.Warn("the host's filter INPUT policy drops: Service traffic (node ports, and pods' connections to clusterIPs) passes only what the host's own INPUT rules accept; set iptables.acceptServiceTraffic to accept it ahead of them",
		zap.String("family", fam.String()), zap.String("policy", t.Policies["INPUT"]))
}

// syncRules reads each family's rules and applies the difference in one
// iptables-restore per family (one transaction per table). On the first
// sync, the rules of a family that is not served are removed. saved, when
// not nil, holds the served families' rules as read off the loop.
func (g *Glue) syncRules(first bool, saved map[ipset.Family]savedRead) (restores int, err error) {
	var errs []error
	for _, fam := range []ipset.Family{ipset.IPv4, ipset.IPv6} {
		ipt := g.ipt[fam]
		served := (fam == ipset.IPv4 && g.cfg.IPv4) || (fam == ipset.IPv6 && g.cfg.IPv6)
		if ipt == nil {
			if served {
				errs = append(errs, fmt.Errorf("no iptables tools for %s", fam))
			}
			continue
		}
		if !served && !first {
			continue
		}
		var want []Table
		if served {
			want = Rules(g.ruleConfig(fam))
		}
		var have Saved
		if saved != nil {
			have, err = saved[fam].saved, saved[fam].err
		} else {
			have, err = ipt.Save(context.Background())
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if first {
			g.warnDefaultDrop(fam, have)
		}
		input := RestoreInput(want, have, Owned)
		if input == "" {
			continue
		}
		restores++
		if err := ipt.Restore(context.Background(), input); err != nil {
			errs = append(errs, err)
			continue
		}
		g.log.Info("iptables rules applied", zap.Stringer("iptables", ipt), zap.Bool("served", served),
			zap.Int("lines", countLines(input)))
	}
	err = errors.Join(errs...)
	if err == nil {
		g.rulesDirty = false
	}
	return restores, err
}

func countLines(s string) int {
	n := 0
	for _, c := range s {
		if c == '\n' {
			n++
		}
	}
	return n
}

// destroyStaleSets destroys owned sets the glue does not use.
func (g *Glue) destroyStaleSets() []error {
	names, err := g.sets.ListNames()
	if err != nil {
		return []error{err}
	}
	used := map[string]bool{}
	for _, id := range setIDs(g.cfg.IPv4, g.cfg.IPv6) {
		used[id.name()] = true
	}
	var errs []error
	for _, n := range names {
		if !g.sets.Owns(n) || used[n] {
			continue
		}
		if err := g.syncer.Destroy(n); err != nil {
			errs = append(errs, err)
			continue
		}
		g.log.Info("destroyed an unused set", zap.String("set", n))
	}
	return errs
}
