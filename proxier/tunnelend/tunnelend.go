package tunnelend

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// TunnelEnd ends, on this node, the tunnels that IPVS on any node sends to
// the endpoints on this node of Services whose external traffic is
// tunnelled (README.md says what each hook does and why). Only the sync
// loop calls its methods.
type TunnelEnd struct {
	cfg   Config
	marks marks
	k     Kernel
	log   *zap.Logger

	services map[types.NamespacedName]*service
	// held are ends that left their Service while their endpoint stayed
	// on the node, kept until the time they map to.
	held map[heldKey]time.Time
	// ids numbers the endpoints' addresses (the marks' id bits).
	ids      map[netip.Addr]int
	failures map[types.NamespacedName]string
	retry    bool
	// last is what the last successful Sync left; nil: unknown, the next
	// Sync reads the kernel.
	last *state
	// addedFou are the GUE ports this agent added: the only ones it
	// removes.
	addedFou map[uint16]bool
}

type service struct {
	ends  []End
	local map[netip.Addr]bool
}

type heldKey struct {
	svc types.NamespacedName
	end End
}

// state is what the node holds for the ends.
type state struct {
	tables  []glue.Table
	routing bool
	fou     []uint16
}

// New returns tunnel ends that program k.
func New(cfg Config, k Kernel, log *zap.Logger) (*TunnelEnd, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel ends: %w", err)
	}
	cfg = cfg.withDefaults()
	return &TunnelEnd{cfg: cfg, marks: newMarks(cfg.MarkMask), k: k, log: log,
		services: map[types.NamespacedName]*service{}, held: map[heldKey]time.Time{}, ids: map[netip.Addr]int{},
		failures: map[types.NamespacedName]string{}, addedFou: map[uint16]bool{}}, nil
}

// Name implements consumer.Consumer.
func (t *TunnelEnd) Name() string { return "tunnel-ends" }

// SetEnds records the tunnel ends of a Service on this node, and local,
// the addresses of all the Service's endpoints on this node whatever their
// forwarding. An end that leaves is held for the grace while its
// endpoint's address stays in local; ends and local both empty: the
// Service is gone.
func (t *TunnelEnd) SetEnds(svc types.NamespacedName, ends []End, local []netip.Addr) {
	now := t.cfg.Clock.Now()
	s := &service{ends: slices.Clone(ends), local: map[netip.Addr]bool{}}
	for _, a := range local {
		s.local[a] = true
	}
	if old := t.services[svc]; old != nil {
		for _, e := range old.ends {
			if !slices.Contains(ends, e) && s.local[e.Endpoint.Addr()] {
				t.held[heldKey{svc, e}] = now.Add(t.cfg.Grace)
				t.log.Info("tunnel end left its Service: held for the grace", zap.String("service", svc.String()),
					zap.Stringer("end", e), zap.Duration("grace", t.cfg.Grace))
			}
		}
	}
	for k := range t.held {
		if k.svc == svc && (slices.Contains(ends, k.end) || !s.local[k.end.Endpoint.Addr()]) {
			delete(t.held, k)
		}
	}
	if len(ends) == 0 && len(local) == 0 {
		delete(t.services, svc)
		return
	}
	t.services[svc] = s
}

// NextExpiry is when the first held end's grace ends (ok false if none
// is held): a Sync then removes it.
func (t *TunnelEnd) NextExpiry() (at time.Time, ok bool) {
	for _, until := range t.held {
		if !ok || until.Before(at) {
			at, ok = until, true
		}
	}
	return at, ok
}

// ServiceFailures implements consumer.ServiceReporter.
func (t *TunnelEnd) ServiceFailures() map[types.NamespacedName]string { return maps.Clone(t.failures) }

// Retry implements consumer.ServiceReporter: a node not ready for tunnel
// ends (rp_filter, no tunl0) may become ready.
func (t *TunnelEnd) Retry() bool { return t.retry }

// Sync programs the ends: a partial sync writes what changed since the
// last one, a full one reads the kernel and repairs it. It removes only
// what it owns: chains named ChainPrefix*, the rule at RulePriority that
// looks up Table, the routes of Table, and GUE ports it added.
func (t *TunnelEnd) Sync(full bool) error {
	now := t.cfg.Clock.Now()
	for k, until := range t.held {
		if !now.Before(until) {
			delete(t.held, k)
			t.log.Info("tunnel end's grace is over: removed", zap.String("service", k.svc.String()), zap.Stringer("end", k.end))
		}
	}
	t.failures, t.retry = map[types.NamespacedName]string{}, false
	ends := t.selectEnds()
	if len(ends) > 0 {
		if reason := t.nodeNotReady(); reason != "" {
			for _, o := range ends {
				t.fail(o.svc, reason)
			}
			t.retry, ends = true, nil
		}
	}
	if t.last == nil && len(t.ids) == 0 {
		t.recoverNumbers()
	}
	want := state{tables: tables(t.marks, t.cfg.MTU, t.number(ends)), routing: len(ends) > 0, fou: guePorts(ends)}
	if err := t.apply(context.Background(), want, full || t.last == nil); err != nil {
		t.last = nil
		return fmt.Errorf("tunnel ends: %w", err)
	}
	t.last = &want
	return nil
}

