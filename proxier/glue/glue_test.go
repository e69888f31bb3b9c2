package glue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// nodeLinks is the fake Links with node addresses a test can change.
type nodeLinks struct {
	*fake.Links
	mu    sync.Mutex
	addrs []netip.Addr
}

func (l *nodeLinks) NodeAddresses(...string) ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.addrs), nil
}

func (l *nodeLinks) set(a ...netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs = a
}

type bed struct {
	g     *Glue
	sets  *ipsetfake.Sets
	ipt   *fakeIPTables
	links *nodeLinks
	logs  *observer.ObservedLogs
}

func newBed(t testing.TB, cfg Config) *bed {
	t.Helper()
	b := &bed{sets: ipsetfake.New(), ipt: newFakeIPTables(NFT), links: &nodeLinks{Links: fake.NewLinks(), addrs: []netip.Addr{addr("10.0.2.15")}}}
	core, logs := observer.New(zap.DebugLevel)
	b.logs = logs
	ipt := map[ipset.Family]*IPTables{}
	for _, fam := range []ipset.Family{ipset.IPv4, ipset.IPv6} {
		x, err := NewIPTables(b.ipt, NFT, fam)
		if err != nil {
			t.Fatal(err)
		}
		ipt[fam] = x
	}
	b.g = New(cfg, b.sets, ipt, b.links, zap.New(core))
	return b
}

var dualStack = Config{Interface: "ipvs-proxy0", ClusterCIDRs: []netip.Prefix{pfx("10.100.0.0/14"), pfx("fd00:100::/24")}, IPv4: true, IPv6: true}

func (b *bed) sync(t testing.TB, full bool) Stats {
	t.Helper()
	st, err := b.g.SyncStats(full)
	if err != nil {
		t.Fatalf("sync (full=%v): %v", full, err)
	}
	return st
}

func name(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }

// service is a plan with a clusterIP, a node port and a real server.
func service(i int) *model.ServicePlan {
	ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
	rs := fmt.Sprintf("10.100.%d.%d:8080", i/250, i%250+2)
	return &model.ServicePlan{Service: name(fmt.Sprint("s", i)), VirtualServers: []model.VSPlan{
		vs(model.KindClusterIP, ip, tcp, 80, rs),
		vs(model.KindNodePort, "10.0.2.15", tcp, uint16(30000+i%2768), rs),
	}, NodeEndpoints: []netip.Addr{netip.MustParseAddrPort(rs).Addr()}} // its endpoint is on this node
}

// TestRuleDumpConstant: the rules applied for 10 and for 10,000 Services
// are byte-identical (every per-Service datum is in the sets), and they
// are the rule dump of each family.
func TestRuleDumpConstant(t *testing.T) {
	inputs := map[int][]string{}
	for _, n := range []int{10, 10000} {
		b := newBed(t, dualStack)
		for i := range n {
			p := service(i)
			b.g.SetPlan(p.Service, p)
		}
		start := time.Now()
		st := b.sync(t, true)
		t.Logf("%d Services: first sync %v, %d entries added, %d restores", n, time.Since(start).Round(time.Millisecond), st.Added, st.Restores)
		inputs[n] = b.ipt.restores()
		if got := len(b.sets.Entries("IPVSP-CLUSTER-IP")); got != n {
			t.Errorf("%d Services: IPVSP-CLUSTER-IP has %d entries", n, got)
		}
	}
	if diff := cmp.Diff(inputs[10], inputs[10000]); diff != "" {
		t.Errorf("rules for 10 and 10,000 Services differ (-10 +10000):\n%s", diff)
	}
	want := []string{Dump(Rules(RuleConfig{Family: ipset.IPv4, ClusterCIDR: true})), Dump(Rules(RuleConfig{Family: ipset.IPv6, ClusterCIDR: true}))}
	if diff := cmp.Diff(want, inputs[10]); diff != "" {
		t.Errorf("restore inputs (-dumps +got):\n%s", diff)
	}
}

