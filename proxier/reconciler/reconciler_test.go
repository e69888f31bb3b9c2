package reconciler

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
)

const testIface = "ipvs-proxy0"

var (
	svcA = types.NamespacedName{Namespace: "default", Name: "a"}
	svcB = types.NamespacedName{Namespace: "default", Name: "b"}
	node = netip.MustParseAddr("192.168.0.10")
)

func testOwnership() model.Ownership {
	return model.Ownership{Interface: testIface, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}}
}

func newTestReconciler(t *testing.T) (*Reconciler, *fake.IPVS, *fake.Links) {
	t.Helper()
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(node)
	return NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop()), ipvs, links
}

func mustSync(t *testing.T, r *Reconciler, full bool) SyncStats {
	t.Helper()
	st, err := r.Sync(full)
	if err != nil {
		t.Fatalf("Sync(full=%v): %v", full, err)
	}
	return st
}

func callsDiff(t *testing.T, what string, want []string, got []fake.Call) {
	t.Helper()
	g := make([]string, len(got))
	for i, c := range got {
		g[i] = string(c)
	}
	if diff := cmp.Diff(want, g, cmp.Comparer(func(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") })); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

func resetCalls(ipvs *fake.IPVS, links *fake.Links) {
	ipvs.ResetCalls()
	links.ResetCalls()
}

func TestReconcilerWrites(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	a1 := modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080"))

	// Adding a Service: bind its VIP, one VS, one write per real server.
	r.SetPlan(svcA, a1)
	st := mustSync(t, r, false)
	if !st.Full {
		t.Errorf("first sync was not full")
	}
	callsDiff(t, "ipvs writes, add service", []string{
		"AddVirtualServer 10.96.0.10:80/TCP rr",
		"AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1",
		"AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1",
	}, ipvs.Writes())
	callsDiff(t, "link writes, add service", []string{"EnsureDummy ipvs-proxy0", "AddAddress ipvs-proxy0 10.96.0.10"}, links.Writes())
	if st.Writes != 4 {
		t.Errorf("stats writes = %d, want 4", st.Writes)
	}

	steps := []struct {
		name       string
		plan       *model.ServicePlan
		wantIPVS   []string
		wantLinks  []string
		wantKernel []string
	}{
		{
			name:     "add an endpoint",
			plan:     modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS: []string{"AddRealServer 10.96.0.10:80/TCP 10.0.3.2:8080 w=1"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "  -> 10.0.2.2:8080 w=1",
				"  -> 10.0.3.2:8080 w=1"},
		},
		{
			// Its pod is terminating but still serving: weight 0, so
			// established connections go on and new ones go elsewhere.
			name:     "an endpoint drains",
			plan:     modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080@0", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS: []string{"UpdateRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=0"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=0", "  -> 10.0.2.2:8080 w=1",
				"  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:       "remove an endpoint",
			plan:       modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS:   []string{"DeleteRealServer 10.96.0.10:80/TCP 10.0.1.2:8080"},
			wantKernel: []string{"10.96.0.10:80/TCP rr", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			// sh walks the list: the real servers that rr's adds left
			// newest first are put in canonical order (ascending from
			// the head) by moving the first one to the head.
			name: "change the scheduler",
			plan: modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "sh", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantIPVS: []string{"UpdateVirtualServer 10.96.0.10:80/TCP sh",
				"DeleteRealServer 10.96.0.10:80/TCP 10.0.2.2:8080", "AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1"},
			wantKernel: []string{"10.96.0.10:80/TCP sh", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:       "unchanged plan",
			plan:       modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "sh", "10.0.2.2:8080", "10.0.3.2:8080")),
			wantKernel: []string{"10.96.0.10:80/TCP sh", "  -> 10.0.2.2:8080 w=1", "  -> 10.0.3.2:8080 w=1"},
		},
		{
			name:      "delete the service",
			plan:      nil,
			wantIPVS:  []string{"DeleteVirtualServer 10.96.0.10:80/TCP"},
			wantLinks: []string{"DeleteAddress ipvs-proxy0 10.96.0.10"},
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			resetCalls(ipvs, links)
			r.SetPlan(svcA, s.plan)
			st := mustSync(t, r, false)
			if st.Full {
				t.Errorf("sync was full, want partial")
			}
			callsDiff(t, "ipvs writes", s.wantIPVS, ipvs.Writes())
			callsDiff(t, "link writes", s.wantLinks, links.Writes())
			if diff := cmp.Diff(s.wantKernel, ipvs.Dump()); diff != "" {
				t.Errorf("kernel (-want +got):\n%s", diff)
			}
			if st.Writes != len(s.wantIPVS)+len(s.wantLinks) {
				t.Errorf("stats writes = %d, want %d", st.Writes, len(s.wantIPVS)+len(s.wantLinks))
			}
			for _, c := range ipvs.Reads() {
				if c == "ListVirtualServers" {
					t.Errorf("partial sync dumped every virtual server")
				}
			}
		})
	}
	if got := links.Addresses(testIface); len(got) != 0 {
		t.Errorf("addresses left on %s: %v", testIface, got)
	}
}

// twoServices programs two Services through a first reconciler.
func twoServices(t *testing.T, r *Reconciler) {
	t.Helper()
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080"),
		modeltest.VS(model.KindNodePort, "192.168.0.10:30080", "rr", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:53", "lc", "10.0.1.3:53")))
	mustSync(t, r, false)
}

func TestReconcilerResyncAndRestartMakeNoWrites(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	twoServices(t, r)
	before := ipvs.Dump()

	resetCalls(ipvs, links)
	st := mustSync(t, r, true)
	callsDiff(t, "full resync writes", nil, ipvs.Writes())
	callsDiff(t, "full resync link writes", nil, links.Writes())
	if st.Writes != 0 {
		t.Errorf("stats writes = %d", st.Writes)
	}
	// One dump of virtual servers and one read of every destination.
	callsDiff(t, "full resync reads", []string{"ListVirtualServers", "ListAllRealServers"}, ipvs.Reads())

	// A restart: a new reconciler on the same kernel adopts its state.
	resetCalls(ipvs, links)
	r2 := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
	twoServices(t, r2)
	callsDiff(t, "restart writes", nil, ipvs.Writes())
	callsDiff(t, "restart link writes", nil, links.Writes())
	if diff := cmp.Diff(before, ipvs.Dump()); diff != "" {
		t.Errorf("kernel changed by restart (-before +after):\n%s", diff)
	}
}

// TestReconcilerRepairsDrift: a full sync repairs what was changed by
// hand, also on a virtual server that the bulk read of real servers left
// out (read alone then).
func TestReconcilerRepairsDrift(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	twoServices(t, r)
	want := ipvs.Dump()
	ipvs.SkipInBulkRead(ktypestest.VSKey("10.96.0.10:80", ktypes.TCP))

	// Someone deletes a real server, and changes a scheduler, by hand.
	k := ktypestest.VSKey("10.96.0.10:80", ktypes.TCP)
	if err := ipvs.DeleteRealServer(k, ktypes.RSKey{Address: netip.MustParseAddr("10.0.1.2"), Port: 8080}); err != nil {
		t.Fatal(err)
	}
	if err := ipvs.UpdateVirtualServer(ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.96.0.11:53", ktypes.TCP), Scheduler: "wrr"}); err != nil {
		t.Fatal(err)
	}
	resetCalls(ipvs, links)
	mustSync(t, r, true)
	// Virtual servers first (one batch), then real servers (another).
	callsDiff(t, "repair writes", []string{
		"UpdateVirtualServer 10.96.0.11:53/TCP lc",
		"AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1",
	}, ipvs.Writes())
	callsDiff(t, "repair reads", []string{"ListVirtualServers", "ListAllRealServers", "ListRealServers 10.96.0.10:80/TCP"}, ipvs.Reads())
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("kernel after repair (-want +got):\n%s", diff)
	}
}

func TestReconcilerOwnership(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	// Present before start: a foreign VS on an address that is not ours, a
	// foreign VS on a node address outside the node-port range, an excluded
	// VS on our interface, and a stale VS of ours on our interface.
	foreign := []ktypes.VirtualServer{
		{VSKey: ktypestest.VSKey("172.16.0.1:80", ktypes.TCP), Scheduler: "wlc"},
		{VSKey: ktypestest.VSKey("192.168.0.10:8443", ktypes.TCP), Scheduler: "rr"},
		{VSKey: ktypestest.VSKey("10.200.0.1:80", ktypes.TCP), Scheduler: "rr"},
	}
	for _, v := range append(foreign, ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.96.0.99:80", ktypes.TCP), Scheduler: "rr"},
		ktypes.VirtualServer{VSKey: ktypestest.VSKey("192.168.0.10:30999", ktypes.TCP), Scheduler: "rr"}) {
		if err := ipvs.AddVirtualServer(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := links.EnsureDummy(testIface); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.99", "10.200.0.1", "fe80::1"} {
		if err := links.AddAddress(testIface, netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	resetCalls(ipvs, links)
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr")))
	mustSync(t, r, false)
	callsDiff(t, "ipvs writes", []string{
		"AddVirtualServer 10.96.0.10:80/TCP rr",
		"DeleteVirtualServer 10.96.0.99:80/TCP",
		"DeleteVirtualServer 192.168.0.10:30999/TCP",
	}, ipvs.Writes())
	callsDiff(t, "link writes", []string{"AddAddress ipvs-proxy0 10.96.0.10", "DeleteAddress ipvs-proxy0 10.96.0.99"}, links.Writes())
	dump := strings.Join(ipvs.Dump(), "\n")
	for _, v := range foreign {
		if !strings.Contains(dump, v.String()) {
			t.Errorf("foreign virtual server %s was removed; kernel:\n%s", v, dump)
		}
	}
}

// newClockedReconciler is newTestReconciler with a fake clock and retries
// from 1s doubling up to 8s.
func newClockedReconciler(t *testing.T) (*Reconciler, *fake.IPVS, *fake.Links, *clocktesting.FakeClock) {
	t.Helper()
	r, ipvs, links, clk, _ := newLoggedReconciler(t)
	return r, ipvs, links, clk
}

// newLoggedReconciler is newClockedReconciler whose log is observed (from
// info level).
func newLoggedReconciler(t *testing.T) (*Reconciler, *fake.IPVS, *fake.Links, *clocktesting.FakeClock, *observer.ObservedLogs) {
	t.Helper()
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(node)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	cfg := Config{Ownership: testOwnership(), RetryBase: time.Second, RetryMax: 8 * time.Second, Clock: clk}
	core, logs := observer.New(zap.InfoLevel)
	return NewReconciler(ipvs, links, cfg, zap.New(core)), ipvs, links, clk, logs
}

// TestReconcilerRetriesFailedServiceAlone: a Service whose write fails is
// retried alone, by partial syncs, after a backoff that doubles up to the
// maximum; other Services' changes go on meanwhile; the kernel is never
// dumped whole because of it. (Before the redesign, one failed write made
// every following sync a full one.)
func TestReconcilerRetriesFailedServiceAlone(t *testing.T) {
	r, ipvs, links, clk, logs := newLoggedReconciler(t)
	mustSync(t, r, true) // the first full sync, nothing wanted yet
	errBusy := errors.New("injected: device or resource busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.0.10:80/TCP 10.0.2.2") {
			return errBusy
		}
		return nil
	})
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080")))
	st, err := r.Sync(false)
	if !errors.Is(err, errBusy) || !strings.Contains(err.Error(), "default/a") {
		t.Fatalf("Sync error = %v, want the injected error naming default/a", err)
	}
	if st.Full || !errors.Is(st.Failed[svcA], errBusy) || len(st.Failed) != 1 {
		t.Errorf("stats: full=%v failed=%v, want a partial sync with only default/a failed", st.Full, st.Failed)
	}
	if diff := cmp.Diff([]types.NamespacedName{svcB}, st.Applied); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	// Both Services' writes went in two batches: virtual servers, then
	// real servers. The other Service is programmed regardless.
	if diff := cmp.Diff([]int{2, 3}, ipvs.Batches()); diff != "" {
		t.Errorf("batch sizes (-want +got):\n%s", diff)
	}
	if !strings.Contains(strings.Join(ipvs.Dump(), "\n"), "10.96.0.11:80/TCP rr\n  -> 10.0.1.3:8080 w=1") {
		t.Errorf("service b not programmed after a's failure:\n%s", strings.Join(ipvs.Dump(), "\n"))
	}
	sa, _ := r.Status(svcA)
	wantStatus := ServiceStatus{Service: svcA, Failures: 1, NextRetry: clk.Now().Add(time.Second),
		LastError: "add-real-server 10.96.0.10:80/TCP 10.0.2.2:8080 w=1: injected: device or resource busy"}
	if diff := cmp.Diff(wantStatus, sa); diff != "" {
		t.Errorf("status of a (-want +got):\n%s", diff)
	}
	if r.Pending() {
		t.Errorf("a sync is pending before the retry is due")
	}

	// During a's backoff, a change of b is a partial sync of b alone.
	resetCalls(ipvs, links)
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080", "10.0.1.4:8080")))
	st = mustSync(t, r, false)
	callsDiff(t, "b's change during a's backoff", []string{"AddRealServer 10.96.0.11:80/TCP 10.0.1.4:8080 w=1"}, ipvs.Writes())
	callsDiff(t, "reads of b's change", []string{"ListRealServers 10.96.0.11:80/TCP"}, ipvs.Reads())

	// The retries back off: 1s, 2s, 4s, 8s, 8s; each reads and writes a's
	// virtual server only.
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		if got := r.NextRetry().Sub(clk.Now()); got != wait {
			t.Fatalf("retry %d: due in %v, want %v", i+1, got, wait)
		}
		clk.Step(wait - time.Millisecond)
		if r.Pending() {
			t.Fatalf("retry %d: pending before it is due", i+1)
		}
		clk.Step(time.Millisecond)
		if !r.Pending() {
			t.Fatalf("retry %d: not pending when due", i+1)
		}
		resetCalls(ipvs, links)
		if st, err = r.Sync(false); !errors.Is(err, errBusy) || st.Full {
			t.Fatalf("retry %d: full=%v err=%v, want a partial sync failing again", i+1, st.Full, err)
		}
		callsDiff(t, "retry reads", []string{"ListRealServers 10.96.0.10:80/TCP"}, ipvs.Reads())
		callsDiff(t, "retry writes", []string{"AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1"}, ipvs.Writes())
	}
	// Each failure is logged with its Service, its count, the delay and
	// the time of its retry, and the error.
	var retries []string
	for _, e := range logs.FilterMessage("service not fully programmed; retrying it alone").All() {
		f := e.ContextMap()
		retries = append(retries, fmt.Sprintf("%v #%v in %v at %v: %v", f["service"], f["failures"], f["retryIn"],
			f["nextRetry"].(time.Time).Sub(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)), f["error"]))
	}
	wantRetries := []string{}
	at := time.Duration(0)
	for i, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second} {
		wantRetries = append(wantRetries, fmt.Sprintf("default/a #%d in %v at %v: add-real-server 10.96.0.10:80/TCP 10.0.2.2:8080 w=1: injected: device or resource busy",
			i+1, d, at+d))
		at += d
	}
	if diff := cmp.Diff(wantRetries, retries); diff != "" {
		t.Errorf("retry log lines (-want +got):\n%s", diff)
	}

	ipvs.InjectErrors(nil)
	clk.Step(8 * time.Second)
	resetCalls(ipvs, links)
	st = mustSync(t, r, false)
	if st.Full {
		t.Errorf("the successful retry was a full sync")
	}
	callsDiff(t, "last retry writes", []string{"AddRealServer 10.96.0.10:80/TCP 10.0.2.2:8080 w=1"}, ipvs.Writes())
	if sa, _ := r.Status(svcA); !sa.Applied || sa.Failures != 0 || sa.LastError != "" || !r.NextRetry().IsZero() || r.Pending() {
		t.Errorf("after a successful retry: status %+v, next retry %v, pending %v", sa, r.NextRetry(), r.Pending())
	}
}

// TestReconcilerBatchFailures: writes go in two batches (virtual servers,
// then real servers); a virtual server refused in the middle of the first
// fails its Service alone, whose real servers are then not written, and a
// real server refused in the middle of the second fails its Service alone;
// every other write of both batches applies.
func TestReconcilerBatchFailures(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	mustSync(t, r, true)
	svcC := types.NamespacedName{Namespace: "default", Name: "c"}
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080", "10.0.1.4:8080")))
	r.SetPlan(svcC, modeltest.Plan(svcC, modeltest.VS(model.KindClusterIP, "10.96.0.12:80", "rr", "10.0.1.5:8080", "10.0.1.6:8080", "10.0.1.7:8080")))
	errVS, errRS := errors.New("injected: file exists"), errors.New("injected: no such process")
	ipvs.InjectErrors(func(c fake.Call) error {
		switch c {
		case "AddVirtualServer 10.96.0.11:80/TCP rr":
			return errVS
		case "AddRealServer 10.96.0.12:80/TCP 10.0.1.6:8080 w=1":
			return errRS
		}
		return nil
	})
	resetCalls(ipvs, links)
	st, err := r.Sync(false)
	if !errors.Is(err, errVS) || !errors.Is(err, errRS) {
		t.Fatalf("Sync error = %v, want both injected errors", err)
	}
	callsDiff(t, "writes", []string{
		"AddVirtualServer 10.96.0.10:80/TCP rr",
		"AddVirtualServer 10.96.0.11:80/TCP rr",
		"AddVirtualServer 10.96.0.12:80/TCP rr",
		"AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1",
		"AddRealServer 10.96.0.12:80/TCP 10.0.1.5:8080 w=1",
		"AddRealServer 10.96.0.12:80/TCP 10.0.1.6:8080 w=1",
		"AddRealServer 10.96.0.12:80/TCP 10.0.1.7:8080 w=1",
	}, ipvs.Writes())
	if diff := cmp.Diff([]int{3, 4}, ipvs.Batches()); diff != "" {
		t.Errorf("batch sizes (-want +got):\n%s", diff)
	}
	if len(st.Failed) != 2 || !errors.Is(st.Failed[svcB], errVS) || !errors.Is(st.Failed[svcC], errRS) {
		t.Errorf("failed = %v, want b with the virtual server's error and c with the real server's", st.Failed)
	}
	if diff := cmp.Diff([]types.NamespacedName{svcA}, st.Applied); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1",
		"10.96.0.12:80/TCP rr", "  -> 10.0.1.5:8080 w=1", "  -> 10.0.1.7:8080 w=1",
	}, ipvs.Dump()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
	for n, want := range map[types.NamespacedName]string{
		svcB: "add-virtual-server 10.96.0.11:80/TCP rr: injected: file exists",
		svcC: "add-real-server 10.96.0.12:80/TCP 10.0.1.6:8080 w=1: injected: no such process",
	} {
		if s, _ := r.Status(n); s.Applied || s.LastError != want {
			t.Errorf("status of %s: applied=%v error %q, want %q", n, s.Applied, s.LastError, want)
		}
	}
}

