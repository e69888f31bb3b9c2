package glue

// Failures charged to Services: a Service whose entries are over its limit,
// or whose entries a set refused (a full set, an entry the kernel does not
// take), fails alone. Its entries are left out or retried, it is reported
// (consumer.ServiceReporter), and the glue, the node and every other
// Service stay healthy.

import (
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
)

var _ consumer.ServiceReporter = (*Glue)(nil)

// maxChargedEntries bounds the refused entries of one set sync whose owners
// are looked up (each lookup searches every Service's entries); the rest
// are retried with the set, unnamed.
const maxChargedEntries = 64

// entriesOf is what a Service's plan puts in the sets: none when they are
// over the limit, and none in SERVICE while its restrictions are refused
// (withheld).
func (g *Glue) entriesOf(name types.NamespacedName) held {
	next := serviceEntries(g.plans[name], g.nodeAddrs)
	if limit := g.cfg.SetEntriesPerService; limit > 0 && len(next) > limit {
		g.overLimit[name] = fmt.Sprintf("not accepted on this node: the Service wants %d entries in the iptables glue's sets, more than the limit of %d", len(next), limit)
		return nil
	}
	delete(g.overLimit, name)
	if g.withheld[name] {
		next = slices.DeleteFunc(slices.Clone(next), func(se setEntry) bool { return se.set.id().base == setService })
	}
	return next
}

// afterSetSync takes a set's sync error: entries the set refused are
// charged to the Services that want them (the set stays dirty, so a later
// sync writes them again), and only an error of the set or the call is
// the node's, returned.
func (g *Glue) afterSetSync(id setID, err error) error {
	refused, only := ipset.RefusedEntries(err)
	charged := map[types.NamespacedName]string{}
	if only {
		for i, k := range refused {
			if i == maxChargedEntries {
				break
			}
			for _, name := range g.owners(id, k) {
				if _, ok := charged[name]; !ok {
					charged[name] = fmt.Sprintf("set %s refused entry %s: %v", id.name(), k.Entry(), err)
				}
			}
		}
	}
	g.charge(id, charged)
	switch {
	case err == nil:
		delete(g.dirty, id)
		return nil
	case only:
		g.log.Warn("ipset refused entries; charged to the Services that want them", zap.String("set", id.name()),
			zap.Strings("services", names(charged)), zap.Int("entries", len(refused)), zap.Error(err))
		return nil
	}
	return g.setError(id, err)
}

// owners are the Services whose entries hold k in set id.
func (g *Glue) owners(id setID, k ipset.Key) []types.NamespacedName {
	want := setEntry{refOf(id), k}
	var out []types.NamespacedName
	for name, h := range g.contrib {
		if _, ok := slices.BinarySearchFunc(h, want, setEntry.compare); ok {
			out = append(out, name)
		}
	}
	return out
}

// charge records the Services a set's last sync failed for; for a set that
// restricts virtual servers, a Service charged there is withheld from
// SERVICE until the set takes its entries, and one no longer charged is
// let back in.
func (g *Glue) charge(id setID, charged map[types.NamespacedName]string) {
	before := g.refused[id]
	if len(charged) == 0 {
		delete(g.refused, id)
	} else {
		g.refused[id] = charged
	}
	if !restricts(id.base) {
		return
	}
	for name := range charged {
		if _, was := before[name]; !was && !g.withheld[name] {
			g.withheld[name] = true
			g.recompute(name)
		}
	}
	for name := range before {
		if _, still := charged[name]; !still && g.withheld[name] && !g.restrictionRefused(name) {
			delete(g.withheld, name)
			g.recompute(name)
		}
	}
}

// restrictionRefused reports whether a set that restricts virtual servers
// refused the Service's entries at its last sync.
func (g *Glue) restrictionRefused(name types.NamespacedName) bool {
	for id, charged := range g.refused {
		if _, ok := charged[name]; ok && restricts(id.base) {
			return true
		}
	}
	return false
}

// ServiceFailures implements consumer.ServiceReporter: the Services over
// their limit and those whose entries a set refused at its last sync.
func (g *Glue) ServiceFailures() map[types.NamespacedName]string {
	out := make(map[types.NamespacedName]string, len(g.overLimit))
	maps.Copy(out, g.overLimit)
	for _, charged := range g.refused {
		for name, why := range charged {
			if _, ok := out[name]; !ok {
				out[name] = why
			}
		}
	}
	return out
}

// Retry implements consumer.ServiceReporter: a set refused entries.
func (g *Glue) Retry() bool { return len(g.refused) > 0 }

// names lists the Services' names, sorted.
func names(m map[types.NamespacedName]string) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}