// TestSyncByDifference: after the first sync, a changed Service writes only
// its difference to the sets; a Service going away removes its entries but
// not those another Service still needs; nothing runs iptables.
func TestSyncByDifference(t *testing.T) {
	b := newBed(t, dualStack)
	local := []netip.Addr{addr("10.100.1.2"), addr("10.100.2.2")} // both on this node: hairpin
	a := &model.ServicePlan{Service: name("a"), VirtualServers: []model.VSPlan{
		vs(model.KindClusterIP, "10.96.0.10", tcp, 80, "10.100.1.2:8080"),
		vs(model.KindExternalIP, "10.251.0.10", tcp, 80, "10.100.1.2:8080"),
	}, NodeEndpoints: local}
	c := &model.ServicePlan{Service: name("c"), VirtualServers: []model.VSPlan{
		vs(model.KindExternalIP, "10.251.0.10", tcp, 443, "10.100.1.2:8443"),
	}}
	b.g.SetPlan(a.Service, a)
	b.g.SetPlan(c.Service, c)
	b.sync(t, false) // the first sync is full whatever asked
	restores := len(b.ipt.restores())
	b.sets.ResetCalls()

	// a gets a second real server.
	a2 := *a
	a2.VirtualServers = []model.VSPlan{
		vs(model.KindClusterIP, "10.96.0.10", tcp, 80, "10.100.1.2:8080", "10.100.2.2:8080"),
		vs(model.KindExternalIP, "10.251.0.10", tcp, 80, "10.100.1.2:8080", "10.100.2.2:8080"),
	}
	b.g.SetPlan(a.Service, &a2)
	b.sync(t, false)
	if diff := cmp.Diff([]ipsetfake.Call{"Add IPVSP-HAIRPIN 10.100.2.2,tcp:8080,10.100.2.2"}, b.sets.Calls()); diff != "" {
		t.Errorf("calls for a new real server (-want +got):\n%s", diff)
	}

	// a goes: its entries go, the VIP it shares with c stays.
	b.sets.ResetCalls()
	b.g.SetPlan(a.Service, nil)
	b.sync(t, false)
	want := []ipsetfake.Call{
		"Del IPVSP-CLUSTER-IP 10.96.0.10,tcp:80",
		"Del IPVSP-EXTERNAL 10.251.0.10,tcp:80",
		"Del IPVSP-VIP 10.96.0.10",
		"Del IPVSP-SERVICE 10.96.0.10,tcp:80 10.251.0.10,tcp:80",
		"Del IPVSP-HAIRPIN 10.100.1.2,tcp:8080,10.100.1.2 10.100.2.2,tcp:8080,10.100.2.2",
	}
	if diff := cmp.Diff(want, b.sets.Calls()); diff != "" {
		t.Errorf("calls for a deleted Service (-want +got):\n%s", diff)
	}
	if got := b.sets.Entries("IPVSP-VIP"); !slices.Equal(got, []string{"10.251.0.10"}) {
		t.Errorf("IPVSP-VIP = %v; the shared VIP must stay", got)
	}
	if n := len(b.ipt.restores()); n != restores {
		t.Errorf("partial syncs ran iptables-restore %d times", n-restores)
	}

	// A full sync with nothing changed reads and writes nothing but the
	// sets' dumps and the rules' saves.
	b.sets.ResetCalls()
	st := b.sync(t, true)
	if w := b.sets.Writes(); len(w) != 0 || st.Restores != 0 {
		t.Errorf("an idle full sync wrote %v and restored %d times", w, st.Restores)
	}
}