// TestReconcilerReadFailureForcesFull: only a failed kernel read makes the
// next sync full, after its backoff; so does a batched write whose answer
// was lost (it may or may not be in the kernel), and that full sync sees
// what the kernel holds.
func TestReconcilerReadFailureForcesFull(t *testing.T) {
	for _, tc := range []struct {
		name string
		call string // the failing call's prefix
		err  error
	}{
		{"failed read", "ListRealServers", errors.New("injected: no buffer space")},
		{"lost answer", "AddRealServer 10.96.0.10:80/TCP 10.0.1.3:8080", fmt.Errorf("injected: %w", netlinkutil.ErrOutcomeUnknown)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ipvs, links, clk := newClockedReconciler(t)
			r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
			mustSync(t, r, true)
			ipvs.InjectErrors(func(c fake.Call) error {
				if strings.HasPrefix(string(c), tc.call) {
					return tc.err
				}
				return nil
			})
			r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.1.3:8080")))
			if _, err := r.Sync(false); !errors.Is(err, tc.err) {
				t.Fatalf("Sync = %v, want %v", err, tc.err)
			}
			ipvs.InjectErrors(nil)
			if r.FullDue() {
				t.Errorf("a full sync is due before the backoff")
			}
			clk.Step(time.Second)
			if !r.FullDue() {
				t.Errorf("no full sync due after the failure and its backoff")
			}
			resetCalls(ipvs, links)
			if st := mustSync(t, r, false); !st.Full {
				t.Errorf("the sync after the failure's backoff was not full")
			}
			callsDiff(t, "writes of the full retry", []string{"AddRealServer 10.96.0.10:80/TCP 10.0.1.3:8080 w=1"}, ipvs.Writes())
			if r.FullDue() || r.Pending() {
				t.Errorf("after the full sync: full due %v, pending %v", r.FullDue(), r.Pending())
			}
		})
	}
}

