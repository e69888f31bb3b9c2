package e2e

import (
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
)

// synWatch reads each node's IPVS connections (/proc/net/ip_vs_conn)
// every synWatchEvery while a case's streams run, and keeps those from a
// client address (a pod's, or one of the segment's: the outside host and
// the nodes) that are still SYN_RECV a few seconds after their last SYN
// (IPVS saw the client's SYN and no answer from the real server): the
// real server a failed dial was sent to, which the client cannot tell.
type synWatch struct {
	b       *nodesBed
	clients []netip.Prefix
	mu      sync.Mutex
	// stuck are the stuck connections seen, by node, then by "client ->
	// virtual server -> real server", with when first seen (host clock).
	stuck map[string]map[string]time.Time
	done  chan struct{}
	wg    sync.WaitGroup
}

// synWatchEvery is the poll's period: a dial that fails leaves its
// SYN_RECV entry for 60 s (IPVS's timeout of that state), and the table
// holds thousands of entries (every stream's TIME_WAIT, 2 minutes).
const synWatchEvery = 5 * time.Second

// synStuckAfter: an entry whose expiry has run down this far since its
// last SYN waited that long for an answer (a SYN's answer takes
// milliseconds; the client's retransmissions reset the expiry).
const synStuckAfter = 3 * time.Second

func (b *nodesBed) watchSYNs(clients ...netip.Prefix) *synWatch {
	w := &synWatch{b: b, clients: clients, stuck: map[string]map[string]time.Time{}, done: make(chan struct{})}
	w.wg.Add(1)
	go w.run()
	return w
}

func (w *synWatch) run() {
	defer w.wg.Done()
	for {
		for _, n := range w.b.c.Nodes {
			w.sample(n)
		}
		select {
		case <-w.done:
			return
		case <-time.After(synWatchEvery):
		}
	}
}

func (w *synWatch) sample(n *cluster.Node) {
	out, err := n.VM.RunOK(w.b.ctx, "cat", "/proc/net/ip_vs_conn")
	if err != nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range stuckSYNs(out, w.clients...) {
		if w.stuck[n.Name] == nil {
			w.stuck[n.Name] = map[string]time.Time{}
		}
		if _, seen := w.stuck[n.Name][c]; !seen {
			w.stuck[n.Name][c] = now
		}
	}
}

// stop ends the watch and logs what it saw, per node; a nil watch (the
// traffic of a case that runs none) does nothing.
func (w *synWatch) stop(t *testing.T) {
	t.Helper()
	if w == nil {
		return
	}
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.b.c.Nodes {
		seen := w.stuck[n.Name]
		var lines []string
		for _, c := range slices.Sorted(maps.Keys(seen)) {
			lines = append(lines, fmt.Sprintf("%s (seen %s)", c, seen[c].Format("15:04:05")))
		}
		t.Logf("%s: IPVS connections from the streams' clients left SYN_RECV over %s: %d %v", n.Name, synStuckAfter, len(lines), lines)
	}
}

// stuckSYNs are the TCP entries of /proc/net/ip_vs_conn (text) from a
// client in one of clients, in state SYN_RECV, whose expiry ran down synStuckAfter
// or more from IPVS's 60 s: "client -> virtual server -> real server".
func stuckSYNs(text string, clients ...netip.Prefix) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		// Pro FromIP FPrt ToIP TPrt DestIP DPrt State Expires ...
		if len(f) < 9 || f[0] != "TCP" || f[7] != "SYN_RECV" {
			continue
		}
		client, okC := hexAddrPort(f[1], f[2])
		vs, okV := hexAddrPort(f[3], f[4])
		rs, okR := hexAddrPort(f[5], f[6])
		left, err := strconv.Atoi(f[8])
		if !okC || !okV || !okR || err != nil || !slices.ContainsFunc(clients, func(p netip.Prefix) bool { return p.Contains(client.Addr()) }) {
			continue
		}
		if time.Duration(60-left)*time.Second >= synStuckAfter {
			out = append(out, fmt.Sprintf("%s -> %s -> %s", client, vs, rs))
		}
	}
	return out
}

// hexAddrPort reads an IPv4 address and port as /proc/net/ip_vs_conn
// prints them (hex).
func hexAddrPort(addr, port string) (netip.AddrPort, bool) {
	b, err := hex.DecodeString(addr)
	if err != nil || len(b) != 4 {
		return netip.AddrPort{}, false
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b)), uint16(p)), true
}