// TestFullSyncRepairsDrift: entries removed or added behind the glue's back
// and a rule deleted are repaired by the next full sync, and only those.
func TestFullSyncRepairsDrift(t *testing.T) {
	b := newBed(t, dualStack)
	p := service(1)
	b.g.SetPlan(p.Service, p)
	b.sync(t, true)
	before := b.sets.Dump()

	_ = b.sets.Del("IPVSP-CLUSTER-IP", ipset.Entry{Addr: addr("10.96.0.2"), Proto: tcp, Port: 80})
	_ = b.sets.Add("IPVSP-VIP", ipset.Entry{Addr: addr("10.96.9.9")})
	b.ipt.mu.Lock()
	b.ipt.tables("nft4")["nat"].rules["IPVSP-POSTROUTING"] = nil
	b.ipt.mu.Unlock()
	b.sets.ResetCalls()

	// A partial sync trusts its view: no repair yet.
	b.sync(t, false)
	if w := b.sets.Writes(); len(w) != 0 {
		t.Errorf("a partial sync wrote %v", w)
	}
	st := b.sync(t, true)
	want := []ipsetfake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.2,tcp:80", "Del IPVSP-VIP 10.96.9.9"}
	if diff := cmp.Diff(want, b.sets.Writes()); diff != "" {
		t.Errorf("repair writes (-want +got):\n%s", diff)
	}
	if st.Restores != 1 {
		t.Errorf("%d restores; want 1 (IPv4's nat table)", st.Restores)
	}
	if diff := cmp.Diff(before, b.sets.Dump()); diff != "" {
		t.Errorf("sets after the repair (-before +after):\n%s", diff)
	}
	if in := RestoreInput(Rules(RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}), ParseSave(b.ipt.dump("nft4")), Owned); in != "" {
		t.Errorf("rules still differ:\n%s", in)
	}
}

// TestFailedWriteIsRetried: a failed set write fails the sync, names the
// Service in the log, and the next sync writes it: a partial one already
// (the failure made the set unknown, so it is read again), and a full one
// finds nothing left to do.
func TestFailedWriteIsRetried(t *testing.T) {
	b := newBed(t, dualStack)
	b.sync(t, true)
	b.sets.InjectErrors(func(c ipsetfake.Call) error {
		if strings.HasPrefix(string(c), "Add IPVSP-CLUSTER-IP") {
			return errors.New("injected")
		}
		return nil
	})
	p := service(1)
	b.g.SetPlan(p.Service, p)
	_, err := b.g.SyncStats(false)
	if err == nil || !strings.Contains(err.Error(), "IPVSP-CLUSTER-IP") {
		t.Fatalf("sync error %v; want one naming the set", err)
	}
	logged := b.logs.FilterMessage("ipset update failed").All()
	if len(logged) != 1 || !slices.Contains(logged[0].ContextMap()["services"].([]any), any("ns/s1")) {
		t.Errorf("log of the failure %v; want it to name ns/s1", logged)
	}
	// The other sets got their entries.
	if got := b.sets.Entries("IPVSP-SERVICE"); len(got) != 2 {
		t.Errorf("IPVSP-SERVICE = %v", got)
	}
	b.sets.InjectErrors(nil)
	b.sets.ResetCalls()
	b.sync(t, false)
	if got := b.sets.Entries("IPVSP-CLUSTER-IP"); !slices.Equal(got, []string{"10.96.0.2,tcp:80"}) {
		t.Errorf("IPVSP-CLUSTER-IP after the retry = %v", got)
	}
	want := []ipsetfake.Call{"List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.2,tcp:80"}
	if diff := cmp.Diff(want, b.sets.Calls()); diff != "" {
		t.Errorf("the partial retry (-want +got):\n%s", diff)
	}
	b.sets.ResetCalls()
	b.sync(t, true)
	if w := b.sets.Writes(); len(w) != 0 {
		t.Errorf("the full sync after the retry wrote %v", w)
	}
}

