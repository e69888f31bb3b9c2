package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// dropCounters are a node's kernel counters of packets dropped or refused
// on the way through conntrack and TCP (/proc/net/stat/nf_conntrack,
// summed over CPUs, and /proc/net/netstat's TcpExt): what a stream's
// failed connections may be matched against.
type dropCounters map[string]uint64

// conntrackDropFields are the columns of /proc/net/stat/nf_conntrack
// that count a packet conntrack refused or an entry it could not insert.
var conntrackDropFields = []string{"invalid", "insert_failed", "drop", "early_drop", "error", "search_restart"}

// readDropCounters reads v's dropCounters.
func readDropCounters(ctx context.Context, v *vm.VM) (dropCounters, error) {
	ct, err := v.RunOK(ctx, "cat", "/proc/net/stat/nf_conntrack")
	if err != nil {
		return nil, err
	}
	out, err := sumConntrackStat(ct)
	if err != nil {
		return nil, err
	}
	netstat, err := v.RunOK(ctx, "cat", "/proc/net/netstat")
	if err != nil {
		return nil, err
	}
	for k, n := range netstatFields(netstat, "TcpExt", "TCPTimeouts", "TCPSynRetrans", "ListenDrops", "TCPBacklogDrop") {
		out["tcp_"+k] = n
	}
	return out, nil
}

// sumConntrackStat sums the conntrackDropFields of the per-CPU rows (hex)
// of /proc/net/stat/nf_conntrack.
func sumConntrackStat(text string) (dropCounters, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("nf_conntrack stat: %q", text)
	}
	head := strings.Fields(lines[0])
	out := dropCounters{}
	for _, line := range lines[1:] {
		for i, f := range strings.Fields(line) {
			if i >= len(head) || !slices.Contains(conntrackDropFields, head[i]) {
				continue
			}
			n, err := strconv.ParseUint(f, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("nf_conntrack stat %s: %w", head[i], err)
			}
			out["conntrack_"+head[i]] += n
		}
	}
	return out, nil
}

// netstatFields picks names from the section of /proc/net/netstat (a
// header line of names, then one of values).
func netstatFields(text, section string, names ...string) map[string]uint64 {
	out := map[string]uint64{}
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		head, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(head) == 0 || head[0] != section+":" || len(vals) != len(head) {
			continue
		}
		for j, h := range head[1:] {
			if slices.Contains(names, h) {
				n, _ := strconv.ParseUint(vals[j+1], 10, 64)
				out[h] = n
			}
		}
	}
	return out
}

// since is what grew from before to c, in name order ("name +n"), the
// counters that did not grow left out.
func (c dropCounters) since(before dropCounters) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if c[k] > before[k] {
			out = append(out, fmt.Sprintf("%s +%d", k, c[k]-before[k]))
		}
	}
	if len(out) == 0 {
		return "none grew"
	}
	return strings.Join(out, ", ")
}

// dropCountersOf reads every node's dropCounters; a node whose read fails
// is logged and left out.
func (b *nodesBed) dropCountersOf(t *testing.T) map[string]dropCounters {
	t.Helper()
	out := map[string]dropCounters{}
	for _, n := range b.c.Nodes {
		c, err := readDropCounters(b.ctx, n.VM)
		if err != nil {
			t.Logf("%s: drop counters: %v", n.Name, err)
			continue
		}
		out[n.Name] = c
	}
	return out
}
