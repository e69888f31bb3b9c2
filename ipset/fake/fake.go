// Package fake is an in-memory ipset.Interface. It keeps the sets a kernel
// would, enforces the same ownership rule, records every call and can inject
// errors, so that tests assert the exact writes a sync makes and its
// recovery.
package fake

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
)

// Call is one recorded call, rendered as a line such as
// "Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80 10.96.0.2,tcp:80".
type Call string

// ErrorFunc decides whether a call fails; it sees the rendered call.
type ErrorFunc func(call Call) error

// LatencyFunc tells how long a call takes, standing in for a slow kernel:
// it sees the call's name ("List", "Add", "Del") and the number of
// entries it read or wrote. The fake waits that long after the call,
// without holding its state.
type LatencyFunc func(call string, n int) time.Duration

// How the writes are rendered, by the fake and by the fault-injecting
// wrapper of the real kernel (faulty.go) alike; callWrite is "Add" or "Del",
// the set and the entries.
const (
	callCreate  = "Create %s %s %s"
	callDestroy = "Destroy %s"
	callSwap    = "Swap %s %s"
	callFlush   = "Flush %s"
	callWrite   = "%s %s %s"
)

type set struct {
	spec    ipset.Spec
	entries map[ipset.Entry]bool
	refs    uint32
}

// Sets is a fake kernel of IP sets.
type Sets struct {
	mu     sync.Mutex
	sets   map[string]*set
	calls  []Call
	inject ErrorFunc
	refuse RefuseFunc
	owner  ipset.Owner
	slow   LatencyFunc
}

// RefuseFunc decides whether a write refuses one entry of a set, as the
// kernel refuses one (a full set, an entry it does not take): the error
// becomes that entry's ipset.EntryError, and the call's other entries are
// written.
type RefuseFunc func(set string, e ipset.Entry) error

// RefuseEntries makes later writes ask fn about each entry (nil: none is
// refused).
func (f *Sets) RefuseEntries(fn RefuseFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = fn
}

var _ ipset.Interface = (*Sets)(nil)

// New returns an empty fake that owns what ipset.Owned owns.
func New() *Sets { return &Sets{sets: map[string]*set{}, owner: ipset.Owned} }

// SetOwner replaces the ownership rule.
func (f *Sets) SetOwner(o ipset.Owner) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owner = o
}

// SetLatency makes List, Add and Del take the time fn tells; nil: no
// latency.
func (f *Sets) SetLatency(fn LatencyFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slow = fn
}

// took is how long a call of n entries takes. Callers hold f.mu.
func (f *Sets) took(call string, n int) time.Duration {
	if f.slow == nil {
		return 0
	}
	return f.slow(call, n)
}

// InjectErrors installs fn; nil removes it.
func (f *Sets) InjectErrors(fn ErrorFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = fn
}

// Calls returns every call since the last ResetCalls.
func (f *Sets) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Writes returns the calls that change state (not List calls).
func (f *Sets) Writes() []Call {
	var out []Call
	for _, c := range f.Calls() {
		if !strings.HasPrefix(string(c), "List") {
			out = append(out, c)
		}
	}
	return out
}

// ResetCalls forgets recorded calls, keeping state.
func (f *Sets) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// SetReferences pretends that n iptables rules use the set (a referenced
// set cannot be destroyed).
func (f *Sets) SetReferences(name string, n uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sets[name]; ok {
		s.refs = n
	}
}

// Put creates or replaces a set with entries, bypassing ownership and
// recording no call: for a test's starting state (a foreign set, drift).
func (f *Sets) Put(spec ipset.Spec, entries ...ipset.Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &set{spec: spec.Normalized(), entries: map[ipset.Entry]bool{}}
	for _, e := range entries {
		s.entries[e] = true
	}
	f.sets[spec.Name] = s
}

// Entries returns a set's entries rendered and sorted; nil if it is missing.
func (f *Sets) Entries(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return nil
	}
	return render(s.entries)
}

// Names lists the sets, sorted.
func (f *Sets) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.sets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Dump renders every set, one line each: "NAME TYPE FAMILY: e1 e2 ...".
func (f *Sets) Dump() []string {
	var out []string
	for _, n := range f.Names() {
		f.mu.Lock()
		s := f.sets[n]
		line := fmt.Sprintf("%s %s %s:", n, s.spec.Type, s.spec.Family)
		for _, e := range render(s.entries) {
			line += " " + e
		}
		f.mu.Unlock()
		out = append(out, line)
	}
	return out
}

func render(m map[ipset.Entry]bool) []string {
	es := make([]ipset.Entry, 0, len(m))
	for e := range m {
		es = append(es, e)
	}
	slices.SortFunc(es, ipset.Entry.Compare)
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.String()
	}
	return out
}

// record appends a call and returns the injected error, if any. Callers
// hold f.mu.
func (f *Sets) record(format string, args ...any) error {
	c := Call(strings.TrimSpace(fmt.Sprintf(format, args...)))
	f.calls = append(f.calls, c)
	if f.inject != nil {
		return f.inject(c)
	}
	return nil
}

func (f *Sets) mustOwn(op, name string) error {
	if !f.owner(name) {
		return fmt.Errorf("ipset: %s %s: %w", op, name, ipset.ErrNotOwned)
	}
	return nil
}

