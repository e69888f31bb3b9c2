package netlinkutil

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// The tunnel test's namespaces and addresses: the client, the backend
// ("pod") that ends the tunnel, and the link between the two that carries
// the backend's direct answers.
const (
	tunClient   = "nltuncli"
	tunBackend  = "nltunbe"
	tunVIP      = "10.96.0.10"
	tunPod      = "10.244.1.2"
	tunGUEPort  = 6080
	tunDSRTable = 100
)

// TestIPVSTunnelRealTraffic writes, through the batch path, a virtual
// server whose real server (a pod address with port 8080) is forwarded by
// IPIP, then GUE, then NAT, reads each back equal (the port 8080 kept:
// tunnel mode does not rewrite ports, only ipvsadm would), and sends real
// traffic: a client namespace, this namespace as the ingress (IPVS), and a
// backend namespace that ends the tunnel on tunl0 (rp_filter 0, the VIP on
// its lo) and, for GUE, on a fou port. Tunnelled, the answers come from
// the backend's port 80 (the VIP's port, not remapped), to the client's own
// address, straight over a direct link to the client (source-routed from
// the VIP); NAT answers from port 8080 back through the ingress. A
// connection opened before each switch goes on answering after it.
func TestIPVSTunnelRealTraffic(t *testing.T) {
	nltest.InFreshNetns(t)
	h := newIPVS(t)
	for _, m := range []string{"ipip", "fou"} {
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			nltest.Require(t, "module "+m, fmt.Errorf("modprobe %s: %w: %s", m, err, out))
		}
	}
	tunnelBed(t)
	vs := ktypes.VirtualServer{VSKey: ktypestest.VSKey(tunVIP+":80", ktypes.TCP), Scheduler: "rr"}
	rs := ktypestest.RS(tunPod + ":8080 tunnel")
	apply(t, h, Write{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs}, Write{Kind: ktypes.OpAddRealServer, VirtualServer: vs, RealServer: rs})

	var held []*heldConn
	for i, step := range []struct {
		rs     string // the real server now
		answer string // the server that answers: the port traffic reaches
		direct bool   // answers come over the direct link
	}{
		{tunPod + ":8080 tunnel", "pod:80", true},
		{tunPod + ":8080 gue:6080", "pod:80", true},
		{tunPod + ":8080", "pod:8080", false},
	} {
		rs := ktypestest.RS(step.rs)
		if i > 0 {
			apply(t, h, Write{Kind: ktypes.OpUpdateRealServer, VirtualServer: vs, RealServer: rs})
		}
		want := []string{fmt.Sprintf("%s -> %s", vs.VSKey, rs), vs.String()} // sorted, as table renders it
		if diff := cmp.Diff(want, table(t, h)); diff != "" {
			t.Fatalf("%s: the kernel's table (-want +got):\n%s", step.rs, diff)
		}
		gue := rs.Forward == ktypes.ForwardGUE
		for j, c := range held {
			udp := gueDatagrams(t)
			if got, err := c.ask(); err != nil || got != c.first {
				t.Errorf("%s: a connection opened before the switch answered %q, %v; want %q again", step.rs, got, err, c.first)
			}
			// A connection keeps its method (tunnel), but its
			// encapsulation is the real server's now (ip_vs_tunnel_xmit
			// reads the type and port from the destination).
			n := gueDatagrams(t) - udp
			t.Logf("%s: held connection %d (opened under %s) sent the backend %d GUE datagrams", step.rs, j+1, c.opened, n)
			if (n > 0) != gue {
				t.Errorf("%s: held connection %d came in %d GUE datagrams; want GUE: %v", step.rs, j+1, n, gue)
			}
		}
		before, udp := directPackets(t), gueDatagrams(t)
		res, err := nettest.Hit(context.Background(), nettest.HitConfig{Netns: tunClient, Proto: "tcp", Addr: tunVIP + ":80", N: 3})
		if err != nil {
			t.Fatal(err)
		}
		if n := gueDatagrams(t) - udp; (n > 0) != gue {
			t.Errorf("%s: new connections came in %d GUE datagrams; want GUE: %v", step.rs, n, gue)
		}
		if diff := cmp.Diff(map[string]int{step.answer: 3}, res.Answers); diff != "" || len(res.Errors) > 0 {
			t.Errorf("%s: answers (-want +got):\n%s\nerrors: %v", step.rs, diff, res.Errors)
		}
		if res.Clients["10.0.3.2"] != 3 {
			t.Errorf("%s: the backend saw clients %v, want the client's own 10.0.3.2 three times", step.rs, res.Clients)
		}
		if got := directPackets(t) - before; (got > 0) != step.direct {
			t.Errorf("%s: %d packets reached the client over the direct link; want them there: %v", step.rs, got, step.direct)
		}
		c := dialHeld(t)
		c.opened = step.rs
		held = append(held, c)
		t.Logf("%s: %v; held connection answered %q", step.rs, res.Answers, c.first)
	}
	// GUE needs its port: the kernel refuses port 0 (and keeps NAT).
	gue0 := ktypestest.RS(tunPod + ":8080 gue:0")
	if errs := h.Apply([]Write{{Kind: ktypes.OpUpdateRealServer, VirtualServer: vs, RealServer: gue0}}); errs[0] == nil {
		t.Errorf("the kernel took a GUE real server without a port")
	}
}