// TestRestartRebuildResumes: the agent restarts after its 300 Services
// were replaced by 300 others, so every set is rebuilt, while half of all
// set writes fail (a fixed seed). The proxier retries a failed consumer
// with a full sync, which forgets the glue's view of the sets: each
// rebuild still resumes from its temporary set (each entry written about
// once), converges, and leaves no temporary set. It never converged when a
// retry started every rebuild afresh, nor when start-up's removal of stale
// sets destroyed a rebuild under way.
func TestRestartRebuildResumes(t *testing.T) {
	b := newBed(t, dualStack)
	for i := range 300 {
		p := service(i)
		b.g.SetPlan(p.Service, p)
	}
	b.sync(t, true)
	rnd := rand.New(rand.NewPCG(1, 2))
	faulty := ipsetfake.Wrap(b.sets, func(ipsetfake.Call) error {
		if rnd.IntN(2) == 0 {
			return errors.New("injected")
		}
		return nil
	})
	restarted := New(dualStack, faulty, b.g.ipt, b.links, b.g.log)
	for i := 1000; i < 1300; i++ {
		p := service(i)
		restarted.SetPlan(p.Service, p)
	}
	b.sets.ResetCalls()
	attempts := 0
	for ; attempts < 40; attempts++ {
		if _, err := restarted.SyncStats(true); err == nil {
			break
		}
	}
	if attempts == 40 {
		t.Fatalf("not converged after 40 full syncs")
	}
	added := 0
	for _, c := range b.sets.Writes() {
		if f := strings.Fields(string(c)); len(f) > 2 && f[0] == "Add" && strings.HasSuffix(f[1], "-N") {
			added += len(f) - 2
		}
	}
	t.Logf("converged after %d failed full syncs; %d entries written to temporary sets", attempts, added)
	// Six sets of 300 entries are rebuilt (clusterIPs, node ports, their
	// Services, VIPs, hairpin...): about 1,800 entries if each is written once.
	if added > 2*1800 {
		t.Errorf("%d entries written to temporary sets: the rebuilds started again instead of resuming", added)
	}
	for _, n := range b.sets.Names() {
		if strings.HasSuffix(n, "-N") {
			t.Errorf("temporary set %s left", n)
		}
	}
	// The new Services' clusterIPs are 10.96.4.1-10.96.5.50, the old ones'
	// 10.96.0.1-10.96.1.50.
	got := b.sets.Entries("IPVSP-CLUSTER-IP")
	if len(got) != 300 || !strings.HasPrefix(got[0], "10.96.4.") || !strings.HasPrefix(got[len(got)-1], "10.96.5.") {
		t.Errorf("IPVSP-CLUSTER-IP holds %d entries (%v ...); want the 300 new clusterIPs", len(got), got[:min(2, len(got))])
	}
}

// TestStartupRemovesStale: at start-up, the rules and sets of a family no
// longer served and sets of an older version are removed; other tools'
// sets and chains stay.
func TestStartupRemovesStale(t *testing.T) {
	b := newBed(t, Config{Interface: "ipvs-proxy0", IPv4: true})
	b.sets.Put(ipset.Spec{Name: "IPVSP-6-VIP", Type: ipset.HashIP, Family: ipset.IPv6})
	b.sets.Put(ipset.Spec{Name: "IPVSP-OLD", Type: ipset.HashIP, Family: ipset.IPv4}, ipset.Entry{Addr: addr("10.0.0.1")})
	b.sets.Put(ipset.Spec{Name: "FOREIGN", Type: ipset.HashIP, Family: ipset.IPv4}, ipset.Entry{Addr: addr("10.0.0.1")})
	b.ipt.put("nft6", "filter", "IPVSP-INPUT", "-m set --match-set IPVSP-6-VIP dst -j DROP")
	b.ipt.put("nft6", "filter", "INPUT", `-m comment --comment "ipvs-proxy: x" -j IPVSP-INPUT`)
	b.ipt.put("nft6", "filter", "FOREIGN", "-j ACCEPT")
	b.sync(t, true)

	for _, n := range b.sets.Names() {
		if strings.HasPrefix(n, "IPVSP-6-") || n == "IPVSP-OLD" {
			t.Errorf("stale set %s left", n)
		}
	}
	if got := b.sets.Entries("FOREIGN"); len(got) != 1 {
		t.Errorf("the foreign set lost its entry: %v", got)
	}
	v6 := b.ipt.dump("nft6")
	if strings.Contains(v6, "IPVSP-") || !strings.Contains(v6, ":FOREIGN") {
		t.Errorf("ip6tables after start-up:\n%s", v6)
	}
	// Later full syncs leave ip6tables alone.
	calls := len(b.ipt.calls)
	b.sync(t, true)
	for _, c := range b.ipt.calls[calls:] {
		if strings.HasPrefix(c, "ip6tables") {
			t.Errorf("a later sync ran %s", c)
		}
	}
}