// Owns implements ipset.Interface.
func (f *Sets) Owns(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owner(name)
}

// Create implements ipset.Interface.
func (f *Sets) Create(spec ipset.Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := spec.Validate(); err != nil {
		return err
	}
	spec = spec.Normalized()
	if err := f.record(callCreate, spec.Name, spec.Type, spec.Family); err != nil {
		return err
	}
	if err := f.mustOwn("create", spec.Name); err != nil {
		return err
	}
	if s, ok := f.sets[spec.Name]; ok {
		if s.spec != spec {
			return fmt.Errorf("ipset: create %s: %w", spec.Name, ipset.ErrMismatch)
		}
		return nil
	}
	f.sets[spec.Name] = &set{spec: spec, entries: map[ipset.Entry]bool{}}
	return nil
}

// Destroy implements ipset.Interface.
func (f *Sets) Destroy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(callDestroy, name); err != nil {
		return err
	}
	if err := f.mustOwn("destroy", name); err != nil {
		return err
	}
	s, ok := f.sets[name]
	if !ok {
		return nil
	}
	if s.refs > 0 {
		return fmt.Errorf("ipset: destroy %s: %w", name, ipset.ErrInUse)
	}
	delete(f.sets, name)
	return nil
}

// Swap implements ipset.Interface.
func (f *Sets) Swap(a, b string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(callSwap, a, b); err != nil {
		return err
	}
	if err := f.mustOwn("swap", a); err != nil {
		return err
	}
	if err := f.mustOwn("swap", b); err != nil {
		return err
	}
	sa, okA := f.sets[a]
	sb, okB := f.sets[b]
	if !okA || !okB {
		return fmt.Errorf("ipset: swap %s %s: %w", a, b, ipset.ErrNotFound)
	}
	if sa.spec.Type != sb.spec.Type || sa.spec.Family != sb.spec.Family {
		return fmt.Errorf("ipset: swap %s %s: %w", a, b, ipset.ErrMismatch)
	}
	// Names stay, contents and parameters move; references stay with the
	// name (the rules refer to the name).
	sa.entries, sb.entries = sb.entries, sa.entries
	sa.spec, sb.spec = sb.spec, sa.spec
	sa.spec.Name, sb.spec.Name = a, b
	return nil
}

// Flush implements ipset.Interface.
func (f *Sets) Flush(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(callFlush, name); err != nil {
		return err
	}
	if err := f.mustOwn("flush", name); err != nil {
		return err
	}
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("ipset: flush %s: %w", name, ipset.ErrNotFound)
	}
	clear(s.entries)
	return nil
}

// List implements ipset.Interface.
func (f *Sets) List(name string) (ipset.Set, error) {
	var wait time.Duration
	defer func() { time.Sleep(wait) }()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("List %s", name); err != nil {
		return ipset.Set{}, err
	}
	s, ok := f.sets[name]
	if !ok {
		return ipset.Set{}, fmt.Errorf("ipset: list %s: %w", name, ipset.ErrNotFound)
	}
	out := ipset.Set{Spec: s.spec, References: s.refs}
	for e := range s.entries {
		out.Entries = append(out.Entries, e)
	}
	wait = f.took("List", len(out.Entries))
	slices.SortFunc(out.Entries, ipset.Entry.Compare)
	return out, nil
}

// ListNames implements ipset.Interface.
func (f *Sets) ListNames() ([]string, error) {
	f.mu.Lock()
	err := f.record("ListNames")
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.Names(), nil
}

// Add implements ipset.Interface.
func (f *Sets) Add(name string, entries ...ipset.Entry) error {
	return f.write("Add", name, entries, true)
}

// Del implements ipset.Interface.
func (f *Sets) Del(name string, entries ...ipset.Entry) error {
	return f.write("Del", name, entries, false)
}

func (f *Sets) write(op, name string, entries []ipset.Entry, add bool) error {
	var wait time.Duration
	defer func() { time.Sleep(wait) }()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(entries) == 0 {
		return nil
	}
	wait = f.took(op, len(entries))
	rendered := make([]string, len(entries))
	for i, e := range entries {
		rendered[i] = e.String()
	}
	if err := f.record(callWrite, op, name, strings.Join(rendered, " ")); err != nil {
		return err
	}
	if err := f.mustOwn(strings.ToLower(op), name); err != nil {
		return err
	}
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("ipset: %s %s: %w", strings.ToLower(op), name, ipset.ErrNotFound)
	}
	// Like the kernel: an entry refused does not stop the others, and a
	// hash set refuses entries past its maxelem.
	var errs []error
	for _, e := range entries {
		refused := s.spec.Type.Check(s.spec.Family, e)
		if refused == nil && add && !s.entries[e] && s.spec.MaxElem > 0 && len(s.entries) >= int(s.spec.MaxElem) {
			refused = ipset.ErrSetFull
		}
		if refused == nil && f.refuse != nil {
			refused = f.refuse(name, e)
		}
		if refused != nil {
			errs = append(errs, &ipset.EntryError{Op: strings.ToLower(op), Set: name, Entry: e, Err: refused})
			continue
		}
		if add {
			s.entries[e] = true
		} else {
			delete(s.entries, e)
		}
	}
	return errors.Join(errs...)
}