// created returns a plan for a Service created at the given minute.
func created(p *model.ServicePlan, minute int) *model.ServicePlan {
	p.Created = time.Date(2026, 1, 1, 0, minute, 0, 0, time.UTC)
	return p
}

// TestReconcilerConflict: two Services want the same externalIP and port.
// The older one holds it, whatever the order in which they arrive and
// whatever kind of sync runs; the younger one's status names the holder;
// when the holder lets go, the other takes the virtual server over in
// place (its real servers replaced, the virtual server kept). (Before the
// redesign the first to arrive held it until a full resync, which handed
// it to the first in name order.)
func TestReconcilerConflict(t *testing.T) {
	older := func() *model.ServicePlan {
		return created(modeltest.Plan(svcB, modeltest.VS(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.2.2:8080")), 1)
	}
	younger := func() *model.ServicePlan {
		return created(modeltest.Plan(svcA, modeltest.VS(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.1.2:8080"),
			modeltest.VS(model.KindExternalIP, "172.20.0.5:81", "rr", "10.0.1.2:8081")), 2)
	}
	held := []string{"172.20.0.5:80/TCP rr", "  -> 10.0.2.2:8080 w=1", "172.20.0.5:81/TCP rr", "  -> 10.0.1.2:8081 w=1"}
	for _, order := range []string{"younger first", "older first"} {
		t.Run(order, func(t *testing.T) {
			r, ipvs, links := newTestReconciler(t)
			if order == "younger first" {
				r.SetPlan(svcA, younger())
				mustSync(t, r, false)
				r.SetPlan(svcB, older())
			} else {
				r.SetPlan(svcB, older())
				mustSync(t, r, false)
				r.SetPlan(svcA, younger())
			}
			mustSync(t, r, false)
			if diff := cmp.Diff(held, ipvs.Dump()); diff != "" {
				t.Errorf("kernel after a partial sync (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]types.NamespacedName{svcA}, r.ConflictChanges()); diff != "" {
				t.Errorf("conflict changes (-want +got):\n%s", diff)
			}
			sa, _ := r.Status(svcA)
			wantConflicts := []model.Conflict{{VirtualServer: ktypestest.VSKey("172.20.0.5:80", ktypes.TCP), Holder: svcB, Loser: svcA}}
			if diff := cmp.Diff(wantConflicts, sa.Conflicts, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("conflicts of the younger Service (-want +got):\n%s", diff)
			}
			// A full resync keeps the holder: no write at all.
			resetCalls(ipvs, links)
			mustSync(t, r, true)
			callsDiff(t, "full resync writes", nil, ipvs.Writes())

			// The holder goes: the other takes the virtual server over in
			// place.
			resetCalls(ipvs, links)
			r.SetPlan(svcB, nil)
			mustSync(t, r, false)
			callsDiff(t, "handover writes", []string{
				"AddRealServer 172.20.0.5:80/TCP 10.0.1.2:8080 w=1",
				"DeleteRealServer 172.20.0.5:80/TCP 10.0.2.2:8080",
			}, ipvs.Writes())
			if diff := cmp.Diff([]types.NamespacedName{svcA}, r.ConflictChanges()); diff != "" {
				t.Errorf("conflict changes after the handover (-want +got):\n%s", diff)
			}
			if sa, _ := r.Status(svcA); len(sa.Conflicts) != 0 {
				t.Errorf("conflicts after the handover: %v", sa.Conflicts)
			}
		})
	}
}

// TestReconcilerClaimsMatchAssign: whatever the order of plan changes, the
// reconciler's incremental holders are the ones model.Assign computes from
// the final plans at once (the rule status uses).
func TestReconcilerClaimsMatchAssign(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	names := []types.NamespacedName{}
	for i := range 6 {
		names = append(names, types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)})
	}
	vips := []string{"172.20.0.1:80", "172.20.0.1:81", "172.20.0.2:80"}
	for round := range 200 {
		r, ipvs, _ := newTestReconciler(t)
		current := map[types.NamespacedName]*model.ServicePlan{}
		for range 12 {
			n := names[rnd.IntN(len(names))]
			if rnd.IntN(4) == 0 {
				r.SetPlan(n, nil)
				delete(current, n)
				continue
			}
			var vss []model.VSPlan
			for _, v := range vips {
				if rnd.IntN(2) == 0 {
					vss = append(vss, modeltest.VS(model.KindExternalIP, v, "rr", fmt.Sprintf("10.0.%d.%d:80", round%250, rnd.IntN(200)+1)))
				}
			}
			// Creation times collide often, so that names break ties.
			p := created(modeltest.Plan(n, vss...), rnd.IntN(3))
			r.SetPlan(n, p)
			current[n] = p
			if rnd.IntN(3) == 0 {
				mustSync(t, r, rnd.IntN(2) == 0)
			}
		}
		mustSync(t, r, false)
		var plans []*model.ServicePlan
		for _, n := range names {
			if p, ok := current[n]; ok {
				plans = append(plans, p)
			}
		}
		want, _ := model.Assign(plans, testOwnership())
		var wantDump []string
		for _, k := range slices.SortedFunc(maps.Keys(want.VirtualServers), ktypes.VSKey.Compare) {
			w := want.VirtualServers[k]
			wantDump = append(wantDump, w.VirtualServer.String())
			for _, rs := range w.RealServers {
				wantDump = append(wantDump, "  -> "+rs.String())
			}
		}
		if diff := cmp.Diff(wantDump, ipvs.Dump()); diff != "" {
			t.Fatalf("round %d: kernel differs from model.Assign's holders (-want +got):\n%s", round, diff)
		}
	}
}

// TestReconcilerClearsUDPConntrack: removing a UDP real server clears the
// conntrack entries of flows to it; a TCP one does not need it.
func TestReconcilerClearsUDPConntrack(t *testing.T) {
	r, _, _ := newTestReconciler(t)
	ct := &fake.Conntrack{}
	r.SetConntrack(ct)
	udp := func(rss ...string) model.VSPlan {
		p := modeltest.VS(model.KindClusterIP, "10.96.0.10:53", "rr", rss...)
		p.Protocol = ktypes.UDP
		return p
	}
	r.SetPlan(svcA, modeltest.Plan(svcA, udp("10.0.1.2:53", "10.0.2.2:53"), modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:80", "10.0.2.2:80")))
	mustSync(t, r, false)
	r.SetPlan(svcA, modeltest.Plan(svcA, udp("10.0.2.2:53"), modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.2.2:80")))
	mustSync(t, r, false)
	callsDiff(t, "conntrack calls", []string{"ClearUDP 10.96.0.10:53/UDP 10.0.1.2:53"}, ct.Calls())

	// The whole UDP virtual server goes (the Service deleted, its port
	// renumbered): the entries of flows to it, whatever their real
	// server, go too, or a client keeping its port stays stuck on them
	// when the address and port serve again.
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.2.2:80")))
	mustSync(t, r, false)
	callsDiff(t, "conntrack calls after the UDP virtual server is deleted",
		[]string{"ClearUDP 10.96.0.10:53/UDP 10.0.1.2:53", "ClearUDP 10.96.0.10:53/UDP *"}, ct.Calls())
}

// TestReconcilerWritesUDPLossesFirst: in a sync that also writes many
// other Services' changes, a UDP virtual server that loses a real server
// (or goes) is written first, and its flows' conntrack entries cleared
// before any other write: a UDP client is stuck on a gone backend until
// both are done. A UDP virtual server that only gains one, or is new,
// keeps Diff's order.
func TestReconcilerWritesUDPLossesFirst(t *testing.T) {
	r, ipvs, _ := newTestReconciler(t)
	ct := &fake.Conntrack{}
	r.SetConntrack(ct)
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "bulk", Name: fmt.Sprint("s", i)}
	}
	tcp := func(i int, rss ...string) *model.ServicePlan {
		return modeltest.Plan(name(i), modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.0.%d:80", i+1), "rr", rss...))
	}
	udp := func(n types.NamespacedName, vip string, rss ...string) *model.ServicePlan {
		p := modeltest.VS(model.KindClusterIP, vip, "rr", rss...)
		p.Protocol = ktypes.UDP
		return modeltest.Plan(n, p)
	}
	dns := types.NamespacedName{Namespace: "kube-system", Name: "dns"}
	gone := types.NamespacedName{Namespace: "udp", Name: "gone"}
	grows := types.NamespacedName{Namespace: "udp", Name: "grows"}
	const n = 50
	for i := range n {
		r.SetPlan(name(i), tcp(i, "10.0.1.2:8080"))
	}
	r.SetPlan(dns, udp(dns, "10.96.9.10:53", "10.0.1.5:53", "10.0.2.5:53"))
	r.SetPlan(gone, udp(gone, "10.96.9.20:53", "10.0.1.6:53"))
	r.SetPlan(grows, udp(grows, "10.96.0.200:53", "10.0.1.7:53"))
	mustSync(t, r, true)

	for i := range n {
		r.SetPlan(name(i), tcp(i, "10.0.2.2:8080"))
	}
	r.SetPlan(dns, udp(dns, "10.96.9.10:53", "10.0.2.5:53"))
	r.SetPlan(gone, nil)
	r.SetPlan(grows, udp(grows, "10.96.0.200:53", "10.0.1.7:53", "10.0.2.7:53"))
	clearsBefore := -1 // conntrack calls made when the first TCP write came
	ipvs.InjectErrors(func(c fake.Call) error {
		write := !strings.HasPrefix(string(c), "List") && !strings.HasPrefix(string(c), "Get")
		if clearsBefore < 0 && write && strings.Contains(string(c), "/TCP") {
			clearsBefore = len(ct.Calls())
		}
		return nil
	})
	ipvs.ResetCalls()
	mustSync(t, r, false)
	writes := ipvs.Writes()
	if len(writes) != 2+2*n+1 {
		t.Fatalf("%d writes, want %d: %v", len(writes), 2+2*n+1, writes)
	}
	callsDiff(t, "the first writes", []string{
		"DeleteRealServer 10.96.9.10:53/UDP 10.0.1.5:53",
		"DeleteVirtualServer 10.96.9.20:53/UDP",
	}, writes[:2])
	if clearsBefore != 1 {
		t.Errorf("%d conntrack calls before the first TCP write, want 1 (the UDP losses' clears)", clearsBefore)
	}
	callsDiff(t, "conntrack calls", []string{"ClearUDP 10.96.9.10:53/UDP 10.0.1.5:53, 10.96.9.20:53/UDP *"}, ct.Calls())
	if !slices.Contains(writes[2:], fake.Call("AddRealServer 10.96.0.200:53/UDP 10.0.2.7:53 w=1")) {
		t.Errorf("the UDP virtual server that gains a real server: its add is missing from %v", writes)
	}
	ipvs.InjectErrors(nil)
	if st := mustSync(t, r, true); st.Writes != 0 {
		t.Errorf("a full sync after it wrote %d times, want 0 (the kernel as wanted)", st.Writes)
	}
}

// TestReconcilerReadsManyRealServersAtOnce: a partial sync that changes
// many Services (a node address change rebuilds every one) reads their
// real servers by one read of the whole table, not one dump per virtual
// server; one change still dumps its own virtual server alone; a virtual
// server the bulk read lacks, or a bulk read that fails, is read alone.
func TestReconcilerReadsManyRealServersAtOnce(t *testing.T) {
	r, ipvs, _ := newTestReconciler(t)
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "bulk", Name: fmt.Sprint("s", i)}
	}
	vip := func(i int) string { return fmt.Sprintf("10.96.%d.%d:80", i/200, i%200+1) }
	plan := func(i int, rss ...string) *model.ServicePlan {
		return modeltest.Plan(name(i), modeltest.VS(model.KindClusterIP, vip(i), "rr", rss...))
	}
	const n = 100
	for i := range n {
		r.SetPlan(name(i), plan(i, "10.0.1.2:8080"))
	}
	mustSync(t, r, true)
	changeAll := func(rss ...string) {
		t.Helper()
		for i := range n {
			r.SetPlan(name(i), plan(i, rss...))
		}
		ipvs.ResetCalls()
		mustSync(t, r, false)
	}
	changeAll("10.0.1.2:8080", "10.0.2.2:8080")
	callsDiff(t, "reads of a sync changing 100 Services", []string{"ListAllRealServers"}, ipvs.Reads())
	if w := len(ipvs.Writes()); w != n {
		t.Errorf("%d writes, want %d (a real server added to each)", w, n)
	}

	r.SetPlan(name(7), plan(7, "10.0.2.2:8080"))
	ipvs.ResetCalls()
	mustSync(t, r, false)
	callsDiff(t, "reads of one change", []string{"ListRealServers " + vip(7) + "/TCP"}, ipvs.Reads())

	ipvs.SkipInBulkRead(ktypestest.VSKey(vip(3), ktypes.TCP))
	changeAll("10.0.3.2:8080")
	callsDiff(t, "reads when the bulk read lacks one virtual server",
		[]string{"ListAllRealServers", "ListRealServers " + vip(3) + "/TCP"}, ipvs.Reads())

	ipvs.InjectErrors(func(c fake.Call) error {
		if c == "ListAllRealServers" {
			return errors.New("injected: the table cannot be read")
		}
		return nil
	})
	changeAll("10.0.4.2:8080")
	if got := len(ipvs.Reads()); got != 1+n {
		t.Errorf("%d reads after a failed bulk read, want it and one per virtual server (%d)", got, 1+n)
	}
	for i := range n {
		got, err := ipvs.ListRealServers(ktypestest.VSKey(vip(i), ktypes.TCP))
		if err != nil || len(got) != 1 || got[0].Address.String() != "10.0.4.2" {
			t.Fatalf("%s: real servers %v (%v), want 10.0.4.2:8080 alone", vip(i), got, err)
		}
	}
}

// TestReconcilerClearsUDPConntrackInOneCall: a sync that deletes ten UDP
// Services and a real server of another clears their flows' conntrack
// entries in one call (the kernel's table is read whole for each call:
// one per virtual server was one read of the table each); a clear that
// fails is logged and fails nothing (the entries time out).
func TestReconcilerClearsUDPConntrackInOneCall(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r := NewReconciler(fake.NewIPVS(), fake.NewLinks(node), Config{Ownership: testOwnership()}, zap.New(core))
	ct := &fake.Conntrack{}
	r.SetConntrack(ct)
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "dns", Name: fmt.Sprint("s", i)}
	}
	udp := func(i int, rss ...string) *model.ServicePlan {
		p := modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.1.%d:53", i), "rr", rss...)
		p.Protocol = ktypes.UDP
		return modeltest.Plan(name(i), p)
	}
	for i := range 12 {
		r.SetPlan(name(i), udp(i, "10.0.1.2:53", "10.0.2.2:53"))
	}
	mustSync(t, r, false)
	var want []string
	for i := range 10 {
		r.SetPlan(name(i), nil)
		want = append(want, fmt.Sprintf("10.96.1.%d:53/UDP *", i))
	}
	r.SetPlan(name(10), udp(10, "10.0.2.2:53"))
	want = append(want, "10.96.1.10:53/UDP 10.0.1.2:53")
	mustSync(t, r, false)
	callsDiff(t, "conntrack calls", []string{"ClearUDP " + strings.Join(want, ", ")}, ct.Calls())

	ct.Err = errors.New("injected: conntrack dump interrupted")
	r.SetPlan(name(11), nil)
	st := mustSync(t, r, false)
	if len(st.Failed) != 0 {
		t.Errorf("a failed conntrack clear failed Services: %v", st.Failed)
	}
	if n := logs.FilterMessageSnippet("clear conntrack entries").Len(); n != 1 {
		t.Errorf("%d warnings of the failed clear, want 1", n)
	}
	if n := len(ct.Calls()); n != 2 {
		t.Errorf("%d conntrack calls, want 2 (one per sync that removed UDP flows)", n)
	}
}

// TestReconcilerFailingHolderStaysFailing: a failing Service drawn into a
// partial sync by another Service's change (here a younger Service that
// wants one of its virtual servers) is retried whole, so that success on
// that one virtual server does not clear the failure of another.
func TestReconcilerFailingHolderStaysFailing(t *testing.T) {
	r, ipvs, _, _ := newClockedReconciler(t)
	errBusy := errors.New("injected: busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 172.20.0.5:81/TCP") {
			return errBusy
		}
		return nil
	})
	r.SetPlan(svcA, created(modeltest.Plan(svcA, modeltest.VS(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.1.2:8080"),
		modeltest.VS(model.KindExternalIP, "172.20.0.5:81", "rr", "10.0.1.2:8081")), 1))
	if _, err := r.Sync(true); !errors.Is(err, errBusy) {
		t.Fatalf("first sync: %v, want the injected error", err)
	}
	r.SetPlan(svcB, created(modeltest.Plan(svcB, modeltest.VS(model.KindExternalIP, "172.20.0.5:80", "rr", "10.0.2.2:8080")), 2))
	st, err := r.Sync(false)
	if !errors.Is(err, errBusy) || !errors.Is(st.Failed[svcA], errBusy) {
		t.Fatalf("sync of b's change: %v (failed %v), want a's failure again", err, st.Failed)
	}
	if sa, _ := r.Status(svcA); sa.Applied || sa.Failures != 2 {
		t.Errorf("status of a: %+v, want still failing (2 attempts)", sa)
	}
}

// TestReconcilerOrphanRetry: a failed delete of a virtual server no
// Service wants is retried after its backoff, even when other changes sync
// in between.
func TestReconcilerOrphanRetry(t *testing.T) {
	r, ipvs, links, clk := newClockedReconciler(t)
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	mustSync(t, r, true)
	errBusy := errors.New("injected: busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if c == "DeleteVirtualServer 10.96.0.10:80/TCP" {
			return errBusy
		}
		return nil
	})
	r.SetPlan(svcA, nil)
	if _, err := r.Sync(false); !errors.Is(err, errBusy) {
		t.Fatalf("Sync = %v, want the injected error", err)
	}
	ipvs.InjectErrors(nil)
	// Another Service's change before the retry is due.
	clk.Step(500 * time.Millisecond)
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080")))
	mustSync(t, r, false)
	if next := r.NextRetry(); !next.Equal(clk.Now().Add(500 * time.Millisecond)) {
		t.Fatalf("next retry %v, want in 500ms", next)
	}
	clk.Step(500 * time.Millisecond)
	resetCalls(ipvs, links)
	if st := mustSync(t, r, false); st.Full {
		t.Errorf("the orphan retry was a full sync")
	}
	callsDiff(t, "orphan retry writes", []string{"DeleteVirtualServer 10.96.0.10:80/TCP"}, ipvs.Writes())
	callsDiff(t, "orphan retry link writes", []string{"DeleteAddress ipvs-proxy0 10.96.0.10"}, links.Writes())
	if !r.NextRetry().IsZero() {
		t.Errorf("a retry still waits: %v", r.NextRetry())
	}
}