// TestNodeAddressesDecideNodeAccess: the node may reach a firewalled
// LoadBalancer IP when a source range holds one of its node-port
// addresses; a change of address is picked up by the next full sync.
func TestNodeAddressesDecideNodeAccess(t *testing.T) {
	cfg := dualStack
	cfg.NodePortAddresses = []netip.Prefix{pfx("192.168.0.0/16")}
	b := newBed(t, cfg)
	b.links.set(addr("10.0.2.15"), addr("192.168.1.5"))
	lb := vs(model.KindLoadBalancer, "10.251.0.11", tcp, 80)
	lb.SourceRanges = []netip.Prefix{pfx("10.0.2.0/24")}
	p := &model.ServicePlan{Service: name("lb"), VirtualServers: []model.VSPlan{lb}}
	b.g.SetPlan(p.Service, p)
	b.sync(t, true)
	if got := b.sets.Entries("IPVSP-LB-SRC-IP"); len(got) != 0 {
		t.Errorf("10.0.2.15 is no node-port address, yet the node is allowed: %v", got)
	}
	b.links.set(addr("10.0.2.15"), addr("192.168.1.5"), addr("192.168.10.1"))
	lb.SourceRanges = []netip.Prefix{pfx("192.168.10.0/24")}
	b.g.SetPlan(p.Service, &model.ServicePlan{Service: name("lb"), VirtualServers: []model.VSPlan{lb}})
	b.sync(t, false)
	if got := b.sets.Entries("IPVSP-LB-SRC-IP"); len(got) != 0 {
		t.Errorf("a partial sync saw the new address: %v", got)
	}
	b.sync(t, true)
	if got := b.sets.Entries("IPVSP-LB-SRC-IP"); !slices.Equal(got, []string{"10.251.0.11,tcp:80,10.251.0.11"}) {
		t.Errorf("IPVSP-LB-SRC-IP = %v; want the node allowed", got)
	}
}

// TestRestoreFailure: a failing iptables-restore fails the sync; the next
// full sync applies the rules.
func TestRestoreFailure(t *testing.T) {
	b := newBed(t, dualStack)
	b.ipt.fail = func(tool string) error {
		if strings.HasSuffix(tool, "-restore") {
			return errors.New("injected")
		}
		return nil
	}
	if _, err := b.g.SyncStats(true); err == nil {
		t.Fatal("no error from a failed restore")
	}
	b.ipt.fail = nil
	if st := b.sync(t, false); st.Restores != 2 {
		t.Errorf("the sync after a failed first one made %d restores; want 2", st.Restores)
	}
}

