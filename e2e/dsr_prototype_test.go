package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// dsrLBIP is the LoadBalancer IP of the DSR prototype, routed by the
// outside host to node-1.
var dsrLBIP = cluster.SegmentAddr(210)

// Marks and table of the prototype's backend side on node-2.
const (
	dsrMark  = "0x44"
	dsrTable = "42" // busybox ip takes table IDs up to 255
	// dsrGUEPort is the UDP port node-2 decapsulates GUE on (fou).
	dsrGUEPort = "6080"
)

// TestDSRPrototype is issue 43 part 2's prototype, not the product: direct
// server return set up BY HAND (ip, iptables, ipvsadm in the VMs; no
// ipvs-proxy runs) on two nodes and the outside host, to choose the design
// written down in proxier/DSR.md. A pod on node-2 serves on 8080; node-1
// (where the outside host routes the LoadBalancer IP) has an IPVS virtual
// server LBIP:80 whose real server is the pod's address, forwarded with
// IPIP tunnelling. node-2 ends the tunnel on the node: the outer packet to
// a pod address is marked and routed as local (a policy rule), tunl0
// decapsulates it, and a DNAT by mark sends LBIP:80 to podIP:8080. It
// prints what it finds (lines starting with DSR) rather than deciding
// much: the frames the segment carries are counted by the hub (which
// node's MAC sent each reply), the rp_filter variants, the MSS variants of
// an 8 MiB upload, oversize UDP, and GUE.
//
// Not in make test: `make dsr-prototype`.
func TestDSRPrototype(t *testing.T) {
	assets := vm.Require(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Assets: assets, Log: t.Logf, Nodes: 2, Outside: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("TIMING 2 nodes Ready: %s", c.NodeReady.Round(time.Millisecond))
	ingress, backend, outside := c.Nodes[0], c.Nodes[1], c.Outside
	hub := newDSRWatch(c.Hub)
	defer hub.stop()

	ns := "dsr"
	clusterNamespace(ctx, t, c.Client, ns)
	server := agentPod("server", []string{"/vmagent", "serve", "--name", "server", "--port", "8080", "--tcp", "--udp"})
	server.Spec.NodeName = backend.Name
	pods := runPods(ctx, t, c, ns, server)
	podIP := pods["server"].Status.PodIP
	t.Logf("DSR pod %s on %s; LBIP %s routed to %s (%s); outside host %s", podIP, backend.Name, dsrLBIP, ingress.Name, ingress.IP, cluster.OutsideIP)

	sh := func(v *vm.VM, who, script string) string {
		t.Helper()
		r, err := v.Exec(ctx, vm.Command{Argv: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if r.ExitCode != 0 {
			t.Fatalf("%s: %q exited %d: %s%s", who, script, r.ExitCode, r.Stdout, r.Stderr)
		}
		return strings.TrimSpace(r.Stdout + r.Stderr)
	}
	// try runs a script whose failure is a finding, not the test's.
	try := func(v *vm.VM, script string) (string, int) {
		r, err := v.Exec(ctx, vm.Command{Argv: []string{"sh", "-c", script}})
		if err != nil {
			return err.Error(), -1
		}
		return strings.TrimSpace(r.Stdout + r.Stderr), r.ExitCode
	}

	// What the nodes have before anything is set up.
	for _, n := range c.Nodes {
		out, _ := try(n.VM, "uname -r; ipvsadm --version; for m in ipip fou ip_tunnel tunnel4 xt_TCPMSS; do "+
			"if grep -q \"^$m \" /proc/modules; then echo \"$m loaded\"; else echo \"$m not loaded\"; fi; done; "+
			"for k in all default eth1; do echo \"rp_filter $k=$(cat /proc/sys/net/ipv4/conf/$k/rp_filter) accept_local $k=$(cat /proc/sys/net/ipv4/conf/$k/accept_local)\"; done; "+
			"echo \"vs.conntrack=$(cat /proc/sys/net/ipv4/vs/conntrack) ip_no_pmtu_disc=$(cat /proc/sys/net/ipv4/ip_no_pmtu_disc) tcp_mtu_probing=$(cat /proc/sys/net/ipv4/tcp_mtu_probing)\"; "+
			"ip link show eth1 | head -1")
		t.Logf("DSR %s before set-up:\n%s", n.Name, out)
	}

	// node-1: the LoadBalancer IP bound, a virtual server with the pod's
	// address as its real server, forwarded by IPIP tunnelling (-i). No
	// tunnel device nor module: IPVS builds the outer header itself.
	sh(ingress.VM, "node-1 set-up", strings.Join([]string{
		"ip link add dsr0 type dummy", "ip link set dsr0 up", "ip addr add " + dsrLBIP + "/32 dev dsr0",
		"ipvsadm -A -t " + dsrLBIP + ":80 -s rr", "ipvsadm -a -t " + dsrLBIP + ":80 -r " + podIP + " -i",
		"ipvsadm -A -u " + dsrLBIP + ":80 -s rr", "ipvsadm -a -u " + dsrLBIP + ":80 -r " + podIP + " -i",
		// Counters: INVALID by conntrack, and the client's SYNs.
		"iptables -t mangle -A PREROUTING -m conntrack --ctstate INVALID",
		"iptables -t mangle -A INPUT -m conntrack --ctstate INVALID",
		"iptables -t mangle -A INPUT -m conntrack --ctstate INVALID -p tcp --tcp-flags SYN,ACK,FIN,RST ACK -m comment --comment ack",
		"iptables -t mangle -A INPUT -m conntrack --ctstate INVALID -p tcp --tcp-flags FIN FIN -m comment --comment fin",
		"iptables -t mangle -A INPUT -m conntrack --ctstate INVALID -p tcp --tcp-flags RST RST -m comment --comment rst",
	}, " && "))
	t.Logf("DSR node-1 IPVS:\n%s", sh(ingress.VM, "ipvsadm", "ipvsadm -Ln; grep -c '^ipip ' /proc/modules || true"))

	// node-2: what the agent programs there today for the same LoadBalancer
	// IP (bound to a dummy, a NAT virtual server to the pod), plus the
	// tunnel's end: IPIP to the pod's address from the segment is marked
	// and routed as local (table dsrTable), tunl0 decapsulates it, the
	// inner packet keeps the mark and is DNATed to podIP:8080.
	sh(backend.VM, "node-2 set-up", strings.Join([]string{
		"ip link add dsr0 type dummy", "ip link set dsr0 up", "ip addr add " + dsrLBIP + "/32 dev dsr0",
		"ipvsadm -A -t " + dsrLBIP + ":80 -s rr", "ipvsadm -a -t " + dsrLBIP + ":80 -r " + podIP + ":8080 -m",
		"modprobe ipip", "ip link set tunl0 up",
		"iptables -t mangle -A PREROUTING -p 4 -d " + podIP + " -j MARK --set-mark " + dsrMark,
		"ip rule add fwmark " + dsrMark + " iif eth1 table " + dsrTable + " priority 100",
		"ip route add local 0.0.0.0/0 dev lo table " + dsrTable,
		"iptables -t nat -A PREROUTING -i tunl0 -m mark --mark " + dsrMark + " -d " + dsrLBIP + " -p tcp --dport 80 -j DNAT --to-destination " + podIP + ":8080",
		"iptables -t nat -A PREROUTING -i tunl0 -m mark --mark " + dsrMark + " -d " + dsrLBIP + " -p udp --dport 80 -j DNAT --to-destination " + podIP + ":8080",
		"iptables -t mangle -A PREROUTING -m conntrack --ctstate INVALID",
		"iptables -t mangle -A FORWARD -m conntrack --ctstate INVALID",
	}, " && "))
	t.Logf("DSR node-2 tunnel end:\n%s", sh(backend.VM, "show", "ip link show tunl0; ip rule; ip route show table "+dsrTable+
		"; for k in all default tunl0; do echo \"rp_filter $k=$(cat /proc/sys/net/ipv4/conf/$k/rp_filter)\"; done"))

	sh(outside, "outside route", "ip route add "+dsrLBIP+"/32 via "+ingress.IP)

	macs := map[string]string{dsrMAC(11): ingress.Name, dsrMAC(12): backend.Name, dsrMAC(100): "outside"}
	lbAddr := dsrLBIP + ":80"
	flush := func() { sh(outside, "flush the PMTU cache", "echo 1 >/proc/sys/net/ipv4/route/flush") }

	t.Run("IPIP: answer, client address, reply path", func(t *testing.T) {
		hub.reset()
		res, err := outside.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: lbAddr, N: 20, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("DSR 20 connections outside -> %s: answers %v, clients seen %v, errors %d %v", lbAddr, res.Answers, res.Clients, len(res.Errors), res.Errors)
		if res.Answers["server"] != 20 || res.Clients[cluster.OutsideIP] != 20 {
			t.Errorf("want 20 answers from the pod, each seeing %s", cluster.OutsideIP)
		}
		// A held connection: conntrack and IPVS on both nodes while it lives.
		conn, err := outside.Dial(ctx, lbAddr)
		if err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(conn).ReadString('\n')
		t.Logf("DSR held connection's greeting: %q", line)
		t.Logf("DSR node-1 while held: IPVS connections:\n%s\nconntrack (port 80):\n%s", sh(ingress.VM, "ipvsadm -Lnc", "ipvsadm -Lnc"),
			sh(ingress.VM, "conntrack", "vmagent conntrack --port 80"))
		t.Logf("DSR node-2 while held: IPVS connections:\n%s\nconntrack (port 80):\n%s", sh(backend.VM, "ipvsadm -Lnc", "ipvsadm -Lnc"),
			sh(backend.VM, "conntrack", "vmagent conntrack --port 80"))
		conn.Close()
		s := hub.snapshot()
		t.Logf("DSR frames on the segment:\n%s", s.report(macs))
		if s.fromVIP[dsrMAC(11)] != 0 || s.fromVIP[dsrMAC(12)] == 0 {
			t.Errorf("replies from %s by sender: %v; want all from node-2 (%s), none from node-1", dsrLBIP, s.fromVIP, dsrMAC(12))
		}
		if s.toVIP[dsrMAC(11)] == 0 || s.toVIP[dsrMAC(12)] != 0 {
			t.Errorf("requests to %s by receiver: %v; want all to node-1", dsrLBIP, s.toVIP)
		}
		t.Logf("DSR INVALID counters:\nnode-1:\n%s\nnode-2:\n%s",
			sh(ingress.VM, "counters", "iptables -t mangle -L -v -n -x | grep -i invalid"),
			sh(backend.VM, "counters", "iptables -t mangle -L -v -n -x | grep -i invalid"))
	})

	t.Run("rp_filter on the tunnel device", func(t *testing.T) {
		// The inner packet arrives on tunl0 from the client, whose route is
		// eth1: strict reverse-path filtering drops it. The effective value
		// is the larger of all and the device's.
		for _, v := range []struct{ all, dev, what, set, undo string }{
			{all: "1", dev: "1"}, {all: "1", dev: "0"}, {all: "1", dev: "2"}, {all: "0", dev: "2"},
			{all: "0", dev: "2", what: "tunl0 with an address",
				set: "ip addr add 10.255.42.1/32 dev tunl0", undo: "ip addr del 10.255.42.1/32 dev tunl0"},
			// The reverse lookup of a forwarded packet has the forward
			// route's output device as its input (cni0 here), not lo.
			{all: "1", dev: "1", what: "src_valid_mark on tunl0 and the mark's reverse route through tunl0 (rule iif lo)",
				set:  "echo 1 >/proc/sys/net/ipv4/conf/tunl0/src_valid_mark && ip rule add fwmark " + dsrMark + " iif lo table 43 priority 101 && ip route add default dev tunl0 table 43",
				undo: "echo 0 >/proc/sys/net/ipv4/conf/tunl0/src_valid_mark && ip rule del fwmark " + dsrMark + " iif lo table 43 priority 101 && ip route del default dev tunl0 table 43"},
			{all: "1", dev: "1", what: "src_valid_mark on tunl0 and the mark's reverse route through tunl0 (rule iif cni0)",
				set:  "echo 1 >/proc/sys/net/ipv4/conf/tunl0/src_valid_mark && ip rule add fwmark " + dsrMark + " iif cni0 table 43 priority 101 && ip route add default dev tunl0 table 43",
				undo: "echo 0 >/proc/sys/net/ipv4/conf/tunl0/src_valid_mark && ip rule del fwmark " + dsrMark + " iif cni0 table 43 priority 101 && ip route del default dev tunl0 table 43"},
			{all: "0", dev: "0"},
		} {
			sh(backend.VM, "rp_filter", "echo "+v.all+" >/proc/sys/net/ipv4/conf/all/rp_filter && echo "+v.dev+" >/proc/sys/net/ipv4/conf/tunl0/rp_filter")
			if v.set != "" {
				sh(backend.VM, v.what, v.set)
				t.Logf("DSR rp_filter variant %q: %s", v.what, sh(backend.VM, "rules", "ip rule; ip route show table 43; ip -4 addr show dev tunl0 | grep inet || true"))
			}
			before := dsrRPFilterCount(ctx, backend.VM)
			res, err := outside.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: lbAddr, N: 3, Timeout: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("DSR rp_filter all=%s tunl0=%s %s: %d of 3 answered (errors %d); before: %s, after: %s", v.all, v.dev, v.what,
				res.Total(), len(res.Errors), before, dsrRPFilterCount(ctx, backend.VM))
			if v.undo != "" {
				sh(backend.VM, "undo "+v.what, v.undo)
			}
		}
	})

	t.Run("MSS: 8 MiB upload over a 1500-byte MTU", func(t *testing.T) {
		const size = 8 << 20
		variants := []struct{ name, node1, node2, undo1, undo2 string }{
			{name: "no clamping"},
			{name: "clamp the client's SYN on node-1 (mangle PREROUTING, --set-mss 1440)",
				node1: "iptables -t mangle -A PREROUTING -d " + dsrLBIP + " -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --set-mss 1440",
				undo1: "iptables -t mangle -D PREROUTING -d " + dsrLBIP + " -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --set-mss 1440"},
			{name: "clamp the pod's SYN-ACK on node-2 (mangle FORWARD, connections that came through the tunnel, --set-mss 1440)",
				node2: "iptables -t mangle -A FORWARD -p tcp --tcp-flags SYN,ACK,RST SYN,ACK -m conntrack --ctorigdst " + dsrLBIP + " -j TCPMSS --set-mss 1440",
				undo2: "iptables -t mangle -D FORWARD -p tcp --tcp-flags SYN,ACK,RST SYN,ACK -m conntrack --ctorigdst " + dsrLBIP + " -j TCPMSS --set-mss 1440"},
		}
		for _, v := range variants {
			if v.node1 != "" {
				sh(ingress.VM, "clamp", v.node1)
			}
			if v.node2 != "" {
				sh(backend.VM, "clamp", v.node2)
			}
			flush()
			hub.reset()
			greeting, lines, took, err := dsrUpload(ctx, outside, lbAddr, size)
			s := hub.snapshot()
			pmtu, _ := try(outside, "ip route get "+dsrLBIP)
			t.Logf("DSR upload, %s: greeting %q, %d of %d lines echoed, %s (%.1f MiB/s), err %v; ICMP frag-needed %v (MTU %v); IPIP frames from node-1: %d, largest %d bytes; client's route after: %s",
				v.name, strings.TrimSpace(greeting), lines, size/1024, took.Round(time.Millisecond), float64(size)/(1<<20)/took.Seconds(), err,
				s.fragNeeded, s.fragMTU, s.ipip[dsrMAC(11)], s.ipipMax, pmtu)
			t.Logf("DSR TCP MSS in SYNs seen: %v", s.mss)
			if v.undo1 != "" {
				sh(ingress.VM, "unclamp", v.undo1)
			}
			if v.undo2 != "" {
				sh(backend.VM, "unclamp", v.undo2)
			}
			if strings.HasPrefix(v.name, "clamp the pod") && (err != nil || lines != size/1024 || len(s.fragNeeded) != 0) {
				t.Errorf("clamped on node-2: the upload must complete with no fragmentation needed")
			}
		}
	})

	t.Run("UDP over the tunnel MTU", func(t *testing.T) {
		// The client's datagrams on one socket: small, then 1472 bytes
		// (1500 with headers: DF set by Linux's default PMTU discovery)
		// three times, then 2000 bytes (fragmented by the client); then
		// with IP_PMTUDISC_DO.
		for _, mode := range []struct{ pmtudisc, sizes string }{{"want", "100,1472,1472,1472,2000"}, {"do", "1472,1472,1400"}} {
			flush()
			hub.reset()
			out, code := try(outside, "vmagent udp-send --addr "+lbAddr+" --pmtudisc "+mode.pmtudisc+" --sizes "+mode.sizes)
			s := hub.snapshot()
			pmtu, _ := try(outside, "ip route get "+dsrLBIP)
			t.Logf("DSR UDP, pmtudisc %s (exit %d):\n%s\nframes:\n%s\nclient's route after: %s", mode.pmtudisc, code, out, s.report(macs), pmtu)
		}
	})

	t.Run("GUE (fou)", func(t *testing.T) {
		// node-1: the same real server with GUE encapsulation to
		// dsrGUEPort; node-2: a fou listener for GUE on that port.
		out, code := try(backend.VM, "modprobe fou && grep -E '^(fou|ip_tunnel|udp_tunnel|ip6_udp_tunnel) ' /proc/modules | cut -d' ' -f1 | tr '\\n' ' '; "+
			"ip fou add port "+dsrGUEPort+" gue 2>&1")
		t.Logf("DSR GUE on node-2: modules and busybox ip fou: %q exit %d", out, code)
		out, code = try(backend.VM, "vmagent fou-add --port "+dsrGUEPort+" --gue 2>&1")
		t.Logf("DSR GUE fou listener through vmagent: %q exit %d", out, code)
		out, code = try(ingress.VM, "ipvsadm -e -t "+lbAddr+" -r "+podIP+" -i --tun-type gue --tun-port "+dsrGUEPort+" && ipvsadm -Ln -t "+lbAddr+" --tun-info")
		t.Logf("DSR GUE on node-1: ipvsadm: %q exit %d", out, code)
		if code != 0 {
			return
		}
		// The outer UDP to the pod's address is marked as IPIP's was (so
		// routed as local); fou hands the inner IPIP to tunl0, whose DNAT
		// by mark is already there.
		sh(backend.VM, "GUE mark", "iptables -t mangle -A PREROUTING -p udp --dport "+dsrGUEPort+" -d "+podIP+" -j MARK --set-mark "+dsrMark)
		hub.reset()
		res, err := outside.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: lbAddr, N: 5, Timeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s := hub.snapshot()
		t.Logf("DSR GUE: 5 connections: answers %v clients %v errors %v\nframes:\n%s", res.Answers, res.Clients, res.Errors, s.report(macs))
		t.Logf("DSR GUE node-2 links: %s", sh(backend.VM, "links", "ip -o link show | cut -d: -f2 | tr '\\n' ' '"))
	})
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// dsrRPFilterCount reads the kernel's count of packets dropped by reverse
// path filtering (TcpExt IPReversePathFilter).
func dsrRPFilterCount(ctx context.Context, v *vm.VM) string {
	out, err := v.RunOK(ctx, "cat", "/proc/net/netstat")
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		keys, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j, k := range keys {
			if k == "IPReversePathFilter" && j < len(vals) {
				return "IPReversePathFilter=" + vals[j]
			}
		}
	}
	return "IPReversePathFilter not found"
}

// dsrUpload sends size bytes in lines of 1 KiB on one connection from v to
// addr while counting the lines the backend echoes (one per line sent,
// after its greeting).
func dsrUpload(ctx context.Context, v *vm.VM, addr string, size int) (greeting string, lines int, took time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	start := time.Now()
	conn, err := v.Dial(ctx, addr)
	if err != nil {
		return "", 0, 0, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	want := size / 1024
	werr := make(chan error, 1)
	go func() {
		line := []byte(strings.Repeat("u", 1023) + "\n")
		var err error
		for i := 0; i < want && err == nil; i++ {
			_, err = conn.Write(line)
		}
		werr <- err
	}()
	r := bufio.NewReader(conn)
	if greeting, err = r.ReadString('\n'); err != nil {
		return greeting, 0, time.Since(start), err
	}
	for lines < want {
		if _, err = r.ReadString('\n'); err != nil {
			break
		}
		lines++
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err == nil {
		err = <-werr
	}
	return greeting, lines, time.Since(start), err
}

// dsrMAC is the segment MAC of the VM at cluster.SegmentAddr(i) (as the
// cluster package makes them).
func dsrMAC(i int) string { return fmt.Sprintf("52:54:00:38:00:%02x", i) }

// dsrWatch counts the frames of the prototype that the segment's hub
// carries.
type dsrWatch struct {
	unwatch func()
	lbip    netip.Addr
	mu      sync.Mutex
	s       dsrSnapshot
}

type dsrSnapshot struct {
	toVIP      map[string]int // frames to the LBIP, by destination MAC
	fromVIP    map[string]int // frames from the LBIP, by source MAC
	ipip       map[string]int // IPIP frames, by source MAC
	outer      map[string]int // IPIP and GUE frames, by outer "src->dst"
	gue        map[string]int // UDP frames to the GUE port, by source MAC
	ipipMax    int            // the largest IPIP or GUE frame's IP length
	fragNeeded map[string]int // ICMP fragmentation needed, by source MAC
	fragMTU    map[int]int    // their next-hop MTU
	fragments  map[string]int // IPv4 fragments, by source MAC
	mss        map[string]int // "SYN mss=N" and "SYN-ACK mss=N" by MAC
}

func newDSRWatch(h *vm.Hub) *dsrWatch {
	w := &dsrWatch{lbip: netip.MustParseAddr(dsrLBIP)}
	w.reset()
	w.unwatch = h.Watch(w.frame)
	return w
}

func (w *dsrWatch) stop() { w.unwatch() }

func (w *dsrWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.s = dsrSnapshot{toVIP: map[string]int{}, outer: map[string]int{}, fromVIP: map[string]int{}, ipip: map[string]int{}, gue: map[string]int{},
		fragNeeded: map[string]int{}, fragMTU: map[int]int{}, fragments: map[string]int{}, mss: map[string]int{}}
}

// snapshot is a copy of the counts since the last reset.
func (w *dsrWatch) snapshot() dsrSnapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.s
	s.toVIP, s.fromVIP, s.ipip, s.gue, s.outer = maps.Clone(s.toVIP), maps.Clone(s.fromVIP), maps.Clone(s.ipip), maps.Clone(s.gue), maps.Clone(s.outer)
	s.fragNeeded, s.fragMTU, s.fragments, s.mss = maps.Clone(s.fragNeeded), maps.Clone(s.fragMTU), maps.Clone(s.fragments), maps.Clone(s.mss)
	return s
}

func (w *dsrWatch) frame(f []byte) {
	if len(f) < 34 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		return
	}
	dst, src := macString(f[0:6]), macString(f[6:12])
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ihl < 20 || len(ip) < ihl {
		return
	}
	proto := ip[9]
	s, d := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	frag := binary.BigEndian.Uint16(ip[6:8])
	w.mu.Lock()
	defer w.mu.Unlock()
	if frag&0x3fff != 0 {
		w.s.fragments[src]++
	}
	switch {
	case d == w.lbip:
		w.s.toVIP[dst]++
	case s == w.lbip:
		w.s.fromVIP[src]++
	}
	switch {
	case proto == 4:
		w.s.ipip[src]++
		w.s.outer[s.String()+"->"+d.String()]++
		w.s.ipipMax = max(w.s.ipipMax, total)
		if len(ip) > ihl+20 {
			inner := ip[ihl:]
			if iihl := int(inner[0]&0x0f) * 4; inner[9] == 6 && len(inner) >= iihl+20 {
				w.syn("inner "+netip.AddrFrom4([4]byte(inner[12:16])).String()+"->"+netip.AddrFrom4([4]byte(inner[16:20])).String(), inner[iihl:])
			}
		}
	case proto == 17 && len(ip) >= ihl+4 && fmt.Sprint(binary.BigEndian.Uint16(ip[ihl+2:ihl+4])) == dsrGUEPort:
		w.s.gue[src]++
		w.s.outer[s.String()+"->"+d.String()]++
		w.s.ipipMax = max(w.s.ipipMax, total)
	case proto == 1 && len(ip) >= ihl+8 && ip[ihl] == 3 && ip[ihl+1] == 4:
		w.s.fragNeeded[src]++
		w.s.fragMTU[int(binary.BigEndian.Uint16(ip[ihl+6:ihl+8]))]++
	case proto == 6 && len(ip) >= ihl+20 && frag&0x1fff == 0:
		w.syn(s.String()+"->"+d.String(), ip[ihl:])
	}
}

// syn counts a TCP SYN's or SYN-ACK's MSS option (w.mu held).
func (w *dsrWatch) syn(what string, tcp []byte) {
	flags := tcp[13]
	if flags&0x02 == 0 {
		return
	}
	kind := "SYN"
	if flags&0x10 != 0 {
		kind = "SYN-ACK"
	}
	off := int(tcp[12]>>4) * 4
	for i := 20; i+3 < off && i+3 < len(tcp); {
		switch tcp[i] {
		case 0:
			return
		case 1:
			i++
		case 2:
			w.s.mss[fmt.Sprintf("%s %s mss=%d", kind, what, binary.BigEndian.Uint16(tcp[i+2:i+4]))]++
			return
		default:
			i += max(int(tcp[i+1]), 2)
		}
	}
}

func macString(b []byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}

// report prints the counts with the MACs named.
func (s dsrSnapshot) report(names map[string]string) string {
	name := func(m map[string]int) string {
		var parts []string
		for k, v := range m {
			n := names[k]
			if n == "" {
				n = k
			}
			parts = append(parts, fmt.Sprintf("%s=%d", n, v))
		}
		sort.Strings(parts)
		return "{" + strings.Join(parts, " ") + "}"
	}
	return fmt.Sprintf("  to LBIP by receiving MAC %s\n  from LBIP by sending MAC %s\n  IPIP by sender %s, GUE by sender %s, outer addresses %v, largest outer %d bytes\n  ICMP frag-needed by sender %s MTUs %v\n  IPv4 fragments by sender %s",
		name(s.toVIP), name(s.fromVIP), name(s.ipip), name(s.gue), s.outer, s.ipipMax, name(s.fragNeeded), s.fragMTU, name(s.fragments))
}