// TestReconcilerAdoptsKubeProxy: taking over from kube-proxy, the virtual
// servers on kube-ipvs0's addresses are owned: the wanted one is kept as
// it is (only its address is bound to our interface too), the unwanted one
// deleted; a virtual server of another tool stays.
func TestReconcilerAdoptsKubeProxy(t *testing.T) {
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(node)
	own := testOwnership()
	own.Adopt = "kube-ipvs0"
	r := NewReconciler(ipvs, links, Config{Ownership: own}, zap.NewNop())
	// kube-proxy's state: two VIPs on kube-ipvs0, each with a virtual server.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(links.EnsureDummy("kube-ipvs0"))
	for _, vip := range []string{"10.96.0.10", "10.96.0.99"} {
		must(links.AddAddress("kube-ipvs0", netip.MustParseAddr(vip)))
		k := ktypestest.VSKey(vip+":80", ktypes.TCP)
		must(ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: k, Scheduler: "rr"}))
		must(ipvs.AddRealServer(k, ktypes.RealServer{RSKey: ktypes.RSKey{Address: netip.MustParseAddr("10.0.1.2"), Port: 8080}, Weight: 1}))
	}
	must(ipvs.AddVirtualServer(ktypes.VirtualServer{VSKey: ktypestest.VSKey("172.16.0.1:80", ktypes.TCP), Scheduler: "wlc"}))
	resetCalls(ipvs, links)

	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	mustSync(t, r, false)
	callsDiff(t, "ipvs writes of the takeover", []string{"DeleteVirtualServer 10.96.0.99:80/TCP"}, ipvs.Writes())
	callsDiff(t, "link writes of the takeover", []string{"EnsureDummy ipvs-proxy0", "AddAddress ipvs-proxy0 10.96.0.10"}, links.Writes())
	if diff := cmp.Diff([]string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "172.16.0.1:80/TCP wlc"}, ipvs.Dump()); diff != "" {
		t.Errorf("kernel (-want +got):\n%s", diff)
	}
}

