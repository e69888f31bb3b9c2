package cleanup

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/nodelock"
)

// TestCleanupVirtualServers: cleanup deletes the virtual servers the
// reconciler's ownership rule gives ipvs-proxy, and no other.
func TestCleanupVirtualServers(t *testing.T) {
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(netip.MustParseAddr("10.0.2.15"))
	if err := links.EnsureDummy("ipvs-proxy0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.10", "10.96.7.7"} {
		if err := links.AddAddress("ipvs-proxy0", netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	key := func(ap string) ktypes.VSKey {
		x := netip.MustParseAddrPort(ap)
		return ktypes.VSKey{Address: x.Addr(), Protocol: ktypes.TCP, Port: x.Port()}
	}
	for _, ap := range []string{
		"10.96.0.10:80",    // on the interface: ours
		"10.96.7.7:53",     // on the interface, excluded: not ours
		"10.0.2.15:30080",  // node address, node-port range: ours
		"10.0.2.15:8080",   // node address, other port: not ours
		"192.0.2.50:30080", // nobody's address: not ours
	} {
		if err := ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: key(ap), Scheduler: "rr"}); err != nil {
			t.Fatal(err)
		}
	}
	own := model.Ownership{Interface: "ipvs-proxy0", NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.7.0/24")}}
	n, err := cleanupVirtualServers(ipvs, links, own)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2", n, err)
	}
	var left []string
	for _, l := range ipvs.Dump() {
		left = append(left, strings.Fields(l)[0])
	}
	slices.Sort(left)
	if diff := cmp.Diff([]string{"10.0.2.15:8080/TCP", "10.96.7.7:53/TCP", "192.0.2.50:30080/TCP"}, left); diff != "" {
		t.Errorf("virtual servers left (-want +got):\n%s", diff)
	}
	if n, err := cleanupVirtualServers(ipvs, links, own); err != nil || n != 0 {
		t.Errorf("second run deleted %d, %v; want 0", n, err)
	}
}

