package tunnelend

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// The bed of TestTunnelEndsOnKernel, all in namespaces the test makes: the
// test's own namespace routes between a client, an ingress node whose IPVS
// tunnels VIP:80 to the pod, and the backend node that runs TunnelEnd,
// behind which the pod serves on 8080. The reply goes from the backend
// node to the client, not through the ingress node.
const (
	nsClient, nsIngress, nsNode, nsPod = "teclient", "teingress", "tenode", "tepod"
	clientAddr                         = "192.168.57.100"
	ingressAddr                        = "192.168.56.11"
	nodeAddr                           = "192.168.58.12"
	podAddr                            = "10.244.1.2"
	vipIPIP, vipGUE                    = "192.168.56.210", "192.168.56.211"
	guePort                            = 6080
)

// recordingTables counts the restores, to show a sync with nothing to do
// writes nothing on the real iptables (what it wrote reads back equal).
type recordingTables struct {
	Tables
	restores int
	last     string
}

func (r *recordingTables) Restore(ctx context.Context, input string) error {
	r.restores++
	r.last = input
	return r.Tables.Restore(ctx, input)
}

// step runs one part of a kernel test on the test's goroutine (a subtest's
// goroutine would not be in the test's namespace, InFreshNetns's).
func step(t *testing.T, name string, fn func()) {
	t.Helper()
	t.Logf("step: %s", name)
	fn()
}