// A periodic full resync runs in slices of ResyncSlice virtual servers,
// one per sync, and a change that comes meanwhile is applied by the next
// sync, with the next slice, not after the whole resync.
func TestReconcilerSlicedResync(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), ResyncSlice: 2}, zap.NewNop())
	names := make([]types.NamespacedName, 5)
	for i := range names {
		names[i] = types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i+1)}
		r.SetPlan(names[i], modeltest.Plan(names[i], modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.0.%d:80", i+1), "rr", fmt.Sprintf("10.0.1.%d:8080", i+1))))
	}
	if st := mustSync(t, r, true); !st.Full || st.ResyncLeft != 0 || r.Resyncing() {
		t.Fatalf("the first sync is full and whole: %+v", st)
	}

	// Drift by hand in the first, second and last slices.
	rs := func(a string) ktypes.RSKey { return ktypes.RSKey{Address: netip.MustParseAddr(a), Port: 8080} }
	for _, err := range []error{
		ipvs.DeleteRealServer(ktypestest.VSKey("10.96.0.1:80", ktypes.TCP), rs("10.0.1.1")),
		ipvs.UpdateRealServer(ktypestest.VSKey("10.96.0.3:80", ktypes.TCP), ktypes.RealServer{RSKey: rs("10.0.1.3"), Weight: 7}),
		ipvs.DeleteRealServer(ktypestest.VSKey("10.96.0.5:80", ktypes.TCP), rs("10.0.1.5")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	resetCalls(ipvs, links)

	step := func(what string, full bool, left int, writes, reads []string) SyncStats {
		t.Helper()
		wasResyncing := r.Resyncing() || full
		st := mustSync(t, r, full)
		if st.ResyncLeft != left || r.Resyncing() != (left > 0) || st.ResyncDone != (wasResyncing && left == 0) {
			t.Errorf("%s: resync left %d (done %v, resyncing %v), want %d", what, st.ResyncLeft, st.ResyncDone, r.Resyncing(), left)
		}
		callsDiff(t, what+": writes", writes, ipvs.Writes())
		callsDiff(t, what+": reads", reads, ipvs.Reads())
		resetCalls(ipvs, links)
		return st
	}
	// The resync reads the virtual servers and every real server whole,
	// then checks the first slice.
	if st := step("resync, slice 1", true, 3, []string{"AddRealServer 10.96.0.1:80/TCP 10.0.1.1:8080 w=1"},
		[]string{"ListVirtualServers", "ListAllRealServers"}); !st.Full {
		t.Error("the resync's first sync is not reported full")
	}
	// A change to a Service of the last slice comes: the next sync applies
	// it alone (changes first), the one after takes the second slice.
	r.SetPlan(names[4], modeltest.Plan(names[4], modeltest.VS(model.KindClusterIP, "10.96.0.5:80", "rr", "10.0.1.5:8080", "10.0.2.5:8080")))
	step("change first", false, 3, []string{
		"AddRealServer 10.96.0.5:80/TCP 10.0.1.5:8080 w=1",
		"AddRealServer 10.96.0.5:80/TCP 10.0.2.5:8080 w=1",
	}, nil) // from the resync's read: nothing wrote them since
	step("slice 2", false, 1, []string{"UpdateRealServer 10.96.0.3:80/TCP 10.0.1.3:8080 w=1"}, nil)
	// A full sync asked for meanwhile continues the resync (no new read of
	// the virtual servers); the last slice reads again what the change
	// wrote, and finds it applied.
	if st := step("slice 3", true, 0, nil, []string{"ListRealServers 10.96.0.5:80/TCP"}); st.ResyncTook < 0 {
		t.Error("negative resync duration")
	}
	step("after the resync", false, 0, nil, nil)
	for i, n := range names {
		if st, _ := r.Status(n); !st.Applied {
			t.Errorf("service %d not applied: %+v", i+1, st)
		}
	}
}

// TestReconcilerResyncYieldsToChanges: while a sliced resync runs, a sync
// with a change in it takes no slice (the change is applied alone), but
// never two in a row, so that the resync ends under a change at every
// sync; an address unbound by hand is bound again by the slice that
// reaches it, not by the sync that starts the resync (read in the loop,
// here: a read off the loop lists what the loop claims and the read
// lacks, and that sync repairs them, as they are few).
func TestReconcilerResyncYieldsToChanges(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), ResyncSlice: 2}, zap.NewNop())
	names := make([]types.NamespacedName, 6)
	plan := func(i int, eps ...string) *model.ServicePlan {
		return modeltest.Plan(names[i], modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.0.%d:80", i+1), "rr", eps...))
	}
	for i := range names {
		names[i] = types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i+1)}
		r.SetPlan(names[i], plan(i, fmt.Sprintf("10.0.1.%d:8080", i+1)))
	}
	mustSync(t, r, true)
	if err := links.DeleteAddress(testIface, netip.MustParseAddr("10.96.0.6")); err != nil {
		t.Fatal(err)
	}
	resetCalls(ipvs, links)
	if st := mustSync(t, r, true); st.ResyncLeft != 4 || len(links.Writes()) != 0 {
		t.Fatalf("adopting the read: left %d, address writes %q; want 4 left and none (the address waits for its slice)",
			st.ResyncLeft, links.Writes())
	}
	var lefts []int
	for i := 0; r.Resyncing(); i++ {
		if i > 10 {
			t.Fatal("the resync does not end under changes")
		}
		r.SetPlan(names[0], plan(0, fmt.Sprintf("10.0.2.%d:8080", i)))
		lefts = append(lefts, mustSync(t, r, false).ResyncLeft)
	}
	if want := []int{4, 2, 2, 0}; !slices.Equal(lefts, want) {
		t.Errorf("virtual servers left after each sync with a change: %v, want %v (a slice every other sync)", lefts, want)
	}
	callsDiff(t, "address writes", []string{"AddAddress " + testIface + " 10.96.0.6"}, links.Writes())
}

// TestReconcilerResyncReadOffLoop: the periodic resync's read made off the
// loop (StartResyncRead, its read run) is adopted by the next full sync with the loop's
// own view of what it wrote since the read began: drift from before the
// read is repaired, what the loop wrote meanwhile is neither written again
// nor judged by the older read (the loop's real servers, as its writes
// left them, instead of the read's; TestAdoptionReadsAloneWhatItCannotKeep
// has the exceptions). A read older than an
// in-loop read, or one that failed, is not adopted: the sync reads itself.
func TestReconcilerResyncReadOffLoop(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
	if _, ok := r.StartResyncRead(); ok {
		t.Fatal("a read off the loop began without a resync reader")
	}
	r.SetResyncReader(ipvs, links) // the same kernel, as a second handle sees it
	svcC := types.NamespacedName{Namespace: "default", Name: "c"}
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.1:80", "rr", "10.0.1.1:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.2:80", "rr", "10.0.1.2:8080")))
	if _, ok := r.StartResyncRead(); ok {
		t.Fatal("a read off the loop began before the first full sync")
	}
	mustSync(t, r, true)

	// Drift by hand, then the read, then changes written by the loop.
	if err := ipvs.DeleteRealServer(ktypestest.VSKey("10.96.0.1:80", ktypes.TCP), ktypes.RSKey{Address: netip.MustParseAddr("10.0.1.1"), Port: 8080}); err != nil {
		t.Fatal(err)
	}
	run, ok := r.StartResyncRead()
	if !ok {
		t.Fatal("no read off the loop")
	}
	if _, again := r.StartResyncRead(); again {
		t.Error("a second read off the loop began while one runs")
	}
	run()
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.2:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(svcC, modeltest.Plan(svcC, modeltest.VS(model.KindClusterIP, "10.96.0.3:80", "rr", "10.0.1.3:8080")))
	st := mustSync(t, r, false)
	if st.Writes != 4 {
		t.Fatalf("the changes made %d writes, want 4", st.Writes)
	}
	resetCalls(ipvs, links)
	st = mustSync(t, r, true)
	callsDiff(t, "adopted resync: IPVS writes", []string{"AddRealServer 10.96.0.1:80/TCP 10.0.1.1:8080 w=1"}, ipvs.Writes())
	// What the loop wrote since the read began keeps the loop's view,
	// its real servers too: nothing is read again.
	callsDiff(t, "adopted resync: IPVS reads", nil, ipvs.Reads())
	callsDiff(t, "adopted resync: address writes", nil, links.Writes())
	if !st.Full || st.Read != 0 || len(st.Failed) != 0 {
		t.Errorf("adopted resync's stats: %+v", st)
	}

	// A read older than a full read in the loop (the interface was
	// removed meanwhile) is dropped.
	run, ok = r.StartResyncRead()
	if !ok {
		t.Fatal("no second read off the loop")
	}
	run()
	r.RequestFull()
	mustSync(t, r, false)
	resetCalls(ipvs, links)
	mustSync(t, r, true)
	callsDiff(t, "after a stale read: IPVS reads", []string{"ListVirtualServers", "ListAllRealServers"}, ipvs.Reads())

	// A failed read off the loop: the resync reads in the loop.
	run, ok = r.StartResyncRead()
	if !ok {
		t.Fatal("no third read off the loop")
	}
	var once sync.Once
	ipvs.InjectErrors(func(c fake.Call) error {
		var err error
		if c == "ListAllRealServers" {
			once.Do(func() { err = errors.New("injected") })
		}
		return err
	})
	run()
	resetCalls(ipvs, links)
	mustSync(t, r, true)
	callsDiff(t, "after a failed read: IPVS reads", []string{"ListVirtualServers", "ListAllRealServers"}, ipvs.Reads())
	callsDiff(t, "after a failed read: IPVS writes", nil, ipvs.Writes())
	for _, n := range []types.NamespacedName{svcA, svcB, svcC} {
		if s, _ := r.Status(n); !s.Applied {
			t.Errorf("%s not applied: %+v", n, s)
		}
	}
}

// TestReconcilerTimesBinding: a sync's Bind is the time its address
// writes took, apart from its IPVS writes (the sync log's "bind").
func TestReconcilerTimesBinding(t *testing.T) {
	r, ipvs, links, clk := newClockedReconciler(t)
	mustSync(t, r, true)
	links.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddAddress") {
			clk.Step(3 * time.Millisecond)
		}
		return nil
	})
	ipvs.InjectErrors(func(fake.Call) error {
		clk.Step(time.Millisecond)
		return nil
	})
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.11:80", "rr", "10.0.1.3:8080")))
	st, err := r.Sync(false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bind != 6*time.Millisecond || st.Duration <= st.Bind {
		t.Errorf("bind %v of %v, want 6ms for two addresses and more in all", st.Bind, st.Duration)
	}
}

