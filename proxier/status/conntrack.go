package status

import (
	"fmt"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/ctwatch"
)

// Conntrack is the node's connection tracking table as status read it:
// its size and limit, and the kernel's counters since nf_conntrack was
// loaded, summed over CPUs (the agent's metrics count them while it runs).
type Conntrack struct {
	Entries      int    `json:"entries"`
	Max          int    `json:"max"`
	Dropped      uint64 `json:"dropped"`
	EarlyDropped uint64 `json:"earlyDropped"`
	InsertFailed uint64 `json:"insertFailed"`
	// NoCounters: the kernel has no /proc/net/stat/nf_conntrack.
	NoCounters bool   `json:"noCounters,omitempty"`
	Error      string `json:"error,omitempty"`
}

// ReadConntrack reads the table once through r.
func ReadConntrack(r ctwatch.Reader) *Conntrack {
	s, err := r.Read()
	if err != nil {
		return &Conntrack{Error: err.Error()}
	}
	t := s.Total()
	return &Conntrack{Entries: s.Entries, Max: s.Max, Dropped: t.Drop, EarlyDropped: t.EarlyDrop, InsertFailed: t.InsertFailed,
		NoCounters: s.PerCPU == nil}
}

// writeConntrack writes the table's line: how full, and what the kernel
// dropped.
func writeConntrack(b *strings.Builder, c *Conntrack) {
	switch {
	case c == nil:
		return
	case c.Error != "":
		fmt.Fprintf(b, "conntrack: unknown (%s)\n", c.Error)
		return
	}
	pct := 0
	if c.Max > 0 {
		pct = c.Entries * 100 / c.Max
	}
	note := ""
	if pct >= 90 {
		note = ", NEARLY FULL: new connections through Services may fail"
	}
	if c.NoCounters {
		fmt.Fprintf(b, "conntrack: %d of %d entries (%d%%%s); the kernel's drop counters unknown (no /proc/net/stat/nf_conntrack)\n", c.Entries, c.Max, pct, note)
		return
	}
	fmt.Fprintf(b, "conntrack: %d of %d entries (%d%%%s); since nf_conntrack loaded: %d packets dropped (table full), %d entries evicted for room, %d inserts failed\n",
		c.Entries, c.Max, pct, note, c.Dropped, c.EarlyDropped, c.InsertFailed)
}