// TestNodeTrafficFromVIPMasqueradedWithoutClusterCIDR: with neither a
// cluster CIDR nor masquerade-all, a connection from the node to a
// clusterIP leaves with the VIP as its source (the local route of a VIP on
// the dummy interface names the VIP as source); a real server on another
// node would answer to a VIP its own node owns. Such a connection (source
// one of the VIPs, destination a clusterIP Service) is masqueraded, in both
// families; with a cluster CIDR the rule is not needed (everything from
// outside it is masqueraded).
func TestNodeTrafficFromVIPMasqueradedWithoutClusterCIDR(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"no cluster CIDR", Config{Interface: "ipvs-proxy0", IPv4: true, IPv6: true}, true},
		{"cluster CIDR", dualStack, false},
		{"masquerade all", Config{Interface: "ipvs-proxy0", MasqueradeAll: true, IPv4: true, IPv6: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, tc.cfg)
			p := &model.ServicePlan{Service: name("api"), VirtualServers: []model.VSPlan{
				vs(model.KindClusterIP, "10.96.0.1", tcp, 443, "10.100.9.2:6443"),
				vs(model.KindClusterIP, "fd00:96::1", tcp, 443, "[fd00:109::2]:6443"),
			}}
			b.g.SetPlan(p.Service, p)
			b.sync(t, true)
			for key, prefix := range map[string]string{"nft4": "IPVSP-", "nft6": "IPVSP-6-"} {
				rule := "-A IPVSP-SERVICES -m set --match-set " + prefix + "CLUSTER-IP dst,dst -m set --match-set " + prefix + "VIP src -j IPVSP-MARK-MASQ"
				if got := strings.Contains(b.ipt.dump(key), rule+"\n"); got != tc.want {
					t.Errorf("%s: rule %q present %v, want %v; rules:\n%s", key, rule, got, tc.want, b.ipt.dump(key))
				}
			}
			if got := b.sets.Entries("IPVSP-VIP"); !slices.Equal(got, []string{"10.96.0.1"}) {
				t.Errorf("IPVSP-VIP = %v; want the clusterIP (the source the node picks)", got)
			}
		})
	}
}

// TestLocalWithoutLocalEndpointServesInCluster: the external addresses of
// a Local Service whose endpoints are all on other nodes (the model's
// InClusterOnly) answer in-cluster clients: pods (the cluster CIDR) keep
// their source, the node's own connections are masqueraded, everyone else
// is marked for drop. Once a local endpoint exists they leave the set.
func TestLocalWithoutLocalEndpointServesInCluster(t *testing.T) {
	b := newBed(t, dualStack)
	inCluster := func(v model.VSPlan) model.VSPlan { v.Local, v.InClusterOnly = true, true; return v }
	p := &model.ServicePlan{Service: name("ing"), VirtualServers: []model.VSPlan{
		vs(model.KindClusterIP, "10.96.0.20", tcp, 443, "10.100.7.2:8443"),
		inCluster(vs(model.KindNodePort, "10.0.2.15", tcp, 30443, "10.100.7.2:8443")),
		inCluster(vs(model.KindLoadBalancer, "10.251.0.20", tcp, 443, "10.100.7.2:8443")),
		inCluster(vs(model.KindExternalIP, "fd00:251::20", tcp, 443, "[fd00:107::2]:8443")),
	}}
	b.g.SetPlan(p.Service, p)
	b.sync(t, true)
	if got, want := b.sets.Entries("IPVSP-IN-CLUSTER-ONLY"), []string{"10.0.2.15,tcp:30443", "10.251.0.20,tcp:443"}; !slices.Equal(got, want) {
		t.Errorf("IPVSP-IN-CLUSTER-ONLY = %v, want %v", got, want)
	}
	if got, want := b.sets.Entries("IPVSP-6-IN-CLUSTER-ONLY"), []string{"fd00:251::20,tcp:443"}; !slices.Equal(got, want) {
		t.Errorf("IPVSP-6-IN-CLUSTER-ONLY = %v, want %v", got, want)
	}
	if got := b.sets.Entries("IPVSP-EXTERNAL"); len(got) != 0 {
		t.Errorf("IPVSP-EXTERNAL = %v; a Local Service is never masqueraded as a whole", got)
	}
	for key, prefix := range map[string]string{"nft4": "IPVSP-", "nft6": "IPVSP-6-"} {
		dump := b.ipt.dump(key)
		for _, rule := range []string{
			"-A IPVSP-SERVICES -m set --match-set " + prefix + "IN-CLUSTER-ONLY dst,dst -j IPVSP-IN-CLUSTER",
			"-A IPVSP-IN-CLUSTER -m set --match-set " + prefix + "CLUSTER-CIDR src -j RETURN",
			"-A IPVSP-IN-CLUSTER -m addrtype ! --src-type LOCAL -j MARK --set-xmark 0x8000/0x8000",
			"-A IPVSP-IN-CLUSTER -j MARK --set-xmark 0x4000/0x4000",
		} {
			if !strings.Contains(dump, rule+"\n") {
				t.Errorf("%s: no rule %q in:\n%s", key, rule, dump)
			}
		}
	}

	// A local endpoint: the node port serves it alone, to everyone.
	local := vs(model.KindNodePort, "10.0.2.15", tcp, 30443, "10.100.7.2:8443")
	local.Local = true
	b.g.SetPlan(p.Service, &model.ServicePlan{Service: p.Service, VirtualServers: []model.VSPlan{local}})
	b.sync(t, false)
	for _, set := range []string{"IPVSP-IN-CLUSTER-ONLY", "IPVSP-6-IN-CLUSTER-ONLY"} {
		if got := b.sets.Entries(set); len(got) != 0 {
			t.Errorf("%s = %v after a local endpoint came", set, got)
		}
	}
}