// routedPlan is modeltest.Plan with its clusterIP virtual servers marked
// Routed, as Build marks those inside BuildConfig.ServiceRanges.
func routedPlan(name types.NamespacedName, vss ...model.VSPlan) *model.ServicePlan {
	p := modeltest.Plan(name, vss...)
	for i := range p.VirtualServers {
		p.VirtualServers[i].Routed = p.VirtualServers[i].Kind == model.KindClusterIP
	}
	return p
}

// TestReconcilerRangeOutlivesTheLastAddress: Linux removes the routes
// through an interface with its last IPv4 address (the fake does too).
// With the range's anchor bound beside the route, deleting the Service of
// the last externalIP unbinds it and leaves the range routed; an anchor
// removed by hand is bound again, and the route that went with it (the
// interface's last IPv4 address) is added again, at the next sync.
func TestReconcilerRangeOutlivesTheLastAddress(t *testing.T) {
	rng := netip.MustParsePrefix("10.96.0.0/16")
	anchor := netip.MustParseAddr("10.96.0.0")
	r, _, links := newTestReconciler(t)
	r.SetRoutes([]netip.Prefix{rng})
	r.SetPlan(svcA, routedPlan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	r.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindExternalIP, "10.251.0.10:80", "rr", "10.0.1.3:8080")))
	mustSync(t, r, false)
	if got := links.Addresses(testIface); !slices.Equal(got, []netip.Addr{anchor, netip.MustParseAddr("10.251.0.10")}) {
		t.Errorf("addresses bound: %v, want the anchor and the externalIP", got)
	}
	routes := func() []netip.Prefix {
		var out []netip.Prefix
		for _, lr := range links.Routes(testIface) {
			out = append(out, lr.Prefix)
		}
		return out
	}
	r.SetPlan(svcB, nil)
	mustSync(t, r, false)
	if got := links.Addresses(testIface); !slices.Equal(got, []netip.Addr{anchor}) {
		t.Errorf("addresses bound after the externalIP's Service went: %v, want the anchor alone", got)
	}
	if got := routes(); !slices.Equal(got, []netip.Prefix{rng}) {
		t.Errorf("routes after the last externalIP went: %v, want %s", got, rng)
	}

	// By hand: the last IPv4 address goes, and the route with it.
	if err := links.DeleteAddress(testIface, anchor); err != nil {
		t.Fatal(err)
	}
	if got := routes(); len(got) != 0 {
		t.Fatalf("the fake kept %v after the link's last IPv4 address went; the kernel does not", got)
	}
	if n := r.AddressesRemoved([]netip.Addr{anchor}); n != 1 {
		t.Errorf("AddressesRemoved took %d addresses, want 1", n)
	}
	if !r.Pending() || !r.FullDue() {
		t.Errorf("the anchor's removal made no full sync due (pending %v, full due %v)", r.Pending(), r.FullDue())
	}
	mustSync(t, r, false)
	if got := routes(); !slices.Equal(got, []netip.Prefix{rng}) {
		t.Errorf("routes after the sync: %v, want %s again", got, rng)
	}
	if got := links.Addresses(testIface); !slices.Equal(got, []netip.Addr{anchor}) {
		t.Errorf("addresses after the sync: %v, want the anchor again", got)
	}
}

// TestReconcilerRoutes: with a Service range routed, a clusterIP inside
// it is programmed without being bound; moving a node from one address
// per clusterIP to the range and back keeps the virtual servers (no
// delete, no add) and never leaves one unowned; a failed route keeps the
// clusterIPs in it out of IPVS and is retried by the next full sync.
func TestReconcilerRoutes(t *testing.T) {
	rng := netip.MustParsePrefix("10.96.0.0/16")
	anchor := netip.MustParseAddr("10.96.0.0")
	vs := modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")

	t.Run("cold", func(t *testing.T) {
		r, ipvs, links := newTestReconciler(t)
		r.SetRoutes([]netip.Prefix{rng})
		r.SetPlan(svcA, routedPlan(svcA, vs))
		mustSync(t, r, false)
		callsDiff(t, "link writes", []string{"EnsureDummy ipvs-proxy0", "AddLocalRoute ipvs-proxy0 10.96.0.0/16",
			"AddAddress ipvs-proxy0 10.96.0.0"}, links.Writes())
		callsDiff(t, "ipvs writes", []string{"AddVirtualServer 10.96.0.10:80/TCP rr", "AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1"}, ipvs.Writes())
		// A restart reads the route back and owns what is in it.
		r2 := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
		r2.SetRoutes([]netip.Prefix{rng})
		resetCalls(ipvs, links)
		mustSync(t, r2, false) // no plans yet: the virtual server is owned through the route, and deleted
		callsDiff(t, "ipvs writes after a restart without the Service", []string{"DeleteVirtualServer 10.96.0.10:80/TCP"}, ipvs.Writes())
		callsDiff(t, "link writes after it (the route is still wanted)", nil, links.Writes())
	})

	t.Run("from addresses to the range and back", func(t *testing.T) {
		r, ipvs, links := newTestReconciler(t)
		r.SetPlan(svcA, modeltest.Plan(svcA, vs))
		mustSync(t, r, false)
		resetCalls(ipvs, links)

		r.SetRoutes([]netip.Prefix{rng})
		r.SetPlan(svcA, routedPlan(svcA, vs))
		if st := mustSync(t, r, false); !st.Full {
			t.Errorf("the sync after SetRoutes was not full")
		}
		// The anchor is bound before the last clusterIP goes, so that
		// the route outlives it.
		callsDiff(t, "link writes, to the range", []string{"AddLocalRoute ipvs-proxy0 10.96.0.0/16", "AddAddress ipvs-proxy0 10.96.0.0",
			"DeleteAddress ipvs-proxy0 10.96.0.10"}, links.Writes())
		callsDiff(t, "ipvs writes, to the range", nil, ipvs.Writes())
		if got := links.Addresses(testIface); !slices.Equal(got, []netip.Addr{anchor}) {
			t.Errorf("addresses bound: %v, want the anchor %s alone", got, anchor)
		}
		if got := links.Routes(testIface); len(got) != 1 {
			t.Errorf("routes: %v, want %s", got, rng)
		}
		resetCalls(ipvs, links)

		r.SetRoutes(nil)
		r.SetPlan(svcA, modeltest.Plan(svcA, vs))
		mustSync(t, r, false)
		callsDiff(t, "link writes, back", []string{"AddAddress ipvs-proxy0 10.96.0.10", "DeleteAddress ipvs-proxy0 10.96.0.0",
			"DeleteLocalRoute ipvs-proxy0 10.96.0.0/16"}, links.Writes())
		callsDiff(t, "ipvs writes, back", nil, ipvs.Writes())
	})

	// A virtual server in the range on an address configured elsewhere is
	// not the agent's: kube-proxy's on kube-ipvs0 (no takeover) stays for
	// `cleanup --kube-proxy`, one on a node address is a node port or
	// nobody's; one on an address configured nowhere is the agent's.
	t.Run("kube-proxy's and the node's addresses in the range", func(t *testing.T) {
		ipvs, links := fake.NewIPVS(), fake.NewLinks(node, netip.MustParseAddr("10.96.0.40"))
		r := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
		for _, err := range []error{
			links.EnsureDummy(netlinkutil.KubeProxyInterface),
			links.AddAddress(netlinkutil.KubeProxyInterface, netip.MustParseAddr("10.96.0.20")),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		r.SetRoutes([]netip.Prefix{rng})
		r.SetPlan(svcA, routedPlan(svcA, vs))
		mustSync(t, r, false)
		for _, v := range []string{"10.96.0.20:443", "10.96.0.40:8443", "10.96.0.30:80"} {
			if err := ipvs.AddVirtualServer(modeltest.VS(model.KindClusterIP, v, "rr").VirtualServer); err != nil {
				t.Fatal(err)
			}
		}
		resetCalls(ipvs, links)
		mustSync(t, r, true) // reads the kernel again
		callsDiff(t, "ipvs writes", []string{"DeleteVirtualServer 10.96.0.30:80/TCP"}, ipvs.Writes())
	})

	t.Run("a failed route", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
		ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
		r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), Clock: clk}, zap.NewNop())
		failing := true
		links.InjectErrors(func(c fake.Call) error {
			if failing && strings.HasPrefix(string(c), "AddLocalRoute") {
				return errors.New("no route for you")
			}
			return nil
		})
		r.SetRoutes([]netip.Prefix{rng})
		r.SetPlan(svcA, routedPlan(svcA, vs))
		st, err := r.Sync(false)
		if err == nil || !strings.Contains(err.Error(), "no route for you") || st.Failed[svcA] == nil {
			t.Fatalf("Sync = %v, failed %v; want the route's error, and default/a failed", err, st.Failed)
		}
		callsDiff(t, "ipvs writes with the route failed", nil, ipvs.Writes())
		if !r.FullDue() && r.NextRetry().IsZero() {
			t.Errorf("no full sync due or scheduled after the route failed")
		}
		failing = false
		resetCalls(ipvs, links)
		for i := 0; i < 3 && len(ipvs.Writes()) == 0; i++ {
			clk.Step(time.Minute)
			_, _ = r.Sync(false)
		}
		callsDiff(t, "ipvs writes on the retry", []string{"AddVirtualServer 10.96.0.10:80/TCP rr", "AddRealServer 10.96.0.10:80/TCP 10.0.1.2:8080 w=1"}, ipvs.Writes())
		if got := links.Routes(testIface); len(got) != 1 || got[0].Prefix != rng {
			t.Errorf("routes after the retry: %v", got)
		}
	})
}