func TestTunnelEndsOnKernel(t *testing.T) {
	nltest.InFreshNetns(t)
	for _, m := range []string{"ipip", "fou", "xt_TCPMSS"} {
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			nltest.Require(t, "module "+m, fmt.Errorf("%w: %s", err, out))
		}
	}
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		nltest.Require(t, "ipvsadm", err)
	}
	buildBed(t)
	ipvsadm(t, "-A", "-t", vipIPIP+":80", "-s", "rr")
	ipvsadm(t, "-a", "-t", vipIPIP+":80", "-r", podAddr, "-i")
	ipvsadm(t, "-A", "-u", vipIPIP+":80", "-s", "rr")
	ipvsadm(t, "-a", "-u", vipIPIP+":80", "-r", podAddr, "-i")
	ipvsadm(t, "-A", "-t", vipGUE+":80", "-s", "rr")
	ipvsadm(t, "-a", "-t", vipGUE+":80", "-r", podAddr, "-i", "--tun-type", "gue", "--tun-port", strconv.Itoa(guePort))
	// What passes the ingress node: requests to the VIPs (counted to show
	// the counter counts), replies from them (none may).
	iptables(t, nsIngress, "-t", "mangle", "-A", "PREROUTING", "-d", vipIPIP, "-m", "comment", "--comment", "requests")
	iptables(t, nsIngress, "-t", "mangle", "-A", "PREROUTING", "-s", vipIPIP, "-m", "comment", "--comment", "replies")
	// What the router (this test's namespace) gets from the VIP, by the
	// node it comes from.
	iptables(t, "", "-t", "mangle", "-A", "PREROUTING", "-i", nettest.HostVeth(nsNode), "-s", vipIPIP, "-m", "comment", "--comment", "from-node")
	iptables(t, "", "-t", "mangle", "-A", "PREROUTING", "-i", nettest.HostVeth(nsIngress), "-s", vipIPIP, "-m", "comment", "--comment", "from-ingress")

	clk := clocktesting.NewFakePassiveClock(time.Now())
	var rec *recordingTables
	var te *TunnelEnd
	inNode(t, func() error {
		ipt, err := glue.NewIPTables(glue.Exec{}, glue.NFT, ipset.IPv4)
		if err != nil {
			return err
		}
		rec = &recordingTables{Tables: ipt}
		k := Kernel{Tables: rec, Net: Netlink{H: &netlink.Handle{}}, Sysctls: netlinkutil.Sysctls{Root: "/proc/sys"}}
		te, err = New(Config{Grace: 10 * time.Second, Clock: clk}, k, zaptest.NewLogger(t))
		return err
	})
	svc := types.NamespacedName{Namespace: "ns", Name: "dsr"}
	pod := netip.MustParseAddr(podAddr)
	ends := []End{
		{VIP: netip.MustParseAddr(vipIPIP), Protocol: ktypes.TCP, Port: 80, Endpoint: netip.AddrPortFrom(pod, 8080), Forward: ktypes.ForwardTunnel},
		{VIP: netip.MustParseAddr(vipIPIP), Protocol: ktypes.UDP, Port: 80, Endpoint: netip.AddrPortFrom(pod, 8080), Forward: ktypes.ForwardTunnel},
		{VIP: netip.MustParseAddr(vipGUE), Protocol: ktypes.TCP, Port: 80, Endpoint: netip.AddrPortFrom(pod, 8080), Forward: ktypes.ForwardGUE, GUEPort: guePort},
	}
	te.SetEnds(svc, ends, []netip.Addr{pod})

	step(t, "record what vishvananda/netlink's own FouAdd gets for GUE (Netlink.AddFou does not use it)", func() {
		err := nettest.Do(nsIngress, func() error {
			err := netlink.FouAdd(netlink.Fou{Family: unix.AF_INET, Port: guePort + 1, EncapType: netlink.FOU_ENCAP_GUE})
			if err == nil {
				return netlink.FouDel(netlink.Fou{Family: unix.AF_INET, Port: guePort + 1})
			}
			return err
		})
		t.Logf("vishvananda/netlink v1.3.1 FouAdd(GUE) on this kernel: %v", err)
	})
	step(t, "all.rp_filter 1 refuses the Service and programs nothing", func() {
		sysctl(t, nsNode, sysctlAllRPFilter, "1")
		syncIn(t, te, false)
		if f := te.ServiceFailures()[svc]; !strings.Contains(f, "net.ipv4.conf.all.rp_filter is 1") {
			t.Errorf("failure %q, want the rp_filter refusal", f)
		}
		if left := leftovers(t); left != "" {
			t.Errorf("programmed while refused: %s", left)
		}
		sysctl(t, nsNode, sysctlAllRPFilter, "0")
	})
	syncIn(t, te, false)
	if f := te.ServiceFailures(); len(f) != 0 {
		t.Fatalf("failures %v", f)
	}

	step(t, "IPIP, TCP and UDP: the pod answers with the remap and sees the client", func() {
		for _, proto := range []string{"tcp", "udp"} {
			res := hit(t, proto, vipIPIP+":80", 5)
			if res.Answers["pod"] != 5 || res.Clients[clientAddr] != 5 {
				t.Errorf("%s: answers %v clients %v errors %v, want 5 from the pod, each seeing %s", proto, res.Answers, res.Clients, res.Errors, clientAddr)
			}
		}
		req, rep := counter(t, nsIngress, "requests"), counter(t, nsIngress, "replies")
		fromNode, fromIngress := counter(t, "", "from-node"), counter(t, "", "from-ingress")
		t.Logf("packets: to the VIP into the ingress node %d, from the VIP into it %d; at the router, from the VIP: out of the backend node %d, out of the ingress node %d",
			req, rep, fromNode, fromIngress)
		if req == 0 || rep != 0 || fromNode == 0 || fromIngress != 0 {
			t.Errorf("want requests through the ingress node, no reply through it, replies out of the backend node with the VIP as source")
		}
	})
	step(t, "IPIP: the pod's SYN-ACK MSS is clamped to 1440", func() { checkMSS(t, vipIPIP, 1440) })
	step(t, "GUE: the pod answers, SYN-ACK MSS 1428", func() {
		res := hit(t, "tcp", vipGUE+":80", 5)
		if res.Answers["pod"] != 5 || res.Clients[clientAddr] != 5 {
			t.Errorf("answers %v clients %v errors %v, want 5 from the pod, each seeing %s", res.Answers, res.Clients, res.Errors, clientAddr)
		}
		checkMSS(t, vipGUE, 1428)
	})
	step(t, "a full sync with nothing changed writes nothing", func() {
		before := rec.restores
		syncIn(t, te, true)
		if rec.restores != before {
			t.Errorf("%d restores: the rules read back differ from those written; the last:\n%s", rec.restores-before, rec.last)
		}
	})
	step(t, "a full sync repairs a DNAT rule deleted by hand", func() {
		iptables(t, nsNode, "-t", "nat", "-D", chainDNAT, "1")
		if res := hit(t, "tcp", vipIPIP+":80", 1); res.Total() != 0 {
			t.Fatalf("answered without the DNAT rule: %v", res.Answers)
		}
		syncIn(t, te, false)
		if res := hit(t, "tcp", vipIPIP+":80", 1); res.Total() != 0 {
			t.Errorf("a partial sync repaired it: it must not read the kernel")
		}
		syncIn(t, te, true)
		if res := hit(t, "tcp", vipIPIP+":80", 3); res.Answers["pod"] != 3 {
			t.Errorf("after the full sync: answers %v errors %v", res.Answers, res.Errors)
		}
	})
	step(t, "an end that leaves is held for the grace, then nothing is left", func() {
		te.SetEnds(svc, nil, []netip.Addr{pod})
		syncIn(t, te, false)
		if res := hit(t, "tcp", vipIPIP+":80", 2); res.Answers["pod"] != 2 {
			t.Errorf("during the grace: answers %v errors %v", res.Answers, res.Errors)
		}
		clk.SetTime(clk.Now().Add(10 * time.Second))
		syncIn(t, te, false)
		if left := leftovers(t); left != "" {
			t.Errorf("after the grace: %s", left)
		}
	})
}

