package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDropCounters: the conntrack columns summed over the CPUs' rows
// (hex), TcpExt's picked by name, and what grew.
func TestDropCounters(t *testing.T) {
	stat := `entries  clashres found     new       invalid   ignore    delete    chainlength  insert    insert_failed drop      early_drop error     expect_new expect_create expect_delete search_restart
0000002a  00000000 00000000  00000000  00000003  00000000  00000000  00000000     00000000  00000001      00000000  00000000   00000000  00000000   00000000      00000000      00000000
0000002a  00000000 00000000  00000000  0000000a  00000000  00000000  00000000     00000000  00000002      00000000  00000000   00000000  00000000   00000000      00000000      00000004
`
	got, err := sumConntrackStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	want := dropCounters{"conntrack_invalid": 13, "conntrack_insert_failed": 3, "conntrack_drop": 0, "conntrack_early_drop": 0,
		"conntrack_error": 0, "conntrack_search_restart": 4}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("conntrack counters (-want +got):\n%s", diff)
	}
	netstat := "TcpExt: SyncookiesSent TCPTimeouts ListenDrops\nTcpExt: 0 17 2\nIpExt: InNoRoutes\nIpExt: 5\n"
	if diff := cmp.Diff(map[string]uint64{"TCPTimeouts": 17, "ListenDrops": 2}, netstatFields(netstat, "TcpExt", "TCPTimeouts", "ListenDrops")); diff != "" {
		t.Errorf("TcpExt (-want +got):\n%s", diff)
	}
	later := dropCounters{"conntrack_invalid": 15, "conntrack_insert_failed": 3, "tcp_TCPTimeouts": 1}
	if got := later.since(got); got != "conntrack_invalid +2, tcp_TCPTimeouts +1" {
		t.Errorf("since = %q", got)
	}
	if got := got.since(got); got != "none grew" {
		t.Errorf("since itself = %q", got)
	}
}

// TestStuckSYNs: of /proc/net/ip_vs_conn, the TCP entries from a pod or a
// host of the segment (the clients given) in SYN_RECV whose expiry ran
// down 3 s or more; not a node's own connection from a Service address,
// not a fresh one, not one answered.
func TestStuckSYNs(t *testing.T) {
	conns := `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AF40203 A1B2 0A602D68 0050 0AF40202 1F90 SYN_RECV        55
TCP 0AF40203 A1B3 0A602D68 0050 0AF40202 1F90 SYN_RECV        59
TCP 0AF40203 A1B4 0A602D68 0050 0AF40002 1F90 ESTABLISHED    899
TCP 0A602D68 A1B5 0A602D68 0050 0AF40002 1F90 SYN_RECV        50
TCP C0A83802 A1B6 C0A838DC 0050 0AF40002 1F90 SYN_RECV        54
UDP 0AF40203 3039 0A602D68 0050 0AF40002 1F90 UDP            290
`
	got := stuckSYNs(conns, netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("192.168.56.0/24"))
	want := []string{"10.244.2.3:41394 -> 10.96.45.104:80 -> 10.244.2.2:8080", "192.168.56.2:41398 -> 192.168.56.220:80 -> 10.244.0.2:8080"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stuck (-want +got):\n%s", diff)
	}
}

// TestFakeServiceTypes: fakeServices' Services take ClusterIP, NodePort
// and LoadBalancer in turn, and never more node ports than
// bulkNodePorts: at 2,000 two in three (1,334), at 5,000 bulkNodePorts,
// the rest LoadBalancers without node ports; a batch from a high first
// index (the soak's) counts from its own start.
func TestFakeServiceTypes(t *testing.T) {
	count := func(first, n int) map[string]int {
		out := map[string]int{}
		for i := first; i < first+n; i++ {
			typ, ports := fakeServiceType(first, i)
			out[fmt.Sprintf("%s ports=%v", typ, ports)]++
		}
		return out
	}
	for _, tc := range []struct {
		first, n int
		want     map[string]int
	}{
		{0, 2000, map[string]int{"ClusterIP ports=false": 667, "NodePort ports=true": 667, "LoadBalancer ports=true": 666}},
		{0, 5000, map[string]int{"ClusterIP ports=false": 1667, "NodePort ports=true": 1300, "LoadBalancer ports=true": 1300, "LoadBalancer ports=false": 733}},
		{100000, 40, map[string]int{"ClusterIP ports=false": 13, "NodePort ports=true": 14, "LoadBalancer ports=true": 13}},
	} {
		if diff := cmp.Diff(tc.want, count(tc.first, tc.n)); diff != "" {
			t.Errorf("%d Services from %d (-want +got):\n%s", tc.n, tc.first, diff)
		}
	}
}

// TestRolloutLimit: 20 minutes up to 2,000 Services, 3 more per 1,000
// above.
func TestRolloutLimit(t *testing.T) {
	for size, want := range map[int]time.Duration{300: 20 * time.Minute, 2000: 20 * time.Minute, 2500: 21*time.Minute + 30*time.Second, 5000: 29 * time.Minute} {
		if got := rolloutLimit(size); got != want {
			t.Errorf("rolloutLimit(%d) = %s, want %s", size, got, want)
		}
	}
}

// TestAddressWait: 2 minutes up to 2,000 Services, 2 more per 1,000
// above.
func TestAddressWait(t *testing.T) {
	for size, want := range map[int]time.Duration{300: 2 * time.Minute, 2000: 2 * time.Minute, 2500: 3 * time.Minute, 5000: 8 * time.Minute} {
		if got := addressWait(size); got != want {
			t.Errorf("addressWait(%d) = %s, want %s", size, got, want)
		}
	}
}

// TestStaleLimit: 5 minutes up to 2,000 Services, 2 more per 1,000 above.
func TestStaleLimit(t *testing.T) {
	for size, want := range map[int]time.Duration{300: 5 * time.Minute, 2000: 5 * time.Minute, 5000: 11 * time.Minute} {
		if got := staleLimit(size); got != want {
			t.Errorf("staleLimit(%d) = %s, want %s", size, got, want)
		}
	}
}
