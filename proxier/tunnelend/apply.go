package tunnelend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// apply makes the kernel hold want. Set-up comes before the marks (an
// outer packet marked is then delivered), removal after them. read: the
// kernel is read and repaired, else only what differs from t.last is
// written.
func (t *TunnelEnd) apply(ctx context.Context, want state, read bool) error {
	var errs []error
	if want.routing {
		if read || !t.last.routing {
			errs = append(errs, t.device(), t.routing(true))
		}
		errs = append(errs, t.addFou(want.fou, read))
	}
	errs = append(errs, t.iptables(ctx, want.tables, read))
	if !want.routing && (read || t.last.routing) {
		errs = append(errs, t.routing(false))
	}
	errs = append(errs, t.delFou(want.fou))
	return errors.Join(errs...)
}

// device puts tunl0 up and its rp_filter at 0 (all's must be 0 already:
// nodeNotReady).
func (t *TunnelEnd) device() error {
	l, err := t.k.Net.Link(Device)
	if err != nil {
		return fmt.Errorf("read %s: %w", Device, err)
	}
	if !l.Up {
		if err := t.k.Net.SetUp(Device); err != nil {
			return fmt.Errorf("set %s up: %w", Device, err)
		}
		t.log.Info("tunnel device set up", zap.String("device", Device))
	}
	old, err := t.k.Sysctls.Ensure(sysctlDeviceRPFilter, "0")
	if err != nil {
		return fmt.Errorf("set %s's rp_filter to 0: %w", Device, err)
	}
	if old != "0" {
		t.log.Info("set the tunnel device's rp_filter to 0 (decapsulated packets come from clients it has no route to)",
			zap.String("device", Device), zap.String("was", old))
	}
	return nil
}

// routing makes the policy rule and the local route of Table present
// (on) or absent, and removes any other rule of ours and route of Table.
func (t *TunnelEnd) routing(on bool) error {
	rule := Rule{Priority: t.cfg.RulePriority, Mark: t.marks.flag, Mask: t.marks.flag, Table: t.cfg.Table}
	route := Route{Table: t.cfg.Table, Local: true, Dst: "0.0.0.0/0", Dev: "lo"}
	var errs []error
	// The route first when adding: the rule then never looks up an empty
	// table (which would fall through to main and forward into the pod).
	if on {
		errs = append(errs, ensure(route, on, t.k.Net.Routes, t.cfg.Table, t.k.Net.AddRoute, t.k.Net.DelRoute,
			func(Route) bool { return true }))
	}
	errs = append(errs, ensure(rule, on, t.k.Net.Rules, t.cfg.RulePriority, t.k.Net.AddRule, t.k.Net.DelRule,
		func(r Rule) bool { return r.Table == t.cfg.Table }))
	if !on {
		errs = append(errs, ensure(route, on, t.k.Net.Routes, t.cfg.Table, t.k.Net.AddRoute, t.k.Net.DelRoute,
			func(Route) bool { return true }))
	}
	return errors.Join(errs...)
}

// ensure lists what is at key, deletes what ours tells is ours but not
// want (or want too when !on), and adds want if on and missing.
func ensure[T comparable](want T, on bool, list func(int) ([]T, error), key int, add, del func(T) error, ours func(T) bool) error {
	have, err := list(key)
	if err != nil {
		return fmt.Errorf("list %d: %w", key, err)
	}
	var errs []error
	found := false
	for _, h := range have {
		switch {
		case h == want && on:
			found = true
		case ours(h):
			if err := del(h); err != nil {
				errs = append(errs, fmt.Errorf("delete %v: %w", h, err))
			}
		}
	}
	if on && !found {
		if err := add(want); err != nil {
			errs = append(errs, fmt.Errorf("add %v: %w", want, err))
		}
	}
	return errors.Join(errs...)
}

// addFou opens fou's GUE receive ports that want names.
func (t *TunnelEnd) addFou(want []uint16, read bool) error {
	if len(want) == 0 {
		return nil // no GUE: the fou module need not even be loaded
	}
	var have []uint16
	switch {
	case read:
		var err error
		if have, err = t.k.Net.FouPorts(); err != nil {
			return fmt.Errorf("list GUE ports: %w", err)
		}
	case t.last != nil:
		have = t.last.fou
	}
	var errs []error
	for _, p := range want {
		if slices.Contains(have, p) {
			continue
		}
		if err := t.k.Net.AddFou(p); err != nil {
			errs = append(errs, fmt.Errorf("open GUE port %d (is the fou module loaded?): %w", p, err))
			continue
		}
		t.addedFou[p] = true
		t.log.Info("GUE receive port opened", zap.Uint16("port", p))
	}
	return errors.Join(errs...)
}

// delFou closes the GUE ports this agent opened that want no longer names.
func (t *TunnelEnd) delFou(want []uint16) error {
	var errs []error
	for _, p := range slices.Sorted(maps.Keys(t.addedFou)) {
		if slices.Contains(want, p) {
			continue
		}
		if err := t.k.Net.DelFou(p); err != nil {
			errs = append(errs, fmt.Errorf("close GUE port %d: %w", p, err))
			continue
		}
		delete(t.addedFou, p)
		t.log.Info("GUE receive port closed", zap.Uint16("port", p))
	}
	return errors.Join(errs...)
}

// iptables writes the tables: against the kernel's rules when read,
// against what the last sync wrote otherwise (nothing if equal).
func (t *TunnelEnd) iptables(ctx context.Context, want []glue.Table, read bool) error {
	var input string
	switch {
	case read:
		saved, err := t.k.Tables.Save(ctx)
		if err != nil {
			return err
		}
		normalize(saved)
		input = glue.RestoreInput(want, saved, owns) + natOrder(saved)
	case !slices.EqualFunc(want, t.last.tables, tableEqual):
		input = glue.RestoreInput(want, asSaved(t.last.tables), owns)
	}
	if input == "" {
		return nil
	}
	return t.k.Tables.Restore(ctx, input)
}

func tableEqual(a, b glue.Table) bool {
	return a.Name == b.Name && slices.Equal(a.Chains, b.Chains) && slices.Equal(a.Jumps, b.Jumps) && slices.Equal(a.Rules, b.Rules)
}
