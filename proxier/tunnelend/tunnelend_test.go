package tunnelend

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

var (
	svcA = types.NamespacedName{Namespace: "ns", Name: "a"}
	svcB = types.NamespacedName{Namespace: "ns", Name: "b"}
	pod1 = netip.MustParseAddr("10.244.1.2")
	pod2 = netip.MustParseAddr("10.244.1.3")
)

func ipip(vip string, port uint16, pod netip.Addr, target uint16) End {
	return End{VIP: netip.MustParseAddr(vip), Protocol: ktypes.TCP, Port: port, Endpoint: netip.AddrPortFrom(pod, target), Forward: ktypes.ForwardTunnel}
}

func gue(vip string, port uint16, pod netip.Addr, target, guePort uint16) End {
	e := ipip(vip, port, pod, target)
	e.Forward, e.GUEPort = ktypes.ForwardGUE, guePort
	return e
}

func newTest(t *testing.T, cfg Config) (*TunnelEnd, *fakeKernel, *clocktesting.FakePassiveClock) {
	t.Helper()
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	cfg.Clock = clk
	k := newFakeKernel()
	te, err := New(cfg, k.kernel(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return te, k, clk
}

// base is the fake kernel's state apart from what the ends add.
var base = []string{"link tunl0 {Exists:true Up:false}", "sysctl net/ipv4/conf/all/rp_filter = 0", "sysctl net/ipv4/conf/tunl0/rp_filter = 2"}

// programmed is the whole state for svcA's IPIP end 80 -> pod1:8080 and
// svcB's GUE end 443 -> pod2:8443 on port 6080, with the default marks.
var programmed = []string{
	"mangle :IPVSD-PREROUTING",
	"mangle :IPVSD-FORWARD",
	`mangle -A FORWARD -m comment --comment "ipvs-proxy: tunnel ends" -j IPVSD-FORWARD`,
	"mangle -A IPVSD-FORWARD -s 10.244.1.2/32 -p tcp -m tcp --sport 8080 --tcp-flags SYN,RST,ACK SYN,ACK -m conntrack --ctorigdst 192.168.56.210 --ctorigdstport 80 -j TCPMSS --set-mss 1440",
	"mangle -A IPVSD-FORWARD -s 10.244.1.3/32 -p tcp -m tcp --sport 8443 --tcp-flags SYN,RST,ACK SYN,ACK -m conntrack --ctorigdst 192.168.56.211 --ctorigdstport 443 -j TCPMSS --set-mss 1428",
	"mangle -A IPVSD-PREROUTING -i tunl0 -m mark --mark 0x8000000/0x8000000 -j MARK --set-xmark 0x0/0x8000000",
	"mangle -A IPVSD-PREROUTING -d 10.244.1.2/32 -p 4 -j MARK --set-xmark 0x8100000/0xff00000",
	"mangle -A IPVSD-PREROUTING -d 10.244.1.3/32 -p 4 -j MARK --set-xmark 0x8200000/0xff00000", // GUE connections become IPIP after gue -> nat
	"mangle -A IPVSD-PREROUTING -d 10.244.1.3/32 -p udp -m udp --dport 6080 -j MARK --set-xmark 0x8200000/0xff00000",
	`mangle -A PREROUTING -m comment --comment "ipvs-proxy: tunnel ends" -j IPVSD-PREROUTING`,
	"nat :IPVSD-PREROUTING",
	"nat -A IPVSD-PREROUTING -d 192.168.56.210/32 -i tunl0 -p tcp -m mark --mark 0x100000/0x7f00000 -m tcp --dport 80 -j DNAT --to-destination 10.244.1.2:8080",
	"nat -A IPVSD-PREROUTING -d 192.168.56.211/32 -i tunl0 -p tcp -m mark --mark 0x200000/0x7f00000 -m tcp --dport 443 -j DNAT --to-destination 10.244.1.3:8443",
	`nat -A PREROUTING -m comment --comment "ipvs-proxy: tunnel ends" -j IPVSD-PREROUTING`,
	"rule 4300: fwmark 0x8000000/0x8000000 lookup 4300",
	"route local 0.0.0.0/0 dev lo table 4300",
	"fou gue 6080",
	"link tunl0 {Exists:true Up:true}",
	"sysctl net/ipv4/conf/all/rp_filter = 0",
	"sysctl net/ipv4/conf/tunl0/rp_filter = 0",
}

// cleaned is the state after every end left: empty tables stay, as
// iptables-save shows them; tunl0 stays up with its rp_filter at 0.
var cleaned = []string{"link tunl0 {Exists:true Up:true}", "sysctl net/ipv4/conf/all/rp_filter = 0", "sysctl net/ipv4/conf/tunl0/rp_filter = 0"}

func setBoth(te *TunnelEnd) {
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080)}, []netip.Addr{pod1})
	te.SetEnds(svcB, []End{gue("192.168.56.211", 443, pod2, 8443, 6080)}, []netip.Addr{pod2})
}

