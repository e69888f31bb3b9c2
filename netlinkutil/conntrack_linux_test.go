package netlinkutil

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// TestConntrackClearUDP: two UDP clients that keep their source ports talk
// to a virtual server, one flow per backend. Clearing the entries of one
// backend deletes that flow's entry and keeps the other. Then the backend is
// removed and cleared as the reconciler does; the same client, same port,
// reaches the remaining backend.
//
// Since Linux 5.9, with expire_nodest_conn=1 the kernel also expires the
// connections of a removed real server (and their conntrack entries) from a
// work item shortly after the removal, so after the removal this test
// checks the outcome (no entry left, next datagram answered), not who
// deleted the entry.
func TestConntrackClearUDP(t *testing.T) {
	nltest.InFreshNetns(t)
	h := newIPVS(t)
	l := newLinks(t)
	if err := l.EnsureDummy("ipvs-test0"); err != nil {
		nltest.Require(t, "dummy interfaces", err)
	}
	ct, err := NewConntrack()
	nltest.Require(t, "conntrack over netlink", err)
	vip := netip.MustParseAddr("10.96.0.53")
	if err := l.AddAddress("ipvs-test0", vip); err != nil {
		t.Fatal(err)
	}
	// Connection tracking runs in a namespace only once something uses it;
	// on a node, the iptables glue's rules do.
	if out, err := exec.Command("iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP").CombinedOutput(); err != nil {
		nltest.Require(t, "iptables with conntrack", fmt.Errorf("%w: %s", err, out))
	}
	sys := Sysctls{Root: "/proc/sys"}
	for _, kv := range [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/vs/conntrack", "1"}, {"net/ipv4/vs/expire_nodest_conn", "1"}} {
		if _, err := sys.Ensure(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	nets := []struct{ name, host, addr string }{
		{"ctbe1", "10.0.11.1/24", "10.0.11.2/24"},
		{"ctbe2", "10.0.12.1/24", "10.0.12.2/24"},
		{"ctcli", "10.0.13.1/24", "10.0.13.2/24"},
	}
	for _, n := range nets {
		if err := nettest.AddNetns(n.name, nettest.NetnsConfig{HostAddr: netip.MustParsePrefix(n.host), Addr: netip.MustParsePrefix(n.addr)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nettest.DelNetns(n.name) })
	}
	backends := map[string]ktypes.RSKey{}
	for i, n := range nets[:2] {
		name := fmt.Sprintf("backend-%d", i+1)
		srv, err := nettest.Serve(nettest.ServeConfig{Netns: n.name, Name: name, Port: 5353, UDP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		backends[name] = ktypes.RSKey{Address: netip.MustParsePrefix(n.addr).Addr(), Port: 5353}
	}
	vs := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: vip, Protocol: ktypes.UDP, Port: 53}, Scheduler: "rr"}
	if err := h.AddVirtualServer(vs); err != nil {
		t.Fatal(err)
	}
	for _, rs := range backends {
		if err := h.AddRealServer(vs.VSKey, ktypes.RealServer{RSKey: rs, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// ask sends one datagram from 10.0.13.2:port and returns who answered.
	ask := func(port int) (string, error) {
		var answer string
		err := nettest.Do("ctcli", func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.WriteTo([]byte("who?\n"), &net.UDPAddr{IP: net.IP(vip.AsSlice()), Port: 53}); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return err
			}
			answer = strings.Fields(line)[0]
			return nil
		})
		return answer, err
	}
	// flowsTo lists the conntrack entries of flows to the VIP whose reply
	// comes from rs.
	flowsTo := func(rs ktypes.RSKey) []string {
		t.Helper()
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range flows {
			if f.Forward.DstIP.Equal(net.IP(vip.AsSlice())) && f.Reverse.SrcIP.Equal(net.IP(rs.Address.AsSlice())) {
				out = append(out, f.String())
			}
		}
		return out
	}

	// Two flows, one per backend (rr gives consecutive new flows to
	// alternate real servers); each keeps its backend while it lives.
	first, err := ask(40053)
	if err != nil {
		t.Fatalf("first client: %v", err)
	}
	if again, err := ask(40053); err != nil || again != first {
		t.Fatalf("same source port: answered by %q (%v), want %q again (one flow)", again, err, first)
	}
	other, err := ask(40054)
	if err != nil {
		t.Fatalf("second client: %v", err)
	}
	if other == first {
		t.Fatalf("both flows went to %s, want one per backend", first)
	}
	gone, kept := backends[first], backends[other]
	if len(flowsTo(gone)) == 0 || len(flowsTo(kept)) == 0 {
		t.Fatalf("want a conntrack entry per flow: to %s %v, to %s %v", gone, flowsTo(gone), kept, flowsTo(kept))
	}

	// Selective: clearing one real server's flows deletes exactly those.
	n, err := ct.ClearUDP(UDPClear{VS: vs.VSKey, RS: gone})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("cleared %d entries of flows to %s, want 1", n, gone)
	}
	if left := flowsTo(gone); len(left) != 0 {
		t.Errorf("entries of flows to %s left after clearing: %v", gone, left)
	}
	if len(flowsTo(kept)) != 1 {
		t.Errorf("the flow to %s lost its entry: clearing is not selective", kept)
	}
	if n, _ := ct.ClearUDP(UDPClear{VS: vs.VSKey, RS: gone}); n != 0 {
		t.Errorf("a second clear deleted %d entries", n)
	}

	// Removal, as the reconciler does it: delete the real server, then
	// clear its flows. The same client, same source port, moves over.
	if again, err := ask(40053); err != nil || again != first {
		t.Fatalf("same source port after clearing with the backend still present: %q (%v), want %q", again, err, first)
	}
	if err := h.DeleteRealServer(vs.VSKey, gone); err != nil {
		t.Fatal(err)
	}
	n, err = ct.ClearUDP(UDPClear{VS: vs.VSKey, RS: gone})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after removing %s: cleared %d entries (the kernel may have expired them first)", gone, n)
	if left := flowsTo(gone); len(left) != 0 {
		t.Errorf("entries of flows to the removed %s left: %v", gone, left)
	}
	second, err := ask(40053)
	if err != nil {
		t.Fatalf("after the backend moved, the same client got no answer: %v", err)
	}
	if second != other {
		t.Errorf("after %s was removed, answered by %s, want %s", first, second, other)
	}

	// Several clears in one call (one read of the table): the remaining
	// flows' entries go, whatever else the call names.
	elsewhere := UDPClear{VS: ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.54"), Protocol: ktypes.UDP, Port: 53}}
	n, err = ct.ClearUDP(elsewhere, UDPClear{VS: vs.VSKey, RS: kept})
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 || len(flowsTo(kept)) != 0 {
		t.Errorf("one call of two clears deleted %d entries, left %v to %s; want its flows' entries gone", n, flowsTo(kept), kept)
	}
}
