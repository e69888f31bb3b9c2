package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
)

// listOrder is the kernel's list of a virtual server, head first, as a
// dump gives it.
func listOrder(t *testing.T, ipvs *fake.IPVS, vs string, proto ktypes.Protocol) []string {
	t.Helper()
	rss, err := ipvs.ListRealServers(ktypestest.VSKey(vs, proto))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, rs := range rss {
		out = append(out, fmt.Sprintf("%s w=%d", rs.RSKey, rs.Weight))
	}
	return out
}

// TestOrderedSchedulersAgreeAcrossNodes: two nodes reach one Service's
// endpoints through different histories (one programs them at once;
// the other saw them come one by one in another order, lose one, and its
// agent restart). Their sh lists end in the same order, so their tables
// map every client alike; the second node's UDP flows are not cleared by
// the moves. Before, the lists were in each node's order of adds.
func TestOrderedSchedulersAgreeAcrossNodes(t *testing.T) {
	plan := func(proto ktypes.Protocol, rss ...string) *model.ServicePlan {
		p := modeltest.VS(model.KindClusterIP, "10.96.0.10:53", "sh", rss...)
		p.Protocol = proto
		return modeltest.Plan(svcA, p)
	}
	all := []string{"10.0.1.2:53", "10.0.2.2:53", "10.0.3.2:53", "10.0.4.2:53"}
	for _, proto := range []ktypes.Protocol{ktypes.TCP, ktypes.UDP} {
		t.Run(proto.String(), func(t *testing.T) {
			a, ipvsA, _ := newTestReconciler(t)
			a.SetPlan(svcA, plan(proto, all...))
			mustSync(t, a, false)

			b, ipvsB, linksB := newTestReconciler(t)
			ct := &fake.Conntrack{}
			b.SetConntrack(ct)
			for _, set := range [][]string{
				{"10.0.3.2:53"}, {"10.0.2.2:53", "10.0.3.2:53"}, {"10.0.2.2:53", "10.0.3.2:53", "10.0.4.2:53"},
				{"10.0.3.2:53", "10.0.4.2:53"}, all,
			} {
				b.SetPlan(svcA, plan(proto, set...))
				mustSync(t, b, false)
			}
			// The agent restarts: a new reconciler reads the kernel.
			b2 := NewReconciler(ipvsB, linksB, Config{Ownership: testOwnership()}, b.log)
			b2.SetPlan(svcA, plan(proto, all...))
			ipvsB.ResetCalls()
			mustSync(t, b2, true)
			if w := ipvsB.Writes(); len(w) != 0 {
				t.Errorf("a restart in canonical order wrote %v", w)
			}

			want := []string{"10.0.1.2:53 w=1", "10.0.2.2:53 w=1", "10.0.3.2:53 w=1", "10.0.4.2:53 w=1"}
			if diff := cmp.Diff(want, listOrder(t, ipvsA, "10.96.0.10:53", proto)); diff != "" {
				t.Errorf("node A's list (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, listOrder(t, ipvsB, "10.96.0.10:53", proto)); diff != "" {
				t.Errorf("node B's list (-want +got):\n%s", diff)
			}
			// 10.0.2.2 left once (cleared), and was moved twice (kept).
			var wantCT []string
			if proto == ktypes.UDP {
				wantCT = []string{"ClearUDP 10.96.0.10:53/UDP 10.0.2.2:53"}
			}
			callsDiff(t, "conntrack calls", wantCT, ct.Calls())
		})
	}
}

// TestChunksKeepMovesWhole: a batch never ends between two writes of a
// virtual server whose real servers move; other virtual servers' writes
// are cut at applyChunk.
func TestChunksKeepMovesWhole(t *testing.T) {
	ops := make([]ktypes.Op, applyChunk+4)
	for i := range ops {
		vs := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: ktypes.TCP, Port: 80}, Scheduler: "rr"}
		ops[i] = ktypes.Op{Kind: ktypes.OpAddRealServer, VirtualServer: vs}
	}
	sh := ktypes.VirtualServer{VSKey: ktypestest.VSKey("10.97.0.1:80", ktypes.TCP), Scheduler: "sh"}
	for i := applyChunk - 2; i < applyChunk+2; i++ {
		ops[i] = ktypes.Op{Kind: ktypes.OpAddRealServer, VirtualServer: sh, Move: i%2 == 1}
	}
	idx := make([]int, len(ops))
	for i := range idx {
		idx[i] = i
	}
	var sizes []int
	for c := range chunks(ops, idx) {
		sizes = append(sizes, len(c))
	}
	if want := []int{applyChunk + 2, 2}; !slices.Equal(sizes, want) {
		t.Errorf("chunk sizes %v, want %v", sizes, want)
	}
}
