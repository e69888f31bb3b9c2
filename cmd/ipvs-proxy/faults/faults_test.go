package faults_test

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy/faults"
	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

func newInjector(t *testing.T, rate float64, seed uint64) *faults.Injector {
	t.Helper()
	in, err := faults.New(rate, seed)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func vs(i int) ktypes.VirtualServer {
	return ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: ktypes.TCP, Port: 80},
		Scheduler: "rr"}
}

func rs(i int) ktypes.RealServer {
	return ktypes.RealServer{RSKey: ktypes.RSKey{Address: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), Port: 8080}, Weight: 1}
}

func TestNewRejectsRates(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if _, err := faults.New(r, 1); err == nil {
			t.Errorf("New(%v) accepted", r)
		}
	}
}

// TestFractionWithinBounds: for fixed seeds, the share of failed writes is
// the rate within 2 points over 5,000 writes, and the same seed fails the
// same writes.
func TestFractionWithinBounds(t *testing.T) {
	const n = 5000
	for _, rate := range []float64{0, 0.1, 0.5, 1} {
		for _, seed := range []uint64{1, 42} {
			failedOf := func() []int {
				in := newInjector(t, rate, seed)
				ipvs := in.WrapIPVS(fake.NewIPVS())
				var failed []int
				for i := range n {
					if err := ipvs.AddVirtualServer(vs(i)); err != nil {
						failed = append(failed, i)
					}
				}
				if c := in.Counts()[faults.IPVS]; c.Writes != n || c.Failed != len(failed) {
					t.Errorf("rate %v seed %d: counts %+v, want %d writes, %d failed", rate, seed, c, n, len(failed))
				}
				return failed
			}
			a, b := failedOf(), failedOf()
			got := float64(len(a)) / n
			if got < rate-0.02 || got > rate+0.02 {
				t.Errorf("rate %v seed %d: %d of %d writes failed (%.3f)", rate, seed, len(a), n, got)
			}
			if !slices.Equal(a, b) {
				t.Errorf("rate %v seed %d: two runs failed different writes", rate, seed)
			}
		}
	}
	x, y := newInjector(t, 0.5, 1), newInjector(t, 0.5, 2)
	same := 0
	for i := range 200 {
		if (x.Errors(fake.Call(fmt.Sprint("AddRealServer ", i))) == nil) == (y.Errors(fake.Call(fmt.Sprint("AddRealServer ", i))) == nil) {
			same++
		}
	}
	if same == 200 {
		t.Error("seeds 1 and 2 failed the same 200 writes")
	}
}

// TestApplyFailuresLandOnTheirWrites: in a batch, each injected failure is
// the error of its own write, which is not made; the other writes are made
// by the wrapped IPVS, which answers for them (a real server added to a
// virtual server whose injected add failed gets the kernel's ESRCH).
func TestApplyFailuresLandOnTheirWrites(t *testing.T) {
	in := newInjector(t, 0.3, 7)
	inner := fake.NewIPVS()
	ipvs := in.WrapIPVS(inner)
	const n = 400
	var writes []netlinkutil.Write
	for i := range n {
		writes = append(writes, netlinkutil.Write{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs(i)},
			netlinkutil.Write{Kind: ktypes.OpAddRealServer, VirtualServer: vs(i), RealServer: rs(i)})
	}
	errs := ipvs.Apply(writes)
	if len(errs) != len(writes) {
		t.Fatalf("%d errors for %d writes", len(errs), len(writes))
	}
	injected := 0
	for i := range n {
		vsErr, rsErr := errs[2*i], errs[2*i+1]
		_, rerr := inner.ListRealServers(vs(i).VSKey)
		present := rerr == nil
		switch {
		case errors.Is(vsErr, faults.ErrInjected):
			injected++
			if present {
				t.Errorf("virtual server %d: its add failed (%v) but it is in the kernel", i, vsErr)
			}
			if want := "add IPVS service " + vs(i).String(); !strings.Contains(vsErr.Error(), want) {
				t.Errorf("error %q does not say %q", vsErr, want)
			}
			if !errors.Is(rsErr, faults.ErrInjected) && !errors.Is(rsErr, unix.ESRCH) {
				t.Errorf("real server of the missing virtual server %d: %v, want injected or ESRCH", i, rsErr)
			}
		case vsErr != nil:
			t.Errorf("virtual server %d: %v", i, vsErr)
		case !present:
			t.Errorf("virtual server %d: added without error but not in the kernel", i)
		}
		got, _ := inner.ListRealServers(vs(i).VSKey)
		if present && (rsErr == nil) != (len(got) == 1) {
			t.Errorf("real server %d: error %v, kernel has %v", i, rsErr, got)
		}
		if rsErr != nil && errors.Is(rsErr, faults.ErrInjected) {
			injected++
		}
	}
	c := in.Counts()[faults.IPVS]
	if c.Writes != 2*n || c.Failed != injected {
		t.Errorf("counts %+v, want %d writes and %d failed", c, 2*n, injected)
	}
	// One batch reached the kernel, without the failed writes.
	if b := inner.Batches(); len(b) != 1 || b[0] != 2*n-injected {
		t.Errorf("batches %v, want one of %d", b, 2*n-injected)
	}
}

