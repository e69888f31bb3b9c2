package ipset

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"time"
)

// Contents is a set of entries: what a set should hold, or holds.
type Contents map[Key]struct{}

// ContentsOf returns the entries as Contents.
func ContentsOf(es ...Entry) Contents {
	c := make(Contents, len(es))
	for _, e := range es {
		c[e.Key()] = struct{}{}
	}
	return c
}

// Wanted is what a set should hold: Contents, or any other set of entries
// (the glue passes its reference counts, Counts, a Mirrored).
type Wanted interface {
	Has(Key) bool
	Len() int
	All() iter.Seq[Key]
}

// Has reports whether k is in c.
func (c Contents) Has(k Key) bool { _, ok := c[k]; return ok }

// Len is the number of entries.
func (c Contents) Len() int { return len(c) }

// All yields the entries in no order.
func (c Contents) All() iter.Seq[Key] { return maps.Keys(c) }

// Stats count what a Syncer did.
type Stats struct {
	Reads   int  // dumps of a set
	Added   int  // entries added to a live set
	Deleted int  // entries deleted from a live set
	Rebuilt bool // a new set was filled and swapped in (Added counts its entries)
	Created bool // the set did not exist
	// ReadTime is the time spent reading the set (Reads).
	ReadTime time.Duration
}

// Writes is the number of entry writes.
func (s Stats) Writes() int { return s.Added + s.Deleted }

// Syncer keeps owned sets equal to desired contents. It remembers what it
// last read or wrote of each set (its view), so that an update diffs against
// memory and writes only the difference; a reread dumps the set first and
// repairs drift. Of a set synced to a Mirrored the view keeps no copy: once
// the set holds what the Mirrored wanted, the Mirrored itself tells what the
// set holds, and which entries changed since. When writing the difference would take more writes than
// writing the contents afresh (by a margin), or the set's parameters differ
// from its spec, it fills a new set and swaps it in: rules that use the set see the old contents, then the new, never a
// half-written set. Not safe for concurrent use.
type Syncer struct {
	sets Interface
	view map[string]*viewed
	// track holds, per set named to Track, what was written to it since:
	// a read made meanwhile may or may not show those writes.
	track map[string]*written
}

// written is what a Syncer wrote to a set since Track.
type written struct {
	entries map[Key]struct{}
	all     bool // the set was rebuilt, created or forgotten
}

type viewed struct {
	temp bool // a rebuild's temporary set: Forget keeps knowing it exists
	spec Spec
	// entries is what the set holds; nil and not mirrored: unknown,
	// reread before the next diff.
	entries Contents
	// mirror, when not nil: the set holds what this Mirrored held at its
	// last Synced (entries is nil).
	mirror Mirrored
}

// lookup returns what the view knows of the set's entries for a sync to
// want; known is false when it knows nothing (no view, a failed write
// forgot it, or a mirrored view and a want that is not its Mirrored).
func (v *viewed) lookup(want Wanted) (has func(Key) bool, known bool) {
	switch {
	case v == nil:
		return nil, false
	case v.mirror != nil:
		if m, ok := want.(Mirrored); !ok || m != v.mirror {
			return nil, false
		}
		return v.mirror.Held, true
	case v.entries == nil:
		return nil, false
	}
	return v.entries.Has, true
}

// forget makes the view's entries unknown.
func (v *viewed) forget() {
	v.entries, v.mirror = nil, nil
}

// holds records that the set now holds exactly want: a Mirrored is told so
// and stands for the view's copy; otherwise a view without a copy gets one
// (one with a copy was kept by apply).
func (v *viewed) holds(want Wanted) {
	if m, ok := want.(Mirrored); ok {
		v.entries, v.mirror = nil, m
		m.Synced()
		return
	}
	if v.entries != nil {
		return
	}
	v.entries = make(Contents, want.Len())
	for e := range want.All() {
		v.entries[e] = struct{}{}
	}
}

// NewSyncer returns a Syncer with an empty view.
func NewSyncer(sets Interface) *Syncer {
	return &Syncer{sets: sets, view: map[string]*viewed{}, track: map[string]*written{}}
}

// Track starts recording the writes to the named sets, for SyncRead: call
// it just before a read of them begins elsewhere (another goroutine may
// read them while this one writes).
func (s *Syncer) Track(names ...string) {
	for _, n := range names {
		s.track[n] = &written{entries: map[Key]struct{}{}}
	}
}

