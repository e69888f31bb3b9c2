// Package ctwatch watches the node's connection tracking table: how full
// it is and whether the kernel drops packets for want of room, as metrics,
// a warning log line and an Event on the Node, and a line of `ipvs-proxy
// status`. A full table stalls new connections through every Service of
// the node while established ones go on; nothing else tells an operator.
package ctwatch

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// Stats are the kernel's counters of one CPU (or their sum).
type Stats struct {
	// Drop counts packets dropped because the table was full and no entry
	// could be evicted ("nf_conntrack: table full, dropping packet").
	Drop uint64
	// EarlyDrop counts entries evicted to make room for a new one (an
	// unreplied flow, a closing TCP connection).
	EarlyDrop uint64
	// InsertFailed counts entries that could not be inserted (a clash
	// between two packets of one new flow, or a full table).
	InsertFailed uint64
}

func (s Stats) add(o Stats) Stats {
	return Stats{Drop: s.Drop + o.Drop, EarlyDrop: s.EarlyDrop + o.EarlyDrop, InsertFailed: s.InsertFailed + o.InsertFailed}
}

// Sample is one look at the table.
type Sample struct {
	// Entries and Max: nf_conntrack_count (this network namespace's
	// entries) and nf_conntrack_max (the limit, the node's).
	Entries, Max int
	// PerCPU are the kernel's counters, one per possible CPU, each 32
	// bits wide in the kernel and reset when nf_conntrack is reloaded;
	// nil on a kernel without CONFIG_NF_CONNTRACK_PROCFS (no stat file):
	// then only the table's fill is watched.
	PerCPU []Stats
}

// Total sums the counters of every CPU.
func (s Sample) Total() Stats {
	var t Stats
	for _, c := range s.PerCPU {
		t = t.add(c)
	}
	return t
}

// Reader takes a Sample.
type Reader interface {
	Read() (Sample, error)
}

// ProcReader reads the table's size and limit under a sysctl root and the
// counters from /proc/net/stat/nf_conntrack (of the reader's network
// namespace: the node's with hostNetwork).
type ProcReader struct {
	Sysctls  netlinkutil.Sysctls
	StatFile string
}

// NewProcReader reads the node's sysctls under root (sysctls.Root()).
func NewProcReader(root string) ProcReader {
	return ProcReader{Sysctls: netlinkutil.Sysctls{Root: root}, StatFile: "/proc/net/stat/nf_conntrack"}
}

// maxStatBytes bounds the stat file's read: a line of about 160 bytes per
// possible CPU, so room for thousands of CPUs.
const maxStatBytes = 1 << 20

// Read reads count, max and the counters: three small files.
func (r ProcReader) Read() (Sample, error) {
	var s Sample
	for name, dst := range map[string]*int{"net/netfilter/nf_conntrack_count": &s.Entries, "net/netfilter/nf_conntrack_max": &s.Max} {
		v, err := r.Sysctls.Get(name)
		if err != nil {
			return Sample{}, fmt.Errorf("conntrack table (is nf_conntrack loaded?): %w", err)
		}
		if *dst, err = strconv.Atoi(v); err != nil {
			return Sample{}, fmt.Errorf("conntrack table: %s %q: %w", name, v, err)
		}
	}
	f, err := os.Open(r.StatFile)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return Sample{}, fmt.Errorf("conntrack counters: %w", err)
	}
	defer f.Close()
	if s.PerCPU, err = ParseStat(io.LimitReader(f, maxStatBytes)); err != nil {
		return Sample{}, fmt.Errorf("conntrack counters %s: %w", r.StatFile, err)
	}
	return s, nil
}

// ParseStat parses /proc/net/stat/nf_conntrack: a header naming the
// columns, then one line per CPU of hexadecimal values. Columns are found
// by name (they differ between kernels).
func ParseStat(r io.Reader) ([]Stats, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return nil, fmt.Errorf("no header: %w", sc.Err())
	}
	cols := map[string]int{}
	for i, name := range strings.Fields(sc.Text()) {
		cols[name] = i
	}
	idx := make([]int, 0, 3)
	for _, name := range []string{"drop", "early_drop", "insert_failed"} {
		i, ok := cols[name]
		if !ok {
			return nil, fmt.Errorf("no column %q in %q", name, sc.Text())
		}
		idx = append(idx, i)
	}
	var out []Stats
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var v [3]uint64
		for k, i := range idx {
			if i >= len(f) {
				return nil, fmt.Errorf("line %d: %d fields", len(out)+2, len(f))
			}
			n, err := strconv.ParseUint(f[i], 16, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", len(out)+2, err)
			}
			v[k] = n
		}
		out = append(out, Stats{Drop: v[0], EarlyDrop: v[1], InsertFailed: v[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