// TestServiceRanges: the routed Service ranges fill IPVSP-SERVICE-RANGE of
// their family and follow a change; a clusterIP in one is in IPVSP-VIP
// like a bound one (protected, its node's own connections masqueraded
// when nothing tells pods' traffic).
func TestServiceRanges(t *testing.T) {
	b := newBed(t, dualStack)
	b.g.SetServiceRanges([]netip.Prefix{pfx("10.96.0.0/16"), pfx("fd00:10:96::/112")})
	routed := vs(model.KindClusterIP, "10.96.0.10", tcp, 80, "10.100.1.2:8080")
	routed.Routed = true
	p := &model.ServicePlan{Service: name("a"), VirtualServers: []model.VSPlan{routed}}
	b.g.SetPlan(p.Service, p)
	b.sync(t, true)
	for set, want := range map[string][]string{
		"IPVSP-SERVICE-RANGE":   {"10.96.0.0/16"},
		"IPVSP-6-SERVICE-RANGE": {"fd00:10:96::/112"},
		"IPVSP-VIP":             {"10.96.0.10"},
	} {
		if got := b.sets.Entries(set); !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", set, got, want)
		}
	}
	b.g.SetServiceRanges([]netip.Prefix{pfx("10.97.0.0/16")})
	b.sync(t, false)
	if got := b.sets.Entries("IPVSP-SERVICE-RANGE"); !slices.Equal(got, []string{"10.97.0.0/16"}) {
		t.Errorf("after the change: IPVSP-SERVICE-RANGE = %v", got)
	}
	if got := b.sets.Entries("IPVSP-6-SERVICE-RANGE"); len(got) != 0 {
		t.Errorf("after the change: IPVSP-6-SERVICE-RANGE = %v, want empty", got)
	}
}

// TestWarnsOnDefaultDropInput: on a host whose filter INPUT drops by
// default, the first sync warns that Service traffic passes only what the
// host's rules accept, unless acceptServiceTraffic accepts it ahead of
// them (then no warning).
func TestWarnsOnDefaultDropInput(t *testing.T) {
	for _, accept := range []bool{false, true} {
		cfg := dualStack
		cfg.AcceptServices = accept
		b := newBed(t, cfg)
		b.ipt.inputPolicy = "DROP"
		b.sync(t, true)
		n := b.logs.FilterMessageSnippet("the host's filter INPUT policy drops").Len()
		if want := map[bool]int{false: 2, true: 0}[accept]; n != want {
			t.Errorf("acceptServiceTraffic %v: %d warnings, want %d (one per family)", accept, n, want)
		}
	}
}