// Untrack stops recording the writes to every set.
func (s *Syncer) Untrack() { clear(s.track) }

// wrote records writes of entries to a tracked set.
func (s *Syncer) wrote(name string, entries []Key) {
	if w := s.track[name]; w != nil {
		for _, k := range entries {
			w.entries[k] = struct{}{}
		}
	}
}

// wroteAll records that a tracked set was rebuilt, created or forgotten.
func (s *Syncer) wroteAll(name string) {
	if w := s.track[name]; w != nil {
		w.all = true
	}
}

// SyncRead is Sync with a reread whose read was made elsewhere, since
// Track named the set: cur and readErr are that read's result. The
// entries this Syncer wrote since Track are taken from its view (the read
// may have seen them before or after the write), the others from cur, so
// that drift is repaired without undoing a later write. Without a record
// since Track or a current view (a failed write forgot it), or when the
// read found no set, it rereads the set itself. It stops tracking the set.
func (s *Syncer) SyncRead(spec Spec, want Wanted, cur Set, readErr error) (Stats, error) {
	spec = spec.Normalized()
	w := s.track[spec.Name]
	delete(s.track, spec.Name)
	v := s.view[spec.Name]
	has, known := v.lookup(want)
	switch {
	case readErr != nil && !errors.Is(readErr, ErrNotFound):
		return Stats{Reads: 1}, readErr
	case w == nil || readErr != nil || !known || v.spec != spec:
		return s.Sync(spec, want, true)
	case w.all: // rebuilt since: the view is as fresh as any read
		st, err := s.Sync(spec, want, false)
		st.Reads++
		return st, err
	}
	if cur.Type != spec.Type || cur.Family != spec.Family {
		return Stats{Reads: 1}, mismatch(spec, cur)
	}
	nv := &viewed{spec: cur.Spec.Normalized(), entries: make(Contents, len(cur.Entries))}
	for _, e := range cur.Entries {
		nv.entries[e.Key()] = struct{}{}
	}
	for e := range w.entries {
		if has(e) {
			nv.entries[e] = struct{}{}
		} else {
			delete(nv.entries, e)
		}
	}
	s.view[spec.Name] = nv
	st, err := s.Sync(spec, want, false)
	st.Reads++
	return st, err
}

// rebuildGain is how many writes a rebuild must save over the difference
// before it is chosen (it costs four calls of its own).
const rebuildGain = 100

// TempName is the name of the set a rebuild fills before the swap.
func TempName(name string) string {
	const suffix = "-N"
	if len(name)+len(suffix) > MaxNameLen {
		name = name[:MaxNameLen-len(suffix)]
	}
	return name + suffix
}

// Sync makes the set spec.Name hold exactly want. With reread, or when the
// view does not know the set, it dumps the set first (creating it if
// missing); otherwise it trusts the view. After a failed write the set is
// forgotten, so the next Sync rereads it.
func (s *Syncer) Sync(spec Spec, want Wanted, reread bool) (Stats, error) {
	var st Stats
	spec = spec.Normalized()
	if err := spec.Validate(); err != nil {
		return st, err
	}
	if !s.sets.Owns(spec.Name) {
		return st, fmt.Errorf("ipset: sync %s: %w", spec.Name, ErrNotOwned)
	}
	v := s.view[spec.Name]
	if _, known := v.lookup(want); reread || !known || v.spec != spec {
		var err error
		if v, err = s.read(spec, &st); err != nil {
			delete(s.view, spec.Name)
			return st, err
		}
		s.view[spec.Name] = v
	}

	var add, del []Key
	if v.mirror != nil {
		add, del = changes(v.mirror) // lookup made sure want is it
	} else {
		add, del = difference(want, v.entries)
	}
	// Only what is written is checked: what the set holds, it accepted.
	for _, k := range add {
		if err := spec.Type.Check(spec.Family, k.Entry()); err != nil {
			return st, fmt.Errorf("ipset: set %s: %w", spec.Name, err)
		}
	}
	if _, ok := want.(Mirrored); ok {
		v.entries = nil // not kept up to date by apply: the Mirrored stands for it once synced
	}
	if len(add) == 0 && len(del) == 0 && v.spec == spec {
		v.holds(want)
		return st, s.dropTemp(spec.Name)
	}
	if v.spec != spec || (len(add)+len(del) > want.Len()+rebuildGain && !st.Created) {
		err := s.rebuild(spec, want, &st)
		if err != nil && s.view[spec.Name] == v {
			v.forget()
		}
		return st, err
	}
	if err := s.apply(spec.Name, v, add, del, &st); err != nil {
		return st, err
	}
	v.holds(want)
	return st, s.dropTemp(spec.Name)
}