func TestSyncProgramsEveryHook(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	if diff := cmp.Diff(base, k.dump()); diff != "" {
		t.Fatalf("before (-want +got):\n%s", diff)
	}
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(programmed, k.dump()); diff != "" {
		t.Errorf("programmed (-want +got):\n%s", diff)
	}
	if f := te.ServiceFailures(); len(f) != 0 {
		t.Errorf("failures %v", f)
	}
	// Both leave with their endpoints: everything goes at once.
	te.SetEnds(svcA, nil, nil)
	te.SetEnds(svcB, nil, nil)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cleaned, k.dump()); diff != "" {
		t.Errorf("after the ends left (-want +got):\n%s", diff)
	}
}

func TestPartialSyncWritesOnlyWhatChanged(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	if err := te.Sync(true); err != nil {
		t.Fatal(err)
	}
	k.calls = nil
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if err := te.Sync(true); err != nil {
		t.Fatal(err)
	}
	if len(k.calls) != 0 {
		t.Errorf("syncs with nothing changed wrote %q", k.calls)
	}
	// A second endpoint of svcA: one restore of both tables, nothing else.
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080), ipip("192.168.56.210", 80, netip.MustParseAddr("10.244.1.4"), 8080)},
		[]netip.Addr{pod1, netip.MustParseAddr("10.244.1.4")})
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if len(k.calls) != 1 || !strings.HasPrefix(k.calls[0], "restore:") {
		t.Errorf("adding an endpoint wrote %q, want one restore of the changed chains", k.calls)
	}
	if !slices.Contains(k.dump(), "mangle -A IPVSD-PREROUTING -d 10.244.1.4/32 -p 4 -j MARK --set-xmark 0x8300000/0xff00000") {
		t.Errorf("the new endpoint has no mark 3:\n%s", strings.Join(k.dump(), "\n"))
	}
}

func TestFullSyncRepairs(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	// Deleted by hand: a DNAT rule, the policy rule, the GUE port; tunl0
	// set down; and someone else's chain and rule that must stay.
	k.tables["nat"].Rules[chainDNAT] = k.tables["nat"].Rules[chainDNAT][1:]
	k.rules, k.fou = nil, nil
	k.links[Device] = Link{Exists: true}
	k.tables["nat"].Chains = append(k.tables["nat"].Chains, "OTHER")
	k.tables["nat"].Rules["OTHER"] = []string{"-A OTHER -j RETURN"}
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(programmed, k.dump()) {
		t.Fatal("a partial sync read the kernel")
	}
	if err := te.Sync(true); err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(programmed), "nat :OTHER", "nat -A OTHER -j RETURN")
	if diff := cmp.Diff(sortedCopy(want), sortedCopy(k.dump())); diff != "" {
		t.Errorf("after the full sync (-want +got):\n%s", diff)
	}
}

func sortedCopy(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func TestNatJumpMovesAheadOfTheGlue(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	glueJump := `-A PREROUTING -m comment --comment "ipvs-proxy: Service traffic" -j IPVSP-SERVICES`
	nat := k.tables["nat"]
	nat.Rules["PREROUTING"] = append([]string{glueJump}, nat.Rules["PREROUTING"]...)
	if err := te.Sync(true); err != nil {
		t.Fatal(err)
	}
	want := []string{`-A PREROUTING -m comment --comment "ipvs-proxy: tunnel ends" -j IPVSD-PREROUTING`, glueJump}
	if diff := cmp.Diff(want, nat.Rules["PREROUTING"]); diff != "" {
		t.Errorf("nat PREROUTING (-want +got):\n%s", diff)
	}
}

func TestGraceHoldsAnEndWhileItsEndpointStays(t *testing.T) {
	te, k, clk := newTest(t, Config{Grace: time.Minute})
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	// svcA goes back to NAT: its pod stays on the node, so the end is held.
	te.SetEnds(svcA, nil, []netip.Addr{pod1})
	// svcB's pod leaves the node: its end goes at once.
	te.SetEnds(svcB, nil, nil)
	if at, ok := te.NextExpiry(); !ok || !at.Equal(clk.Now().Add(time.Minute)) {
		t.Errorf("next expiry %v %v, want in a minute", at, ok)
	}
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	held := slices.DeleteFunc(slices.Clone(programmed), func(s string) bool {
		return strings.Contains(s, "10.244.1.3") || strings.Contains(s, "fou gue")
	})
	if diff := cmp.Diff(held, k.dump()); diff != "" {
		t.Errorf("while held (-want +got):\n%s", diff)
	}
	clk.SetTime(clk.Now().Add(59 * time.Second))
	if err := te.Sync(true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(held, k.dump()); diff != "" {
		t.Errorf("before the grace is over (-want +got):\n%s", diff)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cleaned, k.dump()); diff != "" {
		t.Errorf("after the grace (-want +got):\n%s", diff)
	}
}

func TestTargetPortChangeIsNotHeldBack(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080)}, []netip.Addr{pod1})
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	// The old end is held (the pod stays), but the new target takes its
	// VIP, port and endpoint at once.
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 9090)}, []netip.Addr{pod1})
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if f := te.ServiceFailures(); len(f) != 0 {
		t.Errorf("failures %v", f)
	}
	want := []string{"-A IPVSD-PREROUTING -d 192.168.56.210/32 -i tunl0 -p tcp -m mark --mark 0x100000/0x7f00000 -m tcp --dport 80 -j DNAT --to-destination 10.244.1.2:9090"}
	if diff := cmp.Diff(want, k.tables["nat"].Rules[chainDNAT]); diff != "" {
		t.Errorf("DNAT rules (-want +got):\n%s", diff)
	}
}

