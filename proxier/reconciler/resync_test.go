package reconciler

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
)

// TestAdoptionReadsAloneWhatItCannotKeep: while a resync's read runs off
// the loop, the loop changes four Services. The adoption takes the real
// servers the loop's writes left where it can (a: one replaced, one
// added; its next sync finds nothing to write, so the kept list was the
// kernel's) and reads alone the rest: an ordered scheduler's table (b,
// mh), a virtual server whose write failed (c: its missing real server
// is written then), and one with a real server draining (d: its counts
// decide).
func TestAdoptionReadsAloneWhatItCannotKeep(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
	r.SetResyncReader(ipvs, links)
	name := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "default", Name: n} }
	a, b, c, d := name("a"), name("b"), name("c"), name("d")
	r.SetPlan(a, modeltest.Plan(a, modeltest.VS(model.KindClusterIP, "10.96.0.1:80", "rr", "10.0.1.1:8080", "10.0.1.11:8080")))
	r.SetPlan(b, modeltest.Plan(b, modeltest.VS(model.KindClusterIP, "10.96.0.2:80", "mh", "10.0.1.2:8080")))
	r.SetPlan(c, modeltest.Plan(c, modeltest.VS(model.KindClusterIP, "10.96.0.3:80", "rr", "10.0.1.3:8080")))
	r.SetPlan(d, modeltest.Plan(d, modeltest.VS(model.KindClusterIP, "10.96.0.4:80", "rr", "10.0.1.4:8080", "10.0.1.14:8080")))
	mustSync(t, r, true)
	busy := ktypes.RSKey{Address: netip.MustParseAddr("10.0.1.14"), Port: 8080}
	if err := ipvs.SetConns(ktypestest.VSKey("10.96.0.4:80", ktypes.TCP), busy, 1, 0); err != nil {
		t.Fatal(err)
	}

	run, ok := r.StartResyncRead()
	if !ok {
		t.Fatal("no read off the loop")
	}
	run()
	r.SetPlan(a, modeltest.Plan(a, modeltest.VS(model.KindClusterIP, "10.96.0.1:80", "rr", "10.0.2.1:8080", "10.0.1.11:8080", "10.0.3.1:8080")))
	r.SetPlan(b, modeltest.Plan(b, modeltest.VS(model.KindClusterIP, "10.96.0.2:80", "mh", "10.0.1.2:8080", "10.0.2.2:8080")))
	r.SetPlan(c, modeltest.Plan(c, modeltest.VS(model.KindClusterIP, "10.96.0.3:80", "rr", "10.0.1.3:8080", "10.0.2.3:8080")))
	dPlan := modeltest.Plan(d, modeltest.VS(model.KindClusterIP, "10.96.0.4:80", "rr", "10.0.1.4:8080", "10.0.1.14:8080"))
	dPlan.VirtualServers[0].RealServers[1].Drain = true
	dPlan.VirtualServers[0].RealServers[1].Weight = 0
	r.SetPlan(d, dPlan)
	ipvs.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "AddRealServer 10.96.0.3:80/TCP") {
			return errors.New("injected: device or resource busy")
		}
		return nil
	})
	if st, _ := r.Sync(false); st.Failed[c] == nil || len(st.Failed) != 1 {
		t.Fatalf("the loop's changes: failed %v, want c's write only", st.Failed)
	}
	ipvs.InjectErrors(nil)

	resetCalls(ipvs, links)
	st := mustSync(t, r, true)
	if st.ReadOffLoop == 0 && st.Reads == 0 {
		t.Fatalf("the sync did not adopt the read: %+v", st)
	}
	callsDiff(t, "adoption: IPVS reads", []string{
		"ListRealServers 10.96.0.2:80/TCP", "ListRealServers 10.96.0.3:80/TCP", "ListRealServers 10.96.0.4:80/TCP",
	}, ipvs.Reads())
	callsDiff(t, "adoption: IPVS writes", []string{"AddRealServer 10.96.0.3:80/TCP 10.0.2.3:8080 w=1"}, ipvs.Writes())
}

// TestReplay: the real servers a sync's writes leave, from those it read:
// an update keeps the connection counts read, a delete drops, an add
// comes with the kernel's fields only, and an added virtual server
// starts from none.
func TestReplay(t *testing.T) {
	rs := func(s string, active int32) ktypes.RealServer {
		r := ktypestest.RS(s)
		r.ActiveConns = active
		return r
	}
	vs := ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.96.0.1:80", ktypes.TCP)}
	op := func(kind ktypes.OpKind, r ktypes.RealServer) ktypes.Op {
		return ktypes.Op{Kind: kind, VirtualServer: vs, RealServer: r}
	}
	drain := ktypestest.RS("10.0.0.3:80@1")
	drain.Drain = true
	before := []ktypes.RealServer{rs("10.0.0.1:80@1", 4), rs("10.0.0.2:80@1", 0)}
	for _, tc := range []struct {
		name string
		ops  []ktypes.Op
		want []ktypes.RealServer
	}{
		{"none", nil, before},
		{"update, delete, add", []ktypes.Op{op(ktypes.OpUpdateRealServer, ktypestest.RS("10.0.0.1:80@0")),
			op(ktypes.OpDeleteRealServer, ktypestest.RS("10.0.0.2:80@1")), op(ktypes.OpAddRealServer, drain)},
			[]ktypes.RealServer{rs("10.0.0.1:80@0", 4), ktypestest.RS("10.0.0.3:80@1")}},
		{"virtual server added again", []ktypes.Op{{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs},
			op(ktypes.OpAddRealServer, ktypestest.RS("10.0.0.4:80@1"))}, []ktypes.RealServer{ktypestest.RS("10.0.0.4:80@1")}},
	} {
		got := replay(before, tc.ops)
		slices.SortFunc(got, func(a, b ktypes.RealServer) int { return a.RSKey.Compare(b.RSKey) })
		if diff := cmp.Diff(tc.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	if before[0].Weight != 1 || len(before) != 2 {
		t.Errorf("replay changed what was read: %v", before)
	}
}
