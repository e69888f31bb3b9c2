package status

import (
	"errors"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/ctwatch"
)

type ctReader struct {
	s   ctwatch.Sample
	err error
}

func (r ctReader) Read() (ctwatch.Sample, error) { return r.s, r.err }

// TestConntrackLine: status says how full the table is, flags a nearly
// full one, sums the CPUs' counters, and says why it could not read one.
func TestConntrackLine(t *testing.T) {
	full := ctReader{s: ctwatch.Sample{Entries: 1020, Max: 1024, PerCPU: []ctwatch.Stats{{Drop: 5, EarlyDrop: 1}, {Drop: 2, InsertFailed: 3}}}}
	for _, c := range []struct {
		r    ctwatch.Reader
		want string
	}{
		{full, "conntrack: 1020 of 1024 entries (99%, NEARLY FULL: new connections through Services may fail); since nf_conntrack loaded: 7 packets dropped (table full), 1 entries evicted for room, 3 inserts failed\n"},
		{ctReader{s: ctwatch.Sample{Entries: 10, Max: 1024, PerCPU: []ctwatch.Stats{{}}}}, "conntrack: 10 of 1024 entries (0%); since nf_conntrack loaded: 0 packets dropped (table full), 0 entries evicted for room, 0 inserts failed\n"},
		{ctReader{s: ctwatch.Sample{Entries: 10, Max: 1024}}, "conntrack: 10 of 1024 entries (0%); the kernel's drop counters unknown (no /proc/net/stat/nf_conntrack)\n"},
		{ctReader{err: errors.New("no nf_conntrack")}, "conntrack: unknown (no nf_conntrack)\n"},
	} {
		var b strings.Builder
		writeConntrack(&b, ReadConntrack(c.r))
		if b.String() != c.want {
			t.Errorf("got  %q\nwant %q", b.String(), c.want)
		}
	}
	var b strings.Builder
	writeConntrack(&b, nil)
	if b.Len() != 0 {
		t.Errorf("nil wrote %q", b.String())
	}
}