// TestReconcilerBatchesInChunks: a cold sync of 3,000 virtual servers
// writes them in batches of at most 2,048 (a batch is copied and encoded
// at once), in order, virtual servers before real servers; a write that
// fails in a later batch fails its own Service, not another.
func TestReconcilerBatchesInChunks(t *testing.T) {
	ipvs := fake.NewIPVS()
	r := NewReconciler(ipvs, fake.NewLinks(node), Config{Ownership: testOwnership(), PieceOps: 1 << 20}, zap.NewNop())
	bad := types.NamespacedName{Namespace: "default", Name: "s2900"}
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.11.84:80/TCP ") { // s2900's
			return errors.New("injected")
		}
		return nil
	})
	for i := range 3000 {
		n := types.NamespacedName{Namespace: "default", Name: fmt.Sprint("s", i)}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i / 256), byte(i % 256)})
		r.SetPlan(n, modeltest.Plan(n, modeltest.VS(model.KindClusterIP, vip.String()+":80", "rr", "10.0.1.2:8080")))
	}
	st, err := r.Sync(true)
	if err == nil || len(st.Failed) != 1 || st.Failed[bad] == nil {
		t.Fatalf("failed %v (err %v), want only %s", st.Failed, err, bad)
	}
	if diff := cmp.Diff([]int{2048, 952, 2048, 952}, ipvs.Batches()); diff != "" {
		t.Errorf("batch sizes (-want +got):\n%s", diff)
	}
	dump := strings.Join(ipvs.Dump(), "\n")
	if !strings.Contains(dump, "10.96.11.83:80/TCP rr\n  -> 10.0.1.2:8080 w=1") || strings.Contains(dump, "10.96.11.84:80/TCP rr\n  -> ") {
		t.Errorf("s2899 should be programmed and s2900 without its real server")
	}
}