// buildBed makes the namespaces and routes of the bed.
func buildBed(t *testing.T) {
	t.Helper()
	for _, n := range []struct{ name, host, addr string }{
		{nsClient, "192.168.57.1/24", clientAddr + "/24"},
		{nsIngress, "192.168.56.1/24", ingressAddr + "/24"},
		{nsNode, "192.168.58.1/24", nodeAddr + "/24"},
	} {
		addNetns(t, n.name, n.host, n.addr)
	}
	inNode(t, func() error {
		return nettest.AddNetns(nsPod, nettest.NetnsConfig{HostAddr: netip.MustParsePrefix("10.244.1.1/24"), Addr: netip.MustParsePrefix(podAddr + "/24")})
	})
	t.Cleanup(func() { _ = nettest.DelNetns(nsPod) })
	for _, ns := range []string{"", nsIngress, nsNode} {
		sysctl(t, ns, "net/ipv4/ip_forward", "1")
	}
	route(t, "", vipIPIP+"/32", ingressAddr)
	route(t, "", vipGUE+"/32", ingressAddr)
	route(t, "", "10.244.1.0/24", nodeAddr)
	if err := nettest.Do(nsIngress, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, vip := range []string{vipIPIP, vipGUE} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(vip), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	srv, err := nettest.Serve(nettest.ServeConfig{Netns: nsPod, Name: "pod", Port: 8080, TCP: true, UDP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
}

func addNetns(t *testing.T, name, host, addr string) {
	t.Helper()
	if err := nettest.AddNetns(name, nettest.NetnsConfig{HostAddr: netip.MustParsePrefix(host), Addr: netip.MustParsePrefix(addr)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nettest.DelNetns(name); err != nil {
			t.Errorf("delete netns: %v", err)
		}
	})
}

func route(t *testing.T, ns, dst, via string) {
	t.Helper()
	_, d, _ := net.ParseCIDR(dst)
	if err := nettest.Do(ns, func() error { return netlink.RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(via)}) }); err != nil {
		t.Fatalf("route %s via %s: %v", dst, via, err)
	}
}

func sysctl(t *testing.T, ns, name, value string) {
	t.Helper()
	if err := nettest.Do(ns, func() error {
		_, err := netlinkutil.Sysctls{Root: "/proc/sys"}.Ensure(name, value)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// inNode runs fn in the backend node's namespace: the tools it runs and
// the netlink sockets and /proc/sys files it opens are that namespace's.
func inNode(t *testing.T, fn func() error) {
	t.Helper()
	if err := nettest.Do(nsNode, fn); err != nil {
		t.Fatal(err)
	}
}

func syncIn(t *testing.T, te *TunnelEnd, full bool) {
	t.Helper()
	inNode(t, func() error { return te.Sync(full) })
}

func run(t *testing.T, ns, name string, args ...string) string {
	t.Helper()
	var out []byte
	if err := nettest.Do(ns, func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("%s %s in %s: %v: %s", name, strings.Join(args, " "), ns, err, out)
	}
	return string(out)
}

func ipvsadm(t *testing.T, args ...string) { run(t, nsIngress, "ipvsadm", args...) }

func iptables(t *testing.T, ns string, args ...string) { run(t, ns, "iptables-nft", args...) }

// counter reads the packet count of the rule with that comment.
func counter(t *testing.T, ns, comment string) int {
	t.Helper()
	for _, line := range strings.Split(run(t, ns, "iptables-nft-save", "-c", "-t", "mangle"), "\n") {
		if strings.Contains(line, `--comment `+comment) {
			n, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(line, ":", 2)[0], "["))
			if err != nil {
				t.Fatalf("counter of %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no rule %q in %s", comment, ns)
	return 0
}

func hit(t *testing.T, proto, addr string, n int) nettest.HitResult {
	t.Helper()
	res, err := nettest.Hit(context.Background(), nettest.HitConfig{Netns: nsClient, Proto: proto, Addr: addr, N: n, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// checkMSS connects from the client and reads the MSS its socket uses,
// which the pod's SYN-ACK bounds: the clamp less the timestamps option
// (12 bytes) when both ends use it. Unclamped it would be 1448.
func checkMSS(t *testing.T, vip string, clamp int) {
	t.Helper()
	var mss int
	if err := nettest.Do(nsClient, func() error {
		c, err := net.DialTimeout("tcp", vip+":80", 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
			return err
		}
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the client's MSS to %s: %d (clamp %d)", vip, mss, clamp)
	if mss > clamp || mss < clamp-12 {
		t.Errorf("client's MSS %d, want %d less at most 12 bytes of options", mss, clamp)
	}
}

// leftovers describes what the backend node still holds of ours ("" for
// nothing).
func leftovers(t *testing.T) string {
	t.Helper()
	var left []string
	for _, line := range strings.Split(run(t, nsNode, "iptables-nft-save"), "\n") {
		if strings.Contains(line, ChainPrefix) {
			left = append(left, line)
		}
	}
	inNode(t, func() error {
		n := Netlink{H: &netlink.Handle{}}
		rules, err := n.Rules(DefaultRulePriority)
		if err != nil {
			return err
		}
		routes, err := n.Routes(DefaultTable)
		if err != nil {
			return err
		}
		ports, err := n.FouPorts()
		if err != nil {
			return err
		}
		for _, r := range rules {
			left = append(left, "rule "+r.String())
		}
		for _, r := range routes {
			left = append(left, "route "+r.String())
		}
		for _, p := range ports {
			left = append(left, fmt.Sprintf("fou %d", p))
		}
		return nil
	})
	return strings.Join(left, "; ")
}
