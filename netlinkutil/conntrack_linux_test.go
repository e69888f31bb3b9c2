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

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// TestConntrackClearUDP: a UDP client that keeps its source port talks to a
// virtual server; its backend is removed and the flow's conntrack entries
// cleared; the same client, same port, then reaches the remaining backend.
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
	backends := map[string]RSKey{}
	for i, n := range nets[:2] {
		name := fmt.Sprintf("backend-%d", i+1)
		srv, err := nettest.Serve(nettest.ServeConfig{Netns: n.name, Name: name, Port: 5353, UDP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		backends[name] = RSKey{Address: netip.MustParsePrefix(n.addr).Addr(), Port: 5353}
	}
	vs := VirtualServer{VSKey: VSKey{vip, UDP, 53}, Scheduler: "rr"}
	if err := h.AddVirtualServer(vs); err != nil {
		t.Fatal(err)
	}
	for _, rs := range backends {
		if err := h.AddRealServer(vs.VSKey, RealServer{RSKey: rs, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// ask sends one datagram from 10.0.13.2:40053 and returns who answered.
	ask := func() (string, error) {
		var answer string
		err := nettest.Do("ctcli", func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: 40053})
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
	first, err := ask()
	if err != nil {
		t.Fatalf("first question: %v", err)
	}
	if again, err := ask(); err != nil || again != first {
		t.Fatalf("same source port: answered by %q (%v), want %q again (one flow)", again, err, first)
	}
	gone := backends[first]
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		t.Logf("conntrack before: %s", f)
	}
	if err := h.DeleteRealServer(vs.VSKey, gone); err != nil {
		t.Fatal(err)
	}
	n, err := ct.ClearUDP(vs.VSKey, gone)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("no conntrack entry of the flow to %s was deleted", gone)
	}
	if n, _ := ct.ClearUDP(vs.VSKey, gone); n != 0 {
		t.Errorf("a second clear deleted %d entries", n)
	}
	second, err := ask()
	if err != nil {
		t.Fatalf("after the backend moved, the same client got no answer: %v", err)
	}
	if second == first {
		t.Errorf("answered by the removed backend %s", first)
	}
}