// TestReconcilerAppliesInPieces: a sync diffs and applies its scope a
// piece at a time (PieceOps), so that only one piece's operations are
// alive at once, and programs exactly what one diff of the whole scope
// does, in an order as safe: the range's route before anything in it,
// each address bound before its virtual servers are added and unbound
// after they are deleted, the route deleted last and within the sync; a
// failed route keeps every later piece from adding in the range.
func TestReconcilerAppliesInPieces(t *testing.T) {
	rng := netip.MustParsePrefix("10.96.0.0/16")
	type bed struct {
		r     *Reconciler
		ipvs  *fake.IPVS
		links *fake.Links
		seq   *[]string // every call of both fakes, in order
	}
	newBed := func(pieceOps int, fail func(fake.Call) error) bed {
		ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
		seq := new([]string)
		hook := func(kind string) fake.ErrorFunc {
			return func(c fake.Call) error {
				*seq = append(*seq, kind+" "+string(c))
				if fail != nil {
					return fail(c)
				}
				return nil
			}
		}
		ipvs.InjectErrors(hook("ipvs"))
		links.InjectErrors(hook("links"))
		r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), PieceOps: pieceOps}, zap.NewNop())
		r.SetRoutes([]netip.Prefix{rng})
		return bed{r, ipvs, links, seq}
	}
	var names []types.NamespacedName
	plans := map[types.NamespacedName]*model.ServicePlan{}
	for i := range 12 { // 12 clusterIPs in the range, 6 externalIPs bound
		n := types.NamespacedName{Namespace: "default", Name: fmt.Sprint("c", i)}
		plans[n] = routedPlan(n, modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.0.%d:80", i+1), "rr",
			"10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"))
		names = append(names, n)
	}
	for i := range 6 {
		n := types.NamespacedName{Namespace: "default", Name: fmt.Sprint("e", i)}
		plans[n] = modeltest.Plan(n, modeltest.VS(model.KindExternalIP, fmt.Sprintf("192.0.2.%d:80", i+1), "rr",
			"10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"),
			modeltest.VS(model.KindExternalIP, fmt.Sprintf("192.0.2.%d:443", i+1), "rr", "10.0.1.1:8443"))
		names = append(names, n)
	}
	// ordered checks that, in seq, every call matching after comes after
	// the calls that before names for it.
	ordered := func(t *testing.T, seq []string, after func(string) bool, before func(string) []string) {
		t.Helper()
		for i, c := range seq {
			if !after(c) {
				continue
			}
			for _, b := range before(c) {
				if !slices.Contains(seq[:i], b) {
					t.Errorf("%q came before %q", c, b)
				}
			}
		}
	}
	addrOf := func(c string) string { // "ipvs AddVirtualServer 192.0.2.1:80/TCP rr" -> 192.0.2.1
		f := strings.Fields(c)
		a, _, _ := strings.Cut(f[2], ":")
		return a
	}

	whole, pieces := newBed(0, nil), newBed(10, nil)
	for _, b := range []bed{whole, pieces} {
		for _, n := range names {
			b.r.SetPlan(n, plans[n])
		}
		mustSync(t, b.r, false)
	}
	if diff := cmp.Diff(whole.ipvs.Dump(), pieces.ipvs.Dump()); diff != "" {
		t.Errorf("IPVS in pieces against whole (-whole +pieces):\n%s", diff)
	}
	if diff := cmp.Diff(whole.links.Addresses(testIface), pieces.links.Addresses(testIface), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
		t.Errorf("addresses in pieces against whole (-whole +pieces):\n%s", diff)
	}
	if diff := cmp.Diff(whole.links.Routes(testIface), pieces.links.Routes(testIface), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
		t.Errorf("routes in pieces against whole (-whole +pieces):\n%s", diff)
	}
	sortedWrites := func(b bed) []string {
		var out []string
		for _, c := range append(b.ipvs.Writes(), b.links.Writes()...) {
			out = append(out, string(c))
		}
		slices.Sort(out)
		return out
	}
	if diff := cmp.Diff(sortedWrites(whole), sortedWrites(pieces)); diff != "" {
		t.Errorf("writes in pieces against whole, sorted (-whole +pieces):\n%s", diff)
	}
	// 12 clusterIPs of 4 operations and 6 externalIPs of 6: cut after
	// every third virtual server or second address, whatever the batch.
	if got := pieces.ipvs.Batches(); len(got) < 10 || slices.Max(got) > 12 {
		t.Errorf("batches in pieces %v, want 10 or more of at most 12 writes", got)
	}
	if got := whole.ipvs.Batches(); len(got) != 2 {
		t.Errorf("batches whole %v, want 2 (the default piece holds the whole sync)", got)
	}
	seq := *pieces.seq
	if i := slices.IndexFunc(seq, func(c string) bool { return strings.Contains(c, "AddLocalRoute") }); i < 0 ||
		slices.ContainsFunc(seq[:i], func(c string) bool { return strings.HasPrefix(c, "ipvs Add") }) {
		t.Errorf("the route came after an IPVS add, or not at all:\n%s", strings.Join(seq, "\n"))
	}
	ordered(t, seq, func(c string) bool { return strings.HasPrefix(c, "ipvs AddVirtualServer 192.0.2.") },
		func(c string) []string { return []string{"links AddAddress ipvs-proxy0 " + addrOf(c)} })

	// Everything goes, the range too.
	for _, b := range []bed{whole, pieces} {
		*b.seq = nil
		resetCalls(b.ipvs, b.links)
		b.r.SetRoutes(nil)
		for _, n := range names {
			b.r.SetPlan(n, nil)
		}
		mustSync(t, b.r, true)
		if d := b.ipvs.Dump(); len(d) != 0 {
			t.Errorf("IPVS after every Service went: %v", d)
		}
		if a, r := b.links.Addresses(testIface), b.links.Routes(testIface); len(a) != 0 || len(r) != 0 {
			t.Errorf("addresses %v and routes %v after every Service and the range went", a, r)
		}
	}
	if diff := cmp.Diff(sortedWrites(whole), sortedWrites(pieces)); diff != "" {
		t.Errorf("removal's writes in pieces against whole, sorted (-whole +pieces):\n%s", diff)
	}
	seq = *pieces.seq
	ordered(t, seq, func(c string) bool { return strings.HasPrefix(c, "links DeleteAddress ipvs-proxy0 192.0.2.") },
		func(c string) []string {
			a := strings.Fields(c)[3]
			return []string{"ipvs DeleteVirtualServer " + a + ":80/TCP", "ipvs DeleteVirtualServer " + a + ":443/TCP"}
		})
	if last := seq[len(seq)-1]; last != "links DeleteLocalRoute ipvs-proxy0 10.96.0.0/16" {
		t.Errorf("last write %q, want the route's delete:\n%s", last, strings.Join(seq, "\n"))
	}

	// The route fails: no piece adds in the range; the externalIPs are
	// programmed.
	failed := newBed(10, func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddLocalRoute") {
			return errors.New("no route for you")
		}
		return nil
	})
	for _, n := range names {
		failed.r.SetPlan(n, plans[n])
	}
	st, err := failed.r.Sync(false)
	if err == nil || len(st.Failed) != 12 {
		t.Errorf("Sync = %v with %d Services failed, want the 12 in the range", err, len(st.Failed))
	}
	for _, c := range failed.ipvs.Writes() {
		if strings.Contains(string(c), " 10.96.") {
			t.Errorf("written with the range's route failed: %s", c)
		}
	}
	if got := failed.ipvs.Dump(); len(got) != 6*2+6*4 { // 12 virtual servers, 24 real servers
		t.Errorf("the externalIPs' virtual and real servers: %d lines, want 36:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// TestReconcilerPiecesKeepTheRangeRoute: a range routed without its anchor
// bound (as a version before the anchors left it), beside an externalIP,
// the interface's last other IPv4 address, whose Service went while the
// agent was down. The sync in pieces unbinds that address in its first
// piece; the anchor must be bound before it, or Linux takes the range's
// route along (the fake does too) and every clusterIP is unreachable.
func TestReconcilerPiecesKeepTheRangeRoute(t *testing.T) {
	rng := netip.MustParsePrefix("10.96.0.0/16")
	ext := netip.MustParseAddr("10.1.0.1") // before the range: in an earlier piece
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	gone := modeltest.VS(model.KindExternalIP, "10.1.0.1:80", "rr")
	for _, err := range []error{
		links.EnsureDummy(testIface),
		links.AddAddress(testIface, ext),
		links.AddLocalRoute(testIface, netlinkutil.LocalRoute{Prefix: rng}),
		ipvs.AddVirtualServer(gone.VirtualServer),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 { // a piece of its own with PieceOps 10
		if err := ipvs.AddRealServer(gone.VSKey, ktypestest.RS(fmt.Sprintf("10.0.2.%d:8080", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), PieceOps: 10}, zap.NewNop())
	r.SetRoutes([]netip.Prefix{rng})
	r.SetPlan(svcA, routedPlan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	resetCalls(ipvs, links)
	mustSync(t, r, false)
	// Two pieces: the delete alone, then the add with its real server (one
	// diff of the whole would have made two batches, not three).
	if got := ipvs.Batches(); len(got) != 3 {
		t.Errorf("IPVS batches %v, want 3: the sync was not in two pieces", got)
	}
	if got := links.Routes(testIface); len(got) != 1 || got[0].Prefix != rng {
		t.Errorf("routes after the sync: %v, want %s kept; link writes:\n%v", got, rng, links.Writes())
	}
	if got, want := links.Addresses(testIface), []netip.Addr{netip.MustParseAddr("10.96.0.0")}; !slices.Equal(got, want) {
		t.Errorf("addresses after the sync: %v, want the anchor alone %v", got, want)
	}
	callsDiff(t, "link writes", []string{"AddAddress ipvs-proxy0 10.96.0.0", "DeleteAddress ipvs-proxy0 10.1.0.1"}, links.Writes())
}

// TestReconcilerExcludedCIDRs: --exclude-cidrs means what it means in
// kube-proxy: what no Service wants there is never cleaned up, and what a
// Service wants there is programmed and kept up to date like any other
// (kube-proxy's virtual server there, taken over, is updated). When that
// Service goes, its virtual server and address stay.
func TestReconcilerExcludedCIDRs(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	if err := links.EnsureDummy(testIface); err != nil {
		t.Fatal(err)
	}
	// Left by someone (kube-proxy before a takeover): one a Service will
	// want, with an old scheduler, and one nobody wants.
	for _, v := range []ktypes.VirtualServer{
		{VSKey: ktypestest.VSKey("10.200.0.1:80", ktypes.TCP), Scheduler: "wlc"},
		{VSKey: ktypestest.VSKey("10.200.0.2:80", ktypes.TCP), Scheduler: "rr"},
	} {
		if err := ipvs.AddVirtualServer(v); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []string{"10.200.0.1", "10.200.0.2"} {
		if err := links.AddAddress(testIface, netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	resetCalls(ipvs, links)
	r.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindExternalIP, "10.200.0.1:80", "rr", "10.0.1.1:8080"),
		modeltest.VS(model.KindExternalIP, "10.200.0.3:80", "rr", "10.0.1.1:8080")))
	mustSync(t, r, true)
	callsDiff(t, "ipvs writes", []string{
		"UpdateVirtualServer 10.200.0.1:80/TCP rr",
		"AddVirtualServer 10.200.0.3:80/TCP rr",
		"AddRealServer 10.200.0.1:80/TCP 10.0.1.1:8080 w=1",
		"AddRealServer 10.200.0.3:80/TCP 10.0.1.1:8080 w=1",
	}, ipvs.Writes())
	callsDiff(t, "link writes", []string{"AddAddress ipvs-proxy0 10.200.0.3"}, links.Writes())

	resetCalls(ipvs, links)
	r.SetPlan(svcA, nil)
	mustSync(t, r, false)
	mustSync(t, r, true)
	callsDiff(t, "ipvs writes after the Service went", nil, ipvs.Writes())
	callsDiff(t, "link writes after the Service went", nil, links.Writes())
}

// TestReconcilerForwardingChange: a plan that changes only how its real
// servers are forwarded (ipvs-proxy.io/forwarding nat -> tunnel -> nat)
// is a change: each step updates the real server in place. (make dsr
// found the switch back to nat never written: the plans compared equal.)
func TestReconcilerForwardingChange(t *testing.T) {
	r, ipvs, _ := newTestReconciler(t)
	plan := func(rs string) *model.ServicePlan {
		return modeltest.Plan(svcA, modeltest.VS(model.KindLoadBalancer, "10.251.0.10:80", "rr", rs))
	}
	r.SetPlan(svcA, plan("10.0.2.2:8080"))
	mustSync(t, r, false)
	for _, step := range []struct{ rs, want string }{
		{"10.0.2.2:8080 tunnel", "UpdateRealServer 10.251.0.10:80/TCP 10.0.2.2:8080 w=1 tunnel"},
		{"10.0.2.2:8080 gue:6080", "UpdateRealServer 10.251.0.10:80/TCP 10.0.2.2:8080 w=1 gue:6080"},
		{"10.0.2.2:8080", "UpdateRealServer 10.251.0.10:80/TCP 10.0.2.2:8080 w=1"},
	} {
		ipvs.ResetCalls()
		r.SetPlan(svcA, plan(step.rs))
		mustSync(t, r, false)
		callsDiff(t, "to "+step.rs, []string{step.want}, ipvs.Writes())
	}
}

// TestReconcilerReserve: sizing the indexes ahead (a cold start's many
// plans) changes nothing a sync does: the Services reserved for are
// programmed, a removal waiting when the last plan is gone is still
// applied, and a reconciler that holds plans keeps them.
func TestReconcilerReserve(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	r.Reserve(1000)
	twoServices(t, r)
	want := ipvs.Dump()
	if len(want) == 0 {
		t.Fatalf("nothing programmed after Reserve")
	}

	// Holding plans: Reserve keeps them (a resync writes nothing).
	resetCalls(ipvs, links)
	r.Reserve(1000)
	mustSync(t, r, true)
	callsDiff(t, "resync writes after Reserve", nil, ipvs.Writes())
	if vss, rss := r.Counts(); vss != 3 || rss != 5 {
		t.Errorf("Counts() = %d, %d after Reserve, want 3, 5", vss, rss)
	}

	// Every plan removed, then Reserve before the sync: the removals
	// still reach the kernel.
	r.SetPlan(svcA, nil)
	r.SetPlan(svcB, nil)
	r.Reserve(1000)
	resetCalls(ipvs, links)
	mustSync(t, r, false)
	if got := ipvs.Dump(); len(got) != 0 {
		t.Errorf("kernel after removing every Service with Reserve between: %v", got)
	}
	if got := links.Addresses(testIface); len(got) != 0 {
		t.Errorf("addresses left on %s: %v", testIface, got)
	}
}

// TestReconcilerChangesBeforeFirstSync: plans set, changed and removed
// before the first sync (which marks nothing dirty: it takes everything)
// leave the kernel as the last plans say, on a node a previous run
// programmed.
func TestReconcilerChangesBeforeFirstSync(t *testing.T) {
	r, ipvs, links := newTestReconciler(t)
	twoServices(t, r)

	r2 := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
	r2.SetPlan(svcA, modeltest.Plan(svcA, modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080")))
	r2.SetPlan(svcA, nil)
	r2.SetPlan(svcB, modeltest.Plan(svcB, modeltest.VS(model.KindClusterIP, "10.96.0.12:53", "lc", "10.0.1.3:53")))
	mustSync(t, r2, false)
	if diff := cmp.Diff([]string{"10.96.0.12:53/TCP lc", "  -> 10.0.1.3:53 w=1"}, ipvs.Dump()); diff != "" {
		t.Errorf("kernel after the first sync (-want +got):\n%s", diff)
	}
	if got, want := fmt.Sprint(links.Addresses(testIface)), "[10.96.0.12]"; got != want {
		t.Errorf("addresses on %s: %s, want %s", testIface, got, want)
	}
}

// TestReconcilerLooksAtWhatChanged: a Service's new plan that keeps some
// of its virtual servers as they were (a node address added or removed:
// its node ports on the other addresses stay) makes a sync look at the
// ones that changed alone: no read of the others' real servers, no write
// for them. A Service that is failing comes whole when it changes, so
// that the sync retries all of it and its status says all of it.
func TestReconcilerLooksAtWhatChanged(t *testing.T) {
	r, ipvs, links, _, _ := newLoggedReconciler(t)
	mustSync(t, r, true)
	clusterIP := modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080")
	onNode := modeltest.VS(model.KindNodePort, "192.168.0.10:30080", "rr", "10.0.1.2:8080", "10.0.2.2:8080")
	onNew := modeltest.VS(model.KindNodePort, "192.168.0.11:30080", "rr", "10.0.1.2:8080", "10.0.2.2:8080")
	r.SetPlan(svcA, modeltest.Plan(svcA, clusterIP, onNode))
	mustSync(t, r, false)

	resetCalls(ipvs, links)
	r.SetPlan(svcA, modeltest.Plan(svcA, clusterIP, onNode, onNew))
	mustSync(t, r, false)
	callsDiff(t, "writes of an added address's node port", []string{
		"AddVirtualServer 192.168.0.11:30080/TCP rr",
		"AddRealServer 192.168.0.11:30080/TCP 10.0.1.2:8080 w=1",
		"AddRealServer 192.168.0.11:30080/TCP 10.0.2.2:8080 w=1",
	}, ipvs.Writes())
	callsDiff(t, "reads of an added address's node port", []string{}, ipvs.Reads())

	resetCalls(ipvs, links)
	r.SetPlan(svcA, modeltest.Plan(svcA, clusterIP, onNew))
	mustSync(t, r, false)
	callsDiff(t, "writes of a removed address's node port", []string{"DeleteVirtualServer 192.168.0.10:30080/TCP"}, ipvs.Writes())
	callsDiff(t, "reads of a removed address's node port", []string{}, ipvs.Reads())
	if sa, _ := r.Status(svcA); !sa.Applied {
		t.Errorf("status after the narrow syncs: %+v, want applied", sa)
	}

	// A failing Service's change takes all of it.
	errBusy := errors.New("injected: device or resource busy")
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.0.10:80/TCP 10.0.3.2") {
			return errBusy
		}
		return nil
	})
	grown := modeltest.VS(model.KindClusterIP, "10.96.0.10:80", "rr", "10.0.1.2:8080", "10.0.2.2:8080", "10.0.3.2:8080")
	r.SetPlan(svcA, modeltest.Plan(svcA, grown, onNew))
	if _, err := r.Sync(false); !errors.Is(err, errBusy) {
		t.Fatalf("sync with the injected failure: %v", err)
	}
	ipvs.InjectErrors(nil)
	resetCalls(ipvs, links)
	r.SetPlan(svcA, modeltest.Plan(svcA, grown, onNode, onNew))
	mustSync(t, r, false)
	callsDiff(t, "reads of a failing Service's change", []string{
		"ListRealServers 10.96.0.10:80/TCP",
		"ListRealServers 192.168.0.11:30080/TCP",
	}, ipvs.Reads())
	callsDiff(t, "writes of a failing Service's change", []string{
		"AddVirtualServer 192.168.0.10:30080/TCP rr",
		"AddRealServer 10.96.0.10:80/TCP 10.0.3.2:8080 w=1",
		"AddRealServer 192.168.0.10:30080/TCP 10.0.1.2:8080 w=1",
		"AddRealServer 192.168.0.10:30080/TCP 10.0.2.2:8080 w=1",
	}, ipvs.Writes())
	if sa, _ := r.Status(svcA); !sa.Applied || sa.Failures != 0 {
		t.Errorf("status after the whole retry: %+v, want applied", sa)
	}
}