// TestCleanupInterfaces: cleanup removes a link only when it is
// ipvs-proxy's (a dummy carrying its mark), or kube-proxy's kube-ipvs0
// with --kube-proxy; any other link of the name given is left alone with
// its virtual servers, and cleanup fails naming it.
func TestCleanupInterfaces(t *testing.T) {
	const vip, nodePort = "10.96.0.10:80", "10.0.2.15:30080"
	marked := netlinkutil.LinkInfo{Type: "dummy", Alias: netlinkutil.OwnerAlias}
	for _, tc := range []struct {
		name      string
		iface     string
		link      *netlinkutil.LinkInfo // nil: no link of that name
		kubeProxy bool
		wantLinks []string // links left
		wantVS    []string // virtual servers left
		wantSaid  []string
		wantErr   string
	}{
		{name: "ipvs-proxy's dummy", iface: "ipvs-proxy0", link: &marked, wantVS: []string{},
			wantLinks: []string{}, wantSaid: []string{"ipvs: deleted 2 virtual servers owned by ipvs-proxy0", "interface ipvs-proxy0: deleted with 1 addresses"}},
		{name: "a dummy ipvs-proxy did not make", iface: "ipvs-proxy0", link: &netlinkutil.LinkInfo{Type: "dummy"},
			wantLinks: []string{"ipvs-proxy0"}, wantVS: []string{vip, nodePort},
			wantSaid: []string{`interface ipvs-proxy0: left alone with its virtual servers: a dummy without ipvs-proxy's mark (alias "ipvs-proxy"): run never used it; remove it by hand (ip link del ipvs-proxy0) if it is ipvs-proxy's`},
			wantErr:  "interface ipvs-proxy0 is not ipvs-proxy's"},
		{name: "another type of link", iface: "eth1", link: &netlinkutil.LinkInfo{Type: "veth"},
			wantLinks: []string{"eth1"}, wantVS: []string{vip, nodePort},
			wantSaid: []string{"interface eth1: left alone with its virtual servers: a veth link, not ipvs-proxy's dummy"},
			wantErr:  "interface eth1 is not ipvs-proxy's"},
		{name: "kube-proxy's interface as --interface", iface: "kube-ipvs0", link: &netlinkutil.LinkInfo{Type: "dummy"},
			wantLinks: []string{"kube-ipvs0"}, wantVS: []string{vip, nodePort},
			wantSaid: []string{"interface kube-ipvs0: left alone with its virtual servers: it is kube-proxy's: removed only with --kube-proxy"},
			wantErr:  "interface kube-ipvs0 is not ipvs-proxy's"},
		{name: "kube-proxy's interface with --kube-proxy", iface: "kube-ipvs0", link: &netlinkutil.LinkInfo{Type: "dummy"}, kubeProxy: true,
			wantLinks: []string{}, wantVS: []string{},
			wantSaid: []string{"ipvs: deleted 2 virtual servers owned by kube-ipvs0", "interface kube-ipvs0: deleted with 1 addresses"}},
		{name: "no link: its node ports only", iface: "ipvs-proxy0",
			wantLinks: []string{}, wantVS: []string{vip},
			wantSaid: []string{"ipvs: deleted 1 virtual server owned by ipvs-proxy0", "interface ipvs-proxy0: not present"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ipvs := fake.NewIPVS()
			links := fake.NewLinks(netip.MustParseAddr("10.0.2.15"))
			if tc.link != nil {
				links.AddLink(tc.iface, *tc.link)
				if err := links.AddAddress(tc.iface, netip.MustParseAddr("10.96.0.10")); err != nil {
					t.Fatal(err)
				}
			}
			for _, ap := range []string{vip, nodePort} {
				x := netip.MustParseAddrPort(ap)
				if err := ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: x.Addr(), Protocol: ktypes.TCP, Port: x.Port()}, Scheduler: "rr"}); err != nil {
					t.Fatal(err)
				}
			}
			own := func(iface string) model.Ownership {
				return model.Ownership{Interface: iface, NodePortRange: model.PortRange{Min: 30000, Max: 32767}}
			}
			said := []string{}
			errs := cleanupInterfaces(ipvs, links, []string{tc.iface}, own, tc.kubeProxy, func(f string, args ...any) { said = append(said, fmt.Sprintf(f, args...)) })

			gotErr := fmt.Sprint(errors.Join(errs...))
			if tc.wantErr == "" && len(errs) > 0 || tc.wantErr != "" && !strings.Contains(gotErr, tc.wantErr) {
				t.Errorf("errors %v, want %q", errs, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantSaid, said); diff != "" {
				t.Errorf("said (-want +got):\n%s", diff)
			}
			left := []string{}
			for _, l := range ipvs.Dump() {
				left = append(left, strings.TrimSuffix(strings.Fields(l)[0], "/TCP"))
			}
			slices.Sort(left)
			slices.Sort(tc.wantVS)
			if diff := cmp.Diff(tc.wantVS, left); diff != "" {
				t.Errorf("virtual servers left (-want +got):\n%s", diff)
			}
			linksLeft := []string{}
			if _, ok, _ := links.LinkInfo(tc.iface); ok {
				linksLeft = append(linksLeft, tc.iface)
			}
			if diff := cmp.Diff(tc.wantLinks, linksLeft); diff != "" {
				t.Errorf("links left (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRunRefusesWhileAgentRuns: while an agent holds the node's lock,
// cleanup removes nothing and says why.
func TestRunRefusesWhileAgentRuns(t *testing.T) {
	name := fmt.Sprintf("ipvs-proxy-test-%d-%s", os.Getpid(), t.Name())
	agent, err := nodelock.Acquire(name, "ipvs-proxy run (test)")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = agent.Release() }()
	var out strings.Builder
	err = Run(context.Background(), &Options{Interface: "ipvs-proxy0", NodePortRange: "30000-32767", LockName: name}, &out)
	var held *nodelock.HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() || !strings.Contains(err.Error(), "(the holder: ipvs-proxy run (test)); stop the agent first") {
		t.Errorf("cleanup while the agent runs: %v; want a refusal naming the agent's process %d", err, os.Getpid())
	}
	if out.Len() > 0 {
		t.Errorf("cleanup refused but said:\n%s", out.String())
	}
}
