package faults_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy/faults"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// TestReconcilerConvergesUnderInjectedFaults: with 10% and 50% of IPVS and
// address writes failing (faults' injector over the fakes, as a test build
// wraps the kernel), 200 Services are created, then a third changes its
// real servers and a third is deleted: every Service reaches its exact
// state, nothing deleted is left (virtual server or address), each failed
// Service waits for its retry, whose delay doubles per failure in a row up
// to the maximum, and the failures are the injector's.
func TestReconcilerConvergesUnderInjectedFaults(t *testing.T) {
	for _, rate := range []float64{0.1, 0.5} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			in, err := faults.New(rate, 11)
			if err != nil {
				t.Fatal(err)
			}
			ipvs, links := fake.NewIPVS(), fake.NewLinks(nodeAddr)
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
			const base, maxDelay = time.Second, 8 * time.Second
			cfg := reconciler.Config{Ownership: ownership(), RetryBase: base, RetryMax: maxDelay, Clock: clk}
			r := reconciler.NewReconciler(in.WrapIPVS(ipvs), in.WrapLinks(links), cfg, zap.NewNop())

			const n = 200
			name := func(i int) types.NamespacedName {
				return types.NamespacedName{Namespace: "chaos", Name: fmt.Sprint("s", i)}
			}
			vip := func(i int) string { return fmt.Sprintf("10.96.%d.%d", i/200, i%200+1) }
			want := map[types.NamespacedName]*model.ServicePlan{}
			set := func(i int, rss ...string) {
				var p *model.ServicePlan
				if len(rss) > 0 {
					p = modeltest.Plan(name(i), modeltest.VS(model.KindClusterIP, vip(i)+":80", "rr", rss...))
				}
				if p == nil {
					delete(want, name(i))
				} else {
					want[name(i)] = p
				}
				r.SetPlan(name(i), p)
			}
			for i := range n {
				set(i, fmt.Sprintf("10.100.%d.%d:8080", i/200, i%200+1), fmt.Sprintf("10.101.%d.%d:8080", i/200, i%200+1))
			}
			converge := func(what string) {
				t.Helper()
				failures := map[types.NamespacedName]int{}
				for round := 0; ; round++ {
					if round > 300 {
						t.Fatalf("%s: not converged after 300 syncs; failing: %v", what, r.Problems())
					}
					due := map[types.NamespacedName]bool{}
					for _, s := range r.Problems() {
						if !clk.Now().Before(s.NextRetry) {
							due[s.Service] = true
						}
					}
					st, _ := r.Sync(false)
					// A failed Service is tried again only when its retry is due.
					if round > 0 {
						for _, s := range append(slices.Clone(st.Applied), keys(st.Failed)...) {
							if failures[s] > 0 && !due[s] {
								t.Errorf("%s: %s tried again before its retry was due", what, s)
							}
						}
					}
					for _, s := range r.Problems() {
						if s.Failures == 0 {
							continue
						}
						if s.Failures != failures[s.Service]+1 {
							t.Errorf("%s: %s has %d failures in a row after %d", what, s.Service, s.Failures, failures[s.Service])
						}
						delay := min(base<<(s.Failures-1), maxDelay)
						if got := s.NextRetry.Sub(clk.Now()); got != delay {
							t.Errorf("%s: %s failed %d times in a row: retry in %v, want %v", what, s.Service, s.Failures, got, delay)
						}
					}
					failures = map[types.NamespacedName]int{}
					for _, s := range r.Problems() {
						failures[s.Service] = s.Failures
					}
					next := r.NextRetry()
					if next.IsZero() && !r.Pending() {
						break
					}
					if !next.IsZero() {
						clk.SetTime(next)
					}
				}
				var wantDump []string
				var wantAddrs []netip.Addr
				plans := make([]*model.ServicePlan, 0, len(want))
				for _, p := range want {
					plans = append(plans, p)
				}
				slices.SortFunc(plans, func(a, b *model.ServicePlan) int {
					return a.VirtualServers[0].VSKey.Compare(b.VirtualServers[0].VSKey)
				})
				for _, p := range plans {
					v := p.VirtualServers[0]
					wantDump = append(wantDump, v.VirtualServer.String())
					for _, rs := range v.RealServers {
						wantDump = append(wantDump, fmt.Sprintf("  -> %s w=%d", rs.RSKey, rs.Weight))
					}
					wantAddrs = append(wantAddrs, v.Address)
				}
				if diff := cmp.Diff(wantDump, ipvs.Dump()); diff != "" {
					t.Errorf("%s: IPVS table (-want +got):\n%s", what, diff)
				}
				if diff := cmp.Diff(wantAddrs, links.Addresses(dummy), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
					t.Errorf("%s: addresses (-want +got):\n%s", what, diff)
				}
			}
			_, _ = r.Sync(true) // the first full sync: its reads pass, it writes nothing yet
			converge("create")
			for i := range n {
				switch i % 3 {
				case 0:
					set(i, fmt.Sprintf("10.102.%d.%d:8080", i/200, i%200+1))
				case 1:
					set(i)
				}
			}
			converge("change and delete")
			// The agent restarts, and another third of the Services went
			// while it was down: its first full sync finds their virtual
			// servers and addresses as orphans, deleted under the same
			// faults, and nothing of them may be left.
			r = reconciler.NewReconciler(in.WrapIPVS(ipvs), in.WrapLinks(links), cfg, zap.NewNop())
			for i := range n {
				if i%3 == 2 {
					delete(want, name(i))
				} else if p := want[name(i)]; p != nil {
					r.SetPlan(name(i), p)
				}
			}
			_, _ = r.Sync(true)
			converge("restart with orphans")
			c := in.Counts()
			if c[faults.IPVS].Failed == 0 || c[faults.Address].Failed == 0 {
				t.Errorf("no failure injected: %s", in)
			}
			t.Logf("rate %v: injected %s", rate, in)
		})
	}
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// dummy is the fake node's interface for addresses; nodeAddr its address.
const dummy = "ipvs-proxy0"

var nodeAddr = netip.MustParseAddr("192.168.0.10")

// ownership is the rule of the fake node: its dummy interface, the node
// port range, and a range ipvs-proxy never touches.
func ownership() model.Ownership {
	return model.Ownership{Interface: dummy, NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}}
}