// changes is what to add and delete to make a set that holds what m held
// hold what it wants: the entries it changed, the cost of the change.
func changes(m Mirrored) (add, del []Key) {
	for e := range m.Changed() {
		switch wanted, held := m.Has(e), m.Held(e); {
		case wanted && !held:
			add = append(add, e)
		case !wanted && held:
			del = append(del, e)
		}
	}
	return add, del
}

// difference is what to add to have, and what to delete from it, to get
// want.
func difference(want Wanted, have Contents) (add, del []Key) {
	// Room for a cold sync's additions (every wanted entry, into an empty
	// set) at once: grown by append, 50,000 keys left their copies behind.
	add = make([]Key, 0, max(0, want.Len()-len(have)))
	for e := range want.All() {
		if _, ok := have[e]; !ok {
			add = append(add, e)
		}
	}
	for e := range have {
		if !want.Has(e) {
			del = append(del, e)
		}
	}
	return add, del
}

// apply adds, then deletes, entries of a live set and keeps the view's
// copy, if it has one (the caller records a mirrored view's new contents:
// viewed.holds). A failed write forgets the view. Entries the kernel
// refuses on their own (EntryError) do not hold the deletions up: other
// owners' removals (a narrowed source range) must not wait for them.
func (s *Syncer) apply(name string, v *viewed, add, del []Key, st *Stats) error {
	// Additions first: for a moment the set holds old and new entries,
	// never neither.
	s.wrote(name, add)
	addErr := s.write(name, add, true)
	if addErr != nil {
		v.forget()
		s.wroteAll(name)
		refused, only := RefusedEntries(addErr)
		if !only {
			return addErr
		}
		st.Added += len(add) - len(refused)
	} else {
		st.Added += len(add)
		if v.entries != nil {
			for _, e := range add {
				v.entries[e] = struct{}{}
			}
		}
	}
	s.wrote(name, del)
	if err := s.write(name, del, false); err != nil {
		v.forget()
		s.wroteAll(name)
		return errors.Join(addErr, err)
	}
	st.Deleted += len(del)
	if v.entries != nil {
		for _, e := range del {
			delete(v.entries, e)
		}
	}
	return addErr
}

// read dumps the set, creating it if missing. A set whose parameters differ
// from spec (another capacity) is returned with its own spec, so that Sync
// rebuilds it; one of another type or family cannot be swapped and is an
// error.
func (s *Syncer) read(spec Spec, st *Stats) (*viewed, error) {
	st.Reads++
	start := time.Now()
	cur, err := s.sets.List(spec.Name)
	st.ReadTime += time.Since(start)
	if errors.Is(err, ErrNotFound) {
		s.wroteAll(spec.Name)
		if err := s.sets.Create(spec); err != nil {
			return nil, err
		}
		st.Created = true
		return &viewed{spec: spec, entries: Contents{}}, nil
	}
	if err != nil {
		return nil, err
	}
	if cur.Type != spec.Type || cur.Family != spec.Family {
		return nil, mismatch(spec, cur)
	}
	v := &viewed{spec: cur.Spec.Normalized(), entries: make(Contents, len(cur.Entries))}
	for _, e := range cur.Entries {
		v.entries[e.Key()] = struct{}{}
	}
	return v, nil
}

// writeChunk is how many entries one Add or Del call writes at most. A
// call's entries and its kernel messages are built at once: at 10,000
// Services the cold sync's 50,000 entries at once were megabytes of
// garbage, alive at the collections of the first sync beside the IPVS
// writes' own.
const writeChunk = 4096

