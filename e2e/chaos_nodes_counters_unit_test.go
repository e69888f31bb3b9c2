package e2e

import (
	"testing"

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