func apply(t *testing.T, h IPVS, ws ...Write) {
	t.Helper()
	for i, err := range h.Apply(ws) {
		if err != nil {
			t.Fatalf("%s: %v", ws[i], err)
		}
	}
}

// heldConn is a connection from the client to the VIP, kept open across
// switches of the real server's method.
type heldConn struct {
	conn   net.Conn
	r      *bufio.Reader
	first  string // its greeting: "<server> <client>"
	opened string // the real server it was opened under
}

func dialHeld(t *testing.T) *heldConn {
	t.Helper()
	var conn net.Conn
	err := nettest.Do(tunClient, func() (err error) {
		conn, err = net.DialTimeout("tcp", tunVIP+":80", 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &heldConn{conn: conn, r: bufio.NewReader(conn)}
	if c.first, err = c.read(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *heldConn) read() (string, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func (c *heldConn) ask() (string, error) {
	if _, err := c.conn.Write([]byte("again\n")); err != nil {
		return "", err
	}
	return c.read()
}

// directPackets counts the packets the client received over the direct
// link from the backend.
func directPackets(t *testing.T) uint64 {
	t.Helper()
	var n uint64
	err := nettest.Do(tunClient, func() error {
		l, err := netlink.LinkByName("dsr-cli")
		if err != nil {
			return err
		}
		n = l.Attrs().Statistics.RxPackets
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// gueDatagrams counts the UDP datagrams the backend's namespace received
// (the fou port's GUE packets are counted there: nothing else sends it
// UDP).
func gueDatagrams(t *testing.T) int {
	t.Helper()
	var n int
	err := nettest.Do(tunBackend, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		n, err = snmpCounter(string(b), "Udp:", "InDatagrams")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// snmpCounter reads a counter of /proc/net/snmp: a line of names and a
// line of values, each starting with the group's prefix.
func snmpCounter(snmp, group, name string) (int, error) {
	var names []string
	for _, line := range strings.Split(snmp, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != group {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == name && i < len(f) {
				return strconv.Atoi(f[i])
			}
		}
	}
	return 0, fmt.Errorf("no %s %s in /proc/net/snmp", group, name)
}

// tunnelBed makes the namespaces: the client (10.0.3.2) and the backend
// (the pod address) each joined to this one, the ingress, which forwards
// and holds the VIP on a dummy link; and a direct link between the two
// (10.0.9.0/30) that the backend's answers from the VIP take.
func tunnelBed(t *testing.T) {
	t.Helper()
	l := newLinks(t)
	if err := l.EnsureDummy("ipvs-test0"); err != nil {
		nltest.Require(t, "dummy interfaces", err)
	}
	if err := l.AddAddress("ipvs-test0", ktypestest.VSKey(tunVIP+":80", ktypes.TCP).Address); err != nil {
		t.Fatal(err)
	}
	if _, err := (Sysctls{Root: "/proc/sys"}).Ensure("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ name, host, addr string }{{tunClient, "10.0.3.1/24", "10.0.3.2/24"}, {tunBackend, "10.244.1.1/24", tunPod + "/24"}} {
		if err := nettest.AddNetns(n.name, nettest.NetnsConfig{HostAddr: mustPrefix(n.host), Addr: mustPrefix(n.addr)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := nettest.DelNetns(n.name); err != nil {
				t.Errorf("delete netns: %v", err)
			}
		})
		// No reverse path filter; no IPv6, whose own packets (router
		// solicitations, MLD) would count on the direct link.
		inNetns(t, n.name, func() error {
			return writeSysctls(map[string]string{"net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0",
				"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"})
		})
	}
	directLink(t)
	inNetns(t, tunBackend, endTunnels)
	for _, port := range []int{80, 8080} {
		srv, err := nettest.Serve(nettest.ServeConfig{Netns: tunBackend, Name: fmt.Sprintf("pod:%d", port), Port: port, TCP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func inNetns(t *testing.T, name string, fn func() error) {
	t.Helper()
	if err := nettest.Do(name, fn); err != nil {
		t.Fatalf("in netns %s: %v", name, err)
	}
}

// writeSysctls sets keys of this thread's namespace.
func writeSysctls(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}

// directLink joins the client and the backend by a veth; the backend
// routes what it sends from the VIP over it (a source rule), everything
// else through the ingress.
func directLink(t *testing.T) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = "dsr-be"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "dsr-cli"}); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct{ link, ns, addr string }{{"dsr-be", tunBackend, "10.0.9.1/30"}, {"dsr-cli", tunClient, "10.0.9.2/30"}} {
		link, err := netlink.LinkByName(end.link)
		if err != nil {
			t.Fatal(err)
		}
		ns, err := netns.GetFromName(end.ns)
		if err != nil {
			t.Fatal(err)
		}
		err = netlink.LinkSetNsFd(link, int(ns))
		ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		inNetns(t, end.ns, func() error { return linkUp(end.link, end.addr) })
	}
	inNetns(t, tunBackend, func() error {
		link, err := netlink.LinkByName("dsr-be")
		if err != nil {
			return err
		}
		rule := netlink.NewRule()
		rule.Src, rule.Table, rule.Priority = ipNet(tunVIP+"/32"), tunDSRTable, 100
		if err := netlink.RuleAdd(rule); err != nil {
			return fmt.Errorf("rule from the VIP: %w", err)
		}
		return netlink.RouteAdd(&netlink.Route{Dst: ipNet("10.0.3.0/24"), Gw: net.ParseIP("10.0.9.2"), LinkIndex: link.Attrs().Index, Table: tunDSRTable})
	})
}

func ipNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func linkUp(name, addr string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// endTunnels makes this namespace end IPIP (tunl0, the ipip module's
// fallback device, up and without reverse path filtering) and GUE on
// tunGUEPort (fou), and accept the VIP as its own (on lo).
func endTunnels() error {
	if err := linkUp("tunl0", ""); err != nil {
		return err
	}
	if err := linkUp("lo", tunVIP+"/32"); err != nil {
		return err
	}
	if err := writeSysctls(map[string]string{"net/ipv4/conf/tunl0/rp_filter": "0"}); err != nil {
		return err
	}
	return fouAddGUE(tunGUEPort)
}

// The fou generic netlink family (linux/fou.h).
const (
	fouCmdAdd   = 1
	fouAttrPort = 1 // be16
	fouAttrAF   = 2 // u8
	fouAttrType = 4 // u8
	fouEncapGUE = 2
)

// fouAddGUE makes this namespace's fou receive GUE on a UDP port.
func fouAddGUE(port uint16) error {
	fam, err := netlink.GenlFamilyGet("fou")
	if err != nil {
		return fmt.Errorf("the fou family: %w", err)
	}
	s, err := nlbatch.Open(unix.NETLINK_GENERIC)
	if err != nil {
		return err
	}
	defer s.Close()
	msg := nlbatch.Attrs{fouCmdAdd, 1, 0, 0}.
		Bytes(fouAttrPort, binary.BigEndian.AppendUint16(nil, port)).U8(fouAttrAF, unix.AF_INET).U8(fouAttrType, fouEncapGUE)
	if r := s.Exchange([]nlbatch.Message{{Type: fam.ID, Data: msg}}); r[0].Err != nil {
		return fmt.Errorf("fou add port %d gue: %w", port, r[0].Err)
	}
	return nil
}
