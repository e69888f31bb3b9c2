package glue

// Failures charged to Services: entries a set refused on their own (a full
// set, an entry the kernel does not take) fail the Services that want
// them, not the node: they are reported (consumer.ServiceReporter), the set
// is written again after the glue's backoff, and every other Service's
// entries are written meanwhile. (A Service over its limits is refused
// whole by the model, model.Limits: it reaches the glue with no virtual
// server.)

import (
	"fmt"
	"slices"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
)

var _ consumer.ServiceReporter = (*Glue)(nil)

// maxFailureText bounds what one Service's failure says (an Event's text).
const maxFailureText = 300

// entriesOf is what a Service's plan puts in the sets: none in SERVICE
// while a set that restricts its virtual servers refuses its entries
// (withheld).
func (g *Glue) entriesOf(name types.NamespacedName) held {
	next := serviceEntries(g.plans[name], g.nodeAddrs)
	if g.withheld[name] {
		next = slices.DeleteFunc(slices.Clone(next), func(se setEntry) bool { return se.set.id().base == setService })
	}
	return next
}

// afterSetSync takes a set's sync error: entries the set refused on their
// own are charged to the Services that want them (the set stays dirty and
// is written again after the glue's backoff: Retry), and only an error of
// the set or the call is the node's, returned; it leaves the charges and
// holds of the set's last sync as they were (it says nothing of them).
func (g *Glue) afterSetSync(id setID, err error) error {
	if err == nil {
		delete(g.dirty, id)
		delete(g.partial, id)
		g.charge(id, nil)
		return nil
	}
	refused, only := ipset.RefusedEntries(err)
	if !only {
		return g.setError(id, err)
	}
	g.partial[id] = struct{}{}
	charged := g.owners(id, refused)
	g.charge(id, charged)
	g.log.Warn("ipset refused entries; charged to the Services that want them", zap.String("set", id.name()),
		zap.Strings("services", names(charged)), zap.Int("entries", len(refused)), zap.Error(err))
	return nil
}

// owners maps the Services whose entries in set id the kernel refused to
// what it said of the first one: one pass over the Services' entries.
func (g *Glue) owners(id setID, refused []*ipset.EntryError) map[types.NamespacedName]string {
	why := make(map[ipset.Key]string, len(refused))
	for _, ee := range refused {
		why[ee.Entry.Key()] = fmt.Sprintf("set %s refused entry %s: %v", id.name(), ee.Entry, ee.Err)
	}
	ref := refOf(id)
	out := map[types.NamespacedName]string{}
	for name, h := range g.contrib {
		for _, se := range h {
			if w, ok := why[se.k]; ok && se.set == ref {
				if _, seen := out[name]; !seen {
					out[name] = truncate(w, maxFailureText)
				}
			}
		}
	}
	return out
}

// truncate cuts s to n bytes at most.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// charge records the Services a set's last sync refused entries of (none:
// the set took them all); for a set that restricts virtual servers, a
// Service charged there is withheld from SERVICE until the set takes its
// entries, and one no longer charged is let back in.
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

// ServiceFailures implements consumer.ServiceReporter: the Services whose
// entries a set refused at its last sync.
func (g *Glue) ServiceFailures() map[types.NamespacedName]string {
	out := map[types.NamespacedName]string{}
	for _, charged := range g.refused {
		for name, why := range charged {
			if _, ok := out[name]; !ok {
				out[name] = why
			}
		}
	}
	return out
}

// Retry implements consumer.ServiceReporter: a set's last sync had
// entries refused, so it is to be written again (whoever wanted them).
func (g *Glue) Retry() bool { return len(g.partial) > 0 }

// names lists the Services' names, sorted.
func names(m map[types.NamespacedName]string) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}