func TestHeldEndGoesWhenItsEndpointLeaves(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	te.SetEnds(svcB, nil, nil)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	te.SetEnds(svcA, nil, []netip.Addr{pod1})
	te.SetEnds(svcA, nil, nil) // the pod is gone too
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cleaned, k.dump()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, ok := te.NextExpiry(); ok {
		t.Error("an end is still held")
	}
}

func TestServiceFailures(t *testing.T) {
	v6 := End{VIP: netip.MustParseAddr("2001:db8::1"), Protocol: ktypes.TCP, Port: 80,
		Endpoint: netip.MustParseAddrPort("[fd00::2]:8080"), Forward: ktypes.ForwardTunnel}
	nat := ipip("192.168.56.212", 80, pod1, 8080)
	nat.Forward = ktypes.ForwardNAT
	for _, tc := range []struct {
		name    string
		cfg     Config
		kernel  func(*fakeKernel)
		ends    map[types.NamespacedName][]End
		failing map[types.NamespacedName]string // substring of the reason
		retry   bool
		rules   int // DNAT rules programmed
	}{{
		name:    "IPv6 fails alone",
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080), v6}},
		failing: map[types.NamespacedName]string{svcA: "IPv6 tunnel ends are not built yet"},
		rules:   1,
	}, {
		name:    "not a tunnel",
		ends:    map[types.NamespacedName][]End{svcA: {nat}},
		failing: map[types.NamespacedName]string{svcA: "not a tunnel"},
	}, {
		name:    "rp_filter refuses every Service, nothing is programmed",
		kernel:  func(k *fakeKernel) { k.sysctls[sysctlAllRPFilter] = "1" },
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080)}, svcB: {ipip("192.168.56.211", 80, pod2, 8080)}},
		failing: map[types.NamespacedName]string{svcA: "net.ipv4.conf.all.rp_filter is 1", svcB: "the agent does not lower it"},
		retry:   true,
	}, {
		name:    "no tunl0",
		kernel:  func(k *fakeKernel) { delete(k.links, Device) },
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080)}},
		failing: map[types.NamespacedName]string{svcA: "load the ipip module"},
		retry:   true,
	}, {
		name:    "over the node's limit: the whole Service",
		cfg:     Config{MaxEnds: 2},
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080)}, svcB: {ipip("192.168.56.211", 80, pod1, 8080), ipip("192.168.56.211", 81, pod1, 8081)}},
		failing: map[types.NamespacedName]string{svcB: "over the node's limit of 2 tunnel ends (1 taken, the Service wants 2)"},
		rules:   1,
	}, {
		name:    "marks run out: 2 bits number one endpoint",
		cfg:     Config{MarkMask: 0x30000},
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080)}, svcB: {ipip("192.168.56.211", 80, pod2, 8080)}},
		failing: map[types.NamespacedName]string{svcB: "no free mark for another endpoint"},
		rules:   1,
	}, {
		name:    "the same VIP, port and endpoint with another target port",
		ends:    map[types.NamespacedName][]End{svcA: {ipip("192.168.56.210", 80, pod1, 8080)}, svcB: {ipip("192.168.56.210", 80, pod1, 9090)}},
		failing: map[types.NamespacedName]string{svcB: "ns/a ends the same VIP, port and endpoint otherwise"},
		rules:   1,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			te, k, _ := newTest(t, tc.cfg)
			if tc.kernel != nil {
				tc.kernel(k)
			}
			for svc, ends := range tc.ends {
				te.SetEnds(svc, ends, []netip.Addr{pod1, pod2})
			}
			if err := te.Sync(false); err != nil {
				t.Fatal(err)
			}
			got := te.ServiceFailures()
			if len(got) != len(tc.failing) {
				t.Errorf("failures %q, want %d", got, len(tc.failing))
			}
			for svc, want := range tc.failing {
				if !strings.Contains(got[svc], want) {
					t.Errorf("%s: failure %q, want it to say %q", svc, got[svc], want)
				}
			}
			if te.Retry() != tc.retry {
				t.Errorf("Retry %v, want %v", te.Retry(), tc.retry)
			}
			n := 0
			if nat := k.tables["nat"]; nat != nil {
				n = len(nat.Rules[chainDNAT])
			}
			if n != tc.rules {
				t.Errorf("%d DNAT rules, want %d:\n%s", n, tc.rules, strings.Join(k.dump(), "\n"))
			}
		})
	}
}