// TestReadsAndStartupWritesPass: at rate 1 every read works, and the
// start-up writes (timeouts, the dummy link) are never failed nor counted.
func TestReadsAndStartupWritesPass(t *testing.T) {
	in := newInjector(t, 1, 1)
	inner, innerLinks := fake.NewIPVS(), fake.NewLinks()
	if err := inner.AddVirtualServer(vs(1)); err != nil {
		t.Fatal(err)
	}
	ipvs, links := in.WrapIPVS(inner), in.WrapLinks(innerLinks)
	if got, err := ipvs.ListVirtualServers(); err != nil || len(got) != 1 {
		t.Errorf("ListVirtualServers: %v %v", got, err)
	}
	if _, err := ipvs.ListAllRealServers(); err != nil {
		t.Error(err)
	}
	if err := ipvs.SetTimeouts(netlinkutil.Timeouts{UDP: 10}); err != nil {
		t.Error(err)
	}
	if err := links.EnsureDummy("ipvs-proxy0"); err != nil {
		t.Error(err)
	}
	a := netip.MustParseAddr("10.96.0.1")
	if err := links.AddAddress("ipvs-proxy0", a); !errors.Is(err, faults.ErrInjected) {
		t.Errorf("AddAddress at rate 1: %v", err)
	}
	if got := innerLinks.Addresses("ipvs-proxy0"); len(got) != 0 {
		t.Errorf("a failed bind was made: %v", got)
	}
	if _, err := links.ListAddresses("ipvs-proxy0"); err != nil {
		t.Error(err)
	}
	if err := ipvs.DeleteVirtualServer(vs(1).VSKey); !errors.Is(err, faults.ErrInjected) {
		t.Errorf("DeleteVirtualServer at rate 1: %v", err)
	}
	want := map[faults.Kind]faults.Count{faults.IPVS: {Writes: 1, Failed: 1}, faults.Address: {Writes: 1, Failed: 1}, faults.IPSet: {}}
	if got := in.Counts(); !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
}

// TestSetWritesFailPerEntry: an Add fails entry by entry: the set holds
// exactly the entries the error does not name.
func TestSetWritesFailPerEntry(t *testing.T) {
	in := newInjector(t, 0.5, 3)
	inner := ipsetfake.New()
	spec := ipset.Spec{Name: "IPVSP-CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.IPv4}
	inner.Put(spec)
	sets := in.WrapSets(inner)
	var entries []ipset.Entry
	for i := range 200 {
		entries = append(entries, ipset.Entry{Addr: vs(i).Address, Proto: ktypes.TCP, Port: 80})
	}
	err := sets.Add(spec.Name, entries...)
	if !errors.Is(err, faults.ErrInjected) {
		t.Fatalf("Add of 200 entries at rate 0.5: %v", err)
	}
	held := inner.Entries(spec.Name)
	c := in.Counts()[faults.IPSet]
	if c.Writes != 200 || c.Failed+len(held) != 200 || c.Failed < 70 || c.Failed > 130 {
		t.Errorf("counts %+v, set holds %d", c, len(held))
	}
	for _, e := range entries {
		named := strings.Contains(err.Error(), "Add "+spec.Name+" "+e.String()+":")
		if named == slices.Contains(held, e.String()) {
			t.Errorf("entry %s: named in the error %v, in the set %v", e, named, !named)
		}
	}
	if _, err := sets.List(spec.Name); err != nil {
		t.Errorf("List: %v", err)
	}
}

// TestMetricsMatchCounts: the Prometheus counters say what Counts says.
func TestMetricsMatchCounts(t *testing.T) {
	in := newInjector(t, 0.5, 9)
	reg := prometheus.NewRegistry()
	if err := in.Register(reg); err != nil {
		t.Fatal(err)
	}
	links := in.WrapLinks(fake.NewLinks())
	if err := links.EnsureDummy("d"); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		_ = links.AddAddress("d", vs(i).Address)
	}
	c := in.Counts()[faults.Address]
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"ipvs_proxy_fault_injection_writes_total/address": 100, "ipvs_proxy_fault_injection_failures_total/address": float64(c.Failed),
		"ipvs_proxy_fault_injection_writes_total/ipvs": 0, "ipvs_proxy_fault_injection_failures_total/ipvs": 0,
		"ipvs_proxy_fault_injection_writes_total/ipset": 0, "ipvs_proxy_fault_injection_failures_total/ipset": 0,
	}
	if !maps.Equal(got, want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
	if c.Writes != 100 || c.Failed == 0 || c.Failed == 100 {
		t.Errorf("counts %+v", c)
	}
	if s := in.String(); !strings.Contains(s, fmt.Sprintf("address %d/100", c.Failed)) {
		t.Errorf("String() = %q", s)
	}
}
