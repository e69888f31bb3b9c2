package glue

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestServiceOverSetLimit: a Service whose entries are over the limit gets
// none (SERVICE does not accept it: the VIP protection refuses its ports)
// and is reported; the sync succeeds, and other Services are written.
func TestServiceOverSetLimit(t *testing.T) {
	cfg := dualStack
	cfg.SetEntriesPerService = 6
	b := newBed(t, cfg)
	small := service(1) // 5 entries
	big := service(2)
	for port := range uint16(3) {
		big.VirtualServers = append(big.VirtualServers, vs(model.KindClusterIP, "10.96.0.3", tcp, 81+port, "10.100.0.4:8080"))
	}
	b.g.SetPlan(small.Service, small)
	b.g.SetPlan(big.Service, big)
	b.sync(t, true)
	if got := b.sets.Entries("IPVSP-SERVICE"); !slices.Equal(got, []string{"10.0.2.15,tcp:30001", "10.96.0.2,tcp:80"}) {
		t.Errorf("IPVSP-SERVICE = %v, want only ns/s1's two virtual servers", got)
	}
	fails := b.g.ServiceFailures()
	if len(fails) != 1 || !strings.Contains(fails[name("s2")], "more than the limit of 6") {
		t.Errorf("ServiceFailures = %v, want ns/s2 over the limit", fails)
	}
	if b.g.Retry() {
		t.Error("Retry() = true for a Service over its limit: it stands until the Service changes")
	}
	// Back under the limit: written, no longer reported.
	b.g.SetPlan(big.Service, service(2))
	b.sync(t, false)
	if got := b.sets.Entries("IPVSP-SERVICE"); len(got) != 4 {
		t.Errorf("IPVSP-SERVICE = %v, want both Services' virtual servers", got)
	}
	if fails := b.g.ServiceFailures(); len(fails) != 0 {
		t.Errorf("ServiceFailures = %v after the Service shrank, want none", fails)
	}
}

// TestRefusedEntriesChargedToService: a set that refuses some entries (a
// full set, here injected) fails the Services that want them, not the sync
// nor the node: every other Service's entries are written. A Service whose
// LoadBalancer source ranges could not be written is kept out of SERVICE,
// so its VIP's protection refuses its ports (it fails closed, not open),
// and once the set takes the entries, it is accepted again.
func TestRefusedEntriesChargedToService(t *testing.T) {
	b := newBed(t, dualStack)
	fw := service(1)
	lb := vs(model.KindLoadBalancer, "10.251.0.11", tcp, 80, "10.100.0.3:8080")
	lb.SourceRanges = []netip.Prefix{pfx("192.0.2.0/24")}
	fw.VirtualServers = append(fw.VirtualServers, lb)
	other := service(2)
	b.g.SetPlan(fw.Service, fw)
	b.g.SetPlan(other.Service, other)
	refused := func(set string, _ ipset.Entry) error {
		if set == "IPVSP-LB-FW" {
			return ipset.ErrSetFull
		}
		return nil
	}
	b.sets.RefuseEntries(refused)
	if _, err := b.g.SyncStats(true); err != nil {
		t.Fatalf("a sync whose only failures are refused entries failed: %v", err)
	}
	fails := b.g.ServiceFailures()
	if len(fails) != 1 || !strings.Contains(fails[name("s1")], "IPVSP-LB-FW refused entry 10.251.0.11,tcp:80") {
		t.Errorf("ServiceFailures = %v, want ns/s1 charged with the LB-FW entry", fails)
	}
	if !b.g.Retry() {
		t.Error("Retry() = false after a refused write: it may pass later")
	}
	wantService := []string{"10.0.2.15,tcp:30002", "10.96.0.3,tcp:80"} // ns/s2's only
	if diff := cmp.Diff(wantService, b.sets.Entries("IPVSP-SERVICE")); diff != "" {
		t.Errorf("IPVSP-SERVICE while ns/s1's firewall is refused (-want +got):\n%s", diff)
	}
	if got := b.sets.Entries("IPVSP-VIP"); !slices.Contains(got, "10.251.0.11") {
		t.Errorf("IPVSP-VIP = %v, want the LoadBalancer IP protected (its ports refused)", got)
	}
	logged := b.logs.FilterMessage("ipset refused entries; charged to the Services that want them").All()
	if len(logged) == 0 || !slices.Contains(logged[0].ContextMap()["services"].([]any), any("ns/s1")) {
		t.Errorf("log %v, want one naming ns/s1", logged)
	}

	b.sets.RefuseEntries(nil)
	b.sync(t, false)
	if fails := b.g.ServiceFailures(); len(fails) != 0 {
		t.Errorf("ServiceFailures = %v after the set took the entries, want none", fails)
	}
	if got := b.sets.Entries("IPVSP-SERVICE"); !slices.Contains(got, "10.251.0.11,tcp:80") || len(got) != 5 {
		t.Errorf("IPVSP-SERVICE = %v, want both Services, the LoadBalancer IP among them", got)
	}
	if got := b.sets.Entries("IPVSP-LB-FW"); !slices.Equal(got, []string{"10.251.0.11,tcp:80"}) {
		t.Errorf("IPVSP-LB-FW = %v", got)
	}
}

// TestSetErrorIsTheNodes: an error of the set or the call, not of entries,
// is still the node's (the sync fails and is retried whole).
func TestSetErrorIsTheNodes(t *testing.T) {
	b := newBed(t, dualStack)
	b.sync(t, true)
	p := service(1)
	b.g.SetPlan(p.Service, p)
	b.sets.InjectErrors(func(c ipsetfake.Call) error {
		if strings.HasPrefix(string(c), "Add IPVSP-SERVICE") {
			return errors.New("injected")
		}
		return nil
	})
	if _, err := b.g.SyncStats(false); err == nil {
		t.Fatal("a failed call was no error")
	}
	if fails := b.g.ServiceFailures(); len(fails) != 0 {
		t.Errorf("ServiceFailures = %v for a failed call, want none (the node's error)", fails)
	}
}

// TestSetSizeFollowsCount: hash sets get ipset's default size until twice
// their entries need more; then the next power of two.
func TestSetSizeFollowsCount(t *testing.T) {
	id := setID{setService, ipset.IPv4}
	for _, tc := range []struct {
		n    int
		want uint32
	}{{0, ipset.DefaultMaxElem}, {ipset.DefaultMaxElem / 2, ipset.DefaultMaxElem}, {ipset.DefaultMaxElem/2 + 1, 2 * ipset.DefaultMaxElem}, {3_000_000, 8 << 20}} {
		if got := id.spec(tc.n).MaxElem; got != tc.want {
			t.Errorf("spec(%d).MaxElem = %d, want %d", tc.n, got, tc.want)
		}
	}
	if got := (setID{setHealthCheck, ipset.None}).spec(70000); got.MaxElem != 0 || got.PortTo != 65535 {
		t.Errorf("the health-check bitmap's spec = %+v, want the port range and no maxelem", got)
	}
}