// write adds (or deletes) the entries of keys, which it sorts, in calls of
// at most writeChunk entries. Like one call, it goes on past a failed one:
// every entry the kernel accepts is written.
func (s *Syncer) write(name string, keys []Key, add bool) error {
	if len(keys) > writeChunk {
		slices.SortFunc(keys, Key.Compare)
	}
	var errs []error
	for len(keys) > 0 {
		n := min(len(keys), writeChunk)
		es := entries(keys[:n])
		keys = keys[n:]
		var err error
		if add {
			err = s.sets.Add(name, es...)
		} else {
			err = s.sets.Del(name, es...)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// entries returns keys as entries in Entry.Compare's order, the order they
// are written in (within a call: write orders the calls by Key.Compare).
func entries(keys []Key) []Entry {
	out := make([]Entry, len(keys))
	for i, k := range keys {
		out[i] = k.Entry()
	}
	slices.SortFunc(out, Entry.Compare)
	return out
}

func mismatch(spec Spec, cur Set) error {
	return fmt.Errorf("ipset: set %s is %s %s, want %s %s (run `ipvs-proxy cleanup` to remove the old sets): %w",
		spec.Name, cur.Type, cur.Family, spec.Type, spec.Family, ErrMismatch)
}

// rebuild fills the set TempName(spec.Name) with want and swaps it with
// the live one. The temporary set is kept in the view like any other (and
// Forget keeps knowing that it exists), so a rebuild that fails part-way (a
// refused entry, a failed swap) resumes at the next attempt from what the
// set holds, rereading it after a failed write, instead of starting again:
// a fresh start needs every write of a large set to succeed at once, which
// repeated write failures never grant (a 200-entry set never converged
// with half the writes failing).
func (s *Syncer) rebuild(spec Spec, want Wanted, st *Stats) error {
	s.wroteAll(spec.Name)
	tmp := spec
	tmp.Name = TempName(spec.Name)
	// Entries refused on their own do not stop the swap (the live set
	// would refuse them too); the set is then reread by its next sync.
	refusedErr := s.fillTemp(tmp, want, st)
	if _, only := RefusedEntries(refusedErr); refusedErr != nil && !only {
		return refusedErr
	}
	if err := s.sets.Swap(spec.Name, tmp.Name); err != nil {
		s.view[tmp.Name].forget() // kept for the next attempt, reread
		return errors.Join(refusedErr, err)
	}
	st.Rebuilt = true
	v := &viewed{spec: spec}
	if refusedErr == nil {
		v.holds(want)
	}
	s.view[spec.Name] = v
	// The temporary set now holds the old contents: known to exist, to be
	// destroyed now or, if that fails, by the set's next sync.
	s.view[tmp.Name] = &viewed{spec: tmp, temp: true}
	return errors.Join(refusedErr, s.dropTemp(spec.Name))
}

// fillTemp makes the rebuild's set tmp hold want: synced by difference
// when an earlier attempt left it (reread if that attempt's write failed),
// created afresh otherwise, or when it has other parameters (a crash's
// leftover perhaps).
func (s *Syncer) fillTemp(tmp Spec, want Wanted, st *Stats) error {
	v := s.view[tmp.Name]
	if v != nil && v.entries == nil {
		nv, err := s.read(tmp, st) // (creates it if it is gone)
		if err != nil {
			return err // still known: the next attempt rereads it
		}
		nv.temp = true
		s.view[tmp.Name] = nv
		v = nv
	}
	if v == nil || v.spec != tmp {
		s.view[tmp.Name] = &viewed{spec: tmp, temp: true} // may exist
		if err := s.sets.Destroy(tmp.Name); err != nil {
			return err
		}
		delete(s.view, tmp.Name)
		if err := s.sets.Create(tmp); err != nil {
			return err
		}
		v = &viewed{spec: tmp, entries: Contents{}, temp: true}
		s.view[tmp.Name] = v
	}
	add, del := difference(want, v.entries)
	return s.apply(tmp.Name, v, add, del, st)
}

// dropTemp destroys the temporary set of a rebuild of name if it is known
// to exist (a rebuild finished, or given up for a sync by difference); if
// that fails it stays known, and the next sync of name tries again.
func (s *Syncer) dropTemp(name string) error {
	tmp := TempName(name)
	if _, ok := s.view[tmp]; !ok {
		return nil
	}
	if err := s.sets.Destroy(tmp); err != nil {
		return err
	}
	delete(s.view, tmp)
	return nil
}

// Destroy destroys a set and forgets it.
func (s *Syncer) Destroy(name string) error {
	delete(s.view, name)
	s.wroteAll(name)
	return s.sets.Destroy(name)
}

// Forget drops every set from the view: the next Sync of each rereads it.
// A rebuild's temporary set stays known to exist (its contents unknown), so
// that the rebuild resumes from it or a sync by difference destroys it. It
// stops tracking writes too.
func (s *Syncer) Forget() {
	for name, v := range s.view {
		if v.temp {
			v.entries = nil // it exists: a rebuild rereads it, a sync destroys it
			continue
		}
		delete(s.view, name)
	}
	clear(s.track)
}
