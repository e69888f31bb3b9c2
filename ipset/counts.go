package ipset

import (
	"iter"
	"maps"
)

// Mirrored is a Wanted that also remembers what it held when a Syncer last
// made the set equal to it (Synced), and which entries changed since. A
// Syncer given a Mirrored keeps no copy of the set's contents: what the set
// holds is what the Mirrored held (Held), and a sync without a reread
// writes the entries that changed (Changed), at the cost of the change.
// A Syncer expects the same Mirrored for a set at every sync; given
// anything else it rereads the set. A Mirrored must be comparable (a
// pointer, as *Counts is): the Syncer tells it by ==.
type Mirrored interface {
	Wanted
	// Held reports whether k was wanted at the last Synced.
	Held(k Key) bool
	// Changed yields every entry whose Has may differ from its Held (it
	// may yield more).
	Changed() iter.Seq[Key]
	// Synced records that the set now holds exactly what is wanted: from
	// now on Held is Has, until the wanted entries change.
	Synced()
}

// Counts is what a set should hold as counts of the owners that want each
// entry (the glue counts the Services): an entry is wanted while its count
// is above zero. It is Mirrored; until its first Synced it records no
// changes (every sync before it compares the whole set). The zero value is
// not usable: use NewCounts.
type Counts struct {
	n map[Key]int32
	// was holds, for each entry whose membership changed since Synced,
	// whether it was wanted then.
	was      map[Key]bool
	wasPeak  int  // the largest was has been since Synced
	tracking bool // Synced has been called
}

var _ Mirrored = (*Counts)(nil)

// NewCounts returns empty counts.
func NewCounts() *Counts { return &Counts{n: map[Key]int32{}, was: map[Key]bool{}} }

// Add changes the count of k by delta and reports whether k's membership
// changed (it became wanted, or stopped being wanted).
func (c *Counts) Add(k Key, delta int32) bool {
	had := c.n[k] > 0
	n := c.n[k] + delta
	if n <= 0 {
		delete(c.n, k)
	} else {
		c.n[k] = n
	}
	now := n > 0
	if had == now {
		return false
	}
	if c.tracking {
		if first, ok := c.was[k]; !ok {
			c.was[k] = had
			c.wasPeak = max(c.wasPeak, len(c.was))
		} else if first == now { // back to what the set holds
			delete(c.was, k)
		}
	}
	return true
}

// Has implements Wanted.
func (c *Counts) Has(k Key) bool { return c.n[k] > 0 }

// Len implements Wanted.
func (c *Counts) Len() int { return len(c.n) }

// All implements Wanted.
func (c *Counts) All() iter.Seq[Key] { return maps.Keys(c.n) }

// Held implements Mirrored.
func (c *Counts) Held(k Key) bool {
	if was, ok := c.was[k]; ok {
		return was
	}
	return c.Has(k)
}

// Changed implements Mirrored: exactly the entries whose membership
// differs from Held.
func (c *Counts) Changed() iter.Seq[Key] { return maps.Keys(c.was) }

// Pending is the number of entries whose membership changed since Synced.
func (c *Counts) Pending() int { return len(c.was) }

// Synced implements Mirrored.
func (c *Counts) Synced() {
	c.tracking = true
	if c.wasPeak > 1024 {
		c.was = map[Key]bool{} // give a large change's memory back (clear keeps it)
	} else {
		clear(c.was)
	}
	c.wasPeak = 0
}