func TestKernelErrors(t *testing.T) {
	for _, call := range []string{"Save", "Restore", "AddRule", "AddRoute", "AddFou", "SetUp", "Ensure", "Rules", "FouPorts"} {
		t.Run(call, func(t *testing.T) {
			te, k, _ := newTest(t, Config{})
			setBoth(te)
			injected := errors.New("injected " + call)
			k.fail[call] = injected
			err := te.Sync(true)
			if !errors.Is(err, injected) {
				t.Fatalf("Sync: %v, want the injected error", err)
			}
			// The next sync, partial, reads the kernel and completes it.
			delete(k.fail, call)
			if err := te.Sync(false); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(sortedCopy(programmed), sortedCopy(k.dump())); diff != "" {
				t.Errorf("after the retry (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCleanupRemovesOnlyWhatItOwns(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	other := Rule{Priority: 4300, Mark: 1, Mask: 1, Table: 99}
	k.rules = append(k.rules, other)
	k.fou = append(k.fou, 7000)
	if err := Cleanup(t.Context(), Config{}, k.kernel(), []uint16{6080}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	want := append([]string{"rule " + other.String(), "fou gue 7000"}, cleaned...)
	if diff := cmp.Diff(want, k.dump()); diff != "" {
		t.Errorf("after cleanup (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{MarkMask: 0x0f0f0000}, "contiguous"},
		{Config{MarkMask: 0x10000}, "at least 2"},
		{Config{MarkMask: 0xff00}, "overlaps Kubernetes'"},
		{Config{Table: 254}, "main"},
		{Config{RulePriority: 32766}, "rule priority"},
		{Config{MTU: 100}, "MTU"},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// A new agent (a restart) keeps the endpoints' numbers the kernel's mark
// rules carry, whatever order its ends come in.
func TestRestartKeepsTheMarks(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	setBoth(te)
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080), ipip("192.168.56.210", 80, netip.MustParseAddr("10.244.1.1"), 8080)},
		[]netip.Addr{pod1, netip.MustParseAddr("10.244.1.1")})
	if err := te.Sync(false); err != nil {
		t.Fatal(err)
	}
	before := k.dump()
	again, err := New(Config{}, k.kernel(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	setBoth(again)
	again.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080), ipip("192.168.56.210", 80, netip.MustParseAddr("10.244.1.1"), 8080)},
		[]netip.Addr{pod1, netip.MustParseAddr("10.244.1.1")})
	k.calls = nil
	if err := again.Sync(true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, k.dump()); diff != "" {
		t.Errorf("after the restart (-want +got):\n%s", diff)
	}
	if len(k.calls) != 0 {
		t.Errorf("the restarted agent wrote %q", k.calls)
	}
}

// TestIPIPWithoutFou: a node whose ends are all IPIP needs no fou module:
// neither a full sync nor a cleanup lists GUE ports (the list fails
// without the module).
func TestIPIPWithoutFou(t *testing.T) {
	te, k, _ := newTest(t, Config{})
	k.fail["FouPorts"] = errors.New("genl family fou not found")
	te.SetEnds(svcA, []End{ipip("192.168.56.210", 80, pod1, 8080)}, []netip.Addr{pod1})
	if err := te.Sync(true); err != nil {
		t.Fatalf("full sync of IPIP ends without fou: %v", err)
	}
	if err := Cleanup(context.Background(), Config{}, k.kernel(), nil, zap.NewNop()); err != nil {
		t.Fatalf("cleanup without GUE ports and without fou: %v", err)
	}
}