// owned is an end and the Service it is programmed for.
type owned struct {
	End
	svc types.NamespacedName
}

func (t *TunnelEnd) fail(svc types.NamespacedName, reason string) {
	if _, ok := t.failures[svc]; ok {
		return
	}
	t.failures[svc] = reason
	t.log.Warn("tunnel ends not programmed", zap.String("service", svc.String()), zap.String("reason", reason))
}

// selectEnds returns the ends to program, sorted: each Service's in the
// order of their names, each Service whole or not at all within MaxEnds,
// then the held ones. An end that is not valid, or whose VIP, port and
// endpoint address another Service already ends otherwise, fails alone; a
// held end whose key an active end took (its target port changed) goes.
func (t *TunnelEnd) selectEnds() []owned {
	var out []owned
	taken := map[End]types.NamespacedName{} // by key: target port and encapsulation zeroed
	add := func(svc types.NamespacedName, e End, held bool) {
		k := e
		k.Endpoint, k.Forward, k.GUEPort = netip.AddrPortFrom(e.Endpoint.Addr(), 0), 0, 0
		if other, ok := taken[k]; ok {
			if !held && !slices.Contains(out, owned{e, svc}) {
				t.fail(svc, fmt.Sprintf("%s: %s ends the same VIP, port and endpoint otherwise", e, other))
			}
			return
		}
		taken[k] = svc
		out = append(out, owned{e, svc})
	}
	for _, name := range slices.SortedFunc(maps.Keys(t.services), cmpName) {
		var valid []End
		for _, e := range t.services[name].ends {
			if err := e.check(); err != nil {
				t.fail(name, err.Error())
				continue
			}
			valid = append(valid, e)
		}
		if len(out)+len(valid) > t.cfg.MaxEnds {
			t.fail(name, fmt.Sprintf("over the node's limit of %d tunnel ends (%d taken, the Service wants %d)", t.cfg.MaxEnds, len(out), len(valid)))
			continue
		}
		for _, e := range valid {
			add(name, e, false)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(t.held), cmpHeld) {
		add(k.svc, k.end, true)
	}
	slices.SortFunc(out, func(a, b owned) int { return cmpEnd(a.End, b.End) })
	return out
}

// nodeNotReady tells why the node cannot end tunnels, "" if it can. The
// agent never lowers all.rp_filter itself: that is the node's policy.
func (t *TunnelEnd) nodeNotReady() string {
	v, err := t.k.Sysctls.Get(sysctlAllRPFilter)
	if err != nil {
		return "cannot read net.ipv4.conf.all.rp_filter: " + err.Error()
	}
	if v != "0" {
		return fmt.Sprintf("net.ipv4.conf.all.rp_filter is %s on this node: tunnelled packets are dropped as martians unless it is 0 "+
			"(the agent does not lower it; set it to 0 on the node, or keep the Service's forwarding nat)", v)
	}
	l, err := t.k.Net.Link(Device)
	switch {
	case err != nil:
		return "cannot read " + Device + ": " + err.Error()
	case !l.Exists:
		return "no " + Device + " on this node: load the ipip module (ipvs-proxy preflight --load-modules does)"
	}
	return ""
}

// number gives each endpoint address a number for its mark, keeping the
// numbers of those that stay; an end that finds no free number fails.
func (t *TunnelEnd) number(ends []owned) []numbered {
	wanted := map[netip.Addr]bool{}
	for _, o := range ends {
		wanted[o.Endpoint.Addr()] = true
	}
	used := map[int]bool{}
	for a, id := range t.ids {
		if !wanted[a] {
			delete(t.ids, a)
			continue
		}
		used[id] = true
	}
	next := 1
	var out []numbered
	for _, o := range ends {
		a := o.Endpoint.Addr()
		if _, ok := t.ids[a]; !ok {
			for used[next] {
				next++
			}
			if next > t.marks.max {
				t.fail(o.svc, fmt.Sprintf("%s: no free mark for another endpoint (mark mask %#x numbers %d)", o.End, t.marks.mask, t.marks.max))
				continue
			}
			t.ids[a], used[next] = next, true
		}
		out = append(out, numbered{o.End, t.ids[a]})
	}
	return out
}

func guePorts(ends []owned) []uint16 {
	var ports []uint16
	for _, o := range ends {
		if o.GUEPort != 0 && !slices.Contains(ports, o.GUEPort) {
			ports = append(ports, o.GUEPort)
		}
	}
	slices.Sort(ports)
	return ports
}

func cmpName(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

func cmpHeld(a, b heldKey) int { return cmp.Or(cmpName(a.svc, b.svc), cmpEnd(a.end, b.end)) }

func cmpEnd(a, b End) int {
	return cmp.Or(a.VIP.Compare(b.VIP), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port),
		a.Endpoint.Compare(b.Endpoint), cmp.Compare(a.Forward, b.Forward), cmp.Compare(a.GUEPort, b.GUEPort))
}
