package glue

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestTunnelledVirtualServersRedirectInCluster: a tunnelled LoadBalancer
// virtual server is in IPVSP-DSR, not in IPVSP-EXTERNAL (its external
// traffic keeps the client's address), and gets one DNAT rule to its
// clusterIP, written by the partial sync that follows the plan change and
// removed by the one after the Service goes back to NAT. A Service without
// a tunnel never runs iptables on a partial sync.
func TestTunnelledVirtualServersRedirectInCluster(t *testing.T) {
	b := newBed(t, dualStack)
	plain := service(1)
	b.g.SetPlan(plain.Service, plain)
	b.sync(t, true)
	before := len(b.ipt.restores())

	lb := vs(model.KindLoadBalancer, "198.51.100.10", tcp, 80, "10.100.1.2:8080", "10.100.2.2:8080")
	lb.Forward, lb.InClusterTo = ktypes.ForwardTunnel, netip.MustParseAddrPort("10.96.0.10:80")
	p := &model.ServicePlan{Service: name("web"), VirtualServers: []model.VSPlan{
		vs(model.KindClusterIP, "10.96.0.10", tcp, 80, "10.100.1.2:8080", "10.100.2.2:8080"), lb,
	}}
	b.g.SetPlan(p.Service, p)
	if st := b.sync(t, false); st.Restores != 1 {
		t.Errorf("partial sync after a tunnelled virtual server came: %d restores, want 1", st.Restores)
	}
	if got, want := b.sets.Entries("IPVSP-DSR"), []string{"198.51.100.10,tcp:80"}; !slices.Equal(got, want) {
		t.Errorf("IPVSP-DSR = %v, want %v", got, want)
	}
	if got := b.sets.Entries("IPVSP-EXTERNAL"); slices.Contains(got, "198.51.100.10,tcp:80") {
		t.Errorf("IPVSP-EXTERNAL = %v: a tunnelled virtual server's external traffic would be masqueraded", got)
	}
	redirect := "-A IPVSP-DSR-REDIRECT -d 198.51.100.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.10:80"
	if dump := b.ipt.dump("nft4"); !strings.Contains(dump, redirect+"\n") {
		t.Errorf("no redirect %q in:\n%s", redirect, dump)
	}
	if dump := b.ipt.dump("nft6"); strings.Contains(dump, "DNAT") {
		t.Errorf("IPv6 rules hold an IPv4 redirect:\n%s", dump)
	}

	// Unchanged plans, another partial sync: no iptables run.
	other := service(2)
	b.g.SetPlan(other.Service, other)
	if st := b.sync(t, false); st.Restores != 0 {
		t.Errorf("partial sync of a Service without a tunnel: %d restores, want 0", st.Restores)
	}

	// Back to NAT: the redirect goes, the VIP is masqueraded again.
	lb.Forward, lb.InClusterTo = ktypes.ForwardNAT, netip.AddrPort{}
	b.g.SetPlan(p.Service, &model.ServicePlan{Service: p.Service, VirtualServers: []model.VSPlan{p.VirtualServers[0], lb}})
	if st := b.sync(t, false); st.Restores != 1 {
		t.Errorf("partial sync after the tunnel went: %d restores, want 1", st.Restores)
	}
	if dump := b.ipt.dump("nft4"); strings.Contains(dump, "DNAT") {
		t.Errorf("a redirect stayed after the tunnel went:\n%s", dump)
	}
	if got := b.sets.Entries("IPVSP-DSR"); len(got) != 0 {
		t.Errorf("IPVSP-DSR = %v after the tunnel went", got)
	}
	if got := b.sets.Entries("IPVSP-EXTERNAL"); !slices.Contains(got, "198.51.100.10,tcp:80") {
		t.Errorf("IPVSP-EXTERNAL = %v: the NAT virtual server is not masqueraded", got)
	}
	if got := len(b.ipt.restores()) - before; got != 2 {
		t.Errorf("%d iptables-restore runs over the test, want 2", got)
	}
}

// TestRedirectWriteFailureRetried: a failed write of the rules leaves them
// due, and the next partial sync writes them.
func TestRedirectWriteFailureRetried(t *testing.T) {
	b := newBed(t, dualStack)
	b.sync(t, true)
	lb := vs(model.KindLoadBalancer, "198.51.100.10", tcp, 80, "10.100.1.2:8080")
	lb.Forward, lb.InClusterTo = ktypes.ForwardTunnel, netip.MustParseAddrPort("10.96.0.10:80")
	p := &model.ServicePlan{Service: name("web"), VirtualServers: []model.VSPlan{lb}}
	b.g.SetPlan(p.Service, p)
	b.ipt.fail = func(tool string) error {
		if strings.HasSuffix(tool, "-restore") {
			return errors.New("injected failure")
		}
		return nil
	}
	if _, err := b.g.SyncStats(false); err == nil {
		t.Fatal("partial sync with iptables-restore failing: no error")
	}
	b.ipt.fail = nil
	if st := b.sync(t, false); st.Restores != 1 {
		t.Errorf("partial sync after the failure: %d restores, want 1", st.Restores)
	}
	if dump := b.ipt.dump("nft4"); !strings.Contains(dump, "--to-destination 10.96.0.10:80") {
		t.Errorf("the redirect was not written after the failure:\n%s", dump)
	}
}
