package glue

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

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

// TestSetSizeFollowsCount: hash sets get ipset's default size until their
// entries need more (twice the count); then they grow past half full and
// shrink only below an eighth, so a count moving to and fro does not
// rebuild the set at each crossing.
func TestSetSizeFollowsCount(t *testing.T) {
	const d = ipset.DefaultMaxElem
	size := uint32(0)
	for _, tc := range []struct {
		n    int
		want uint32
	}{
		{0, d}, {d / 2, d}, {d/2 + 1, 2 * d}, // grows past half
		{d / 2, 2 * d}, {d/2 + 1, 2 * d}, {d / 3, 2 * d}, // to and fro: stays
		{d/4 - 1, d},                  // below an eighth: shrinks
		{3_000_000, 8 << 20}, {10, d}, // never below the default
	} {
		size = nextMaxElem(size, tc.n)
		if size != tc.want {
			t.Errorf("at %d entries the size is %d, want %d", tc.n, size, tc.want)
		}
	}
	if got := (setID{setHealthCheck, ipset.None}).spec(1 << 22); got.MaxElem != 0 || got.PortTo != 65535 {
		t.Errorf("the health-check bitmap's spec = %+v, want the port range and no maxelem", got)
	}
}

// TestWithheldSurvivesOtherErrors: a Service withheld from SERVICE because
// LB-FW refused its entry stays withheld when the next write of LB-FW fails
// whole (an error that says nothing of its entry), and every one of 100
// such Services is withheld, not only some (review findings).
func TestWithheldSurvivesOtherErrors(t *testing.T) {
	b := newBed(t, dualStack)
	for i := range 100 {
		p := service(i)
		lb := vs(model.KindLoadBalancer, fmt.Sprintf("10.251.%d.%d", i/250, 1+i%250), tcp, 80, "10.100.0.3:8080")
		lb.SourceRanges = []netip.Prefix{pfx("192.0.2.0/24")}
		p.VirtualServers = append(p.VirtualServers, lb)
		b.g.SetPlan(p.Service, p)
	}
	b.sets.RefuseEntries(func(set string, _ ipset.Entry) error {
		if set == "IPVSP-LB-FW" {
			return ipset.ErrSetFull
		}
		return nil
	})
	if _, err := b.g.SyncStats(true); err != nil {
		t.Fatalf("sync: %v", err)
	}
	accepted := func() int {
		n := 0
		for _, e := range b.sets.Entries("IPVSP-SERVICE") {
			if strings.HasPrefix(e, "10.251.") {
				n++
			}
		}
		return n
	}
	if n, fails := accepted(), len(b.g.ServiceFailures()); n != 0 || fails != 100 {
		t.Errorf("%d LoadBalancer IPs accepted and %d Services failing with LB-FW refused, want 0 and 100", n, fails)
	}
	b.sets.RefuseEntries(nil)
	b.sets.InjectErrors(func(c ipsetfake.Call) error {
		if strings.HasPrefix(string(c), "Add IPVSP-LB-FW") || strings.HasPrefix(string(c), "List IPVSP-LB-FW") {
			return errors.New("injected: the call failed")
		}
		return nil
	})
	if _, err := b.g.SyncStats(false); err == nil {
		t.Fatal("a failed call was no error")
	}
	if n := accepted(); n != 0 {
		t.Errorf("%d LoadBalancer IPs accepted after a failed write of LB-FW, want 0: the hold must stand", n)
	}
	b.sets.InjectErrors(nil)
	b.sync(t, false)
	if n, fails := accepted(), len(b.g.ServiceFailures()); n != 100 || fails != 0 {
		t.Errorf("%d LoadBalancer IPs accepted and %d failing once LB-FW takes them, want 100 and 0", n, fails)
	}
}
