package agent

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// TestSyncBatchLimit: no bound before a sync of batchFloor Services or
// more is seen; then as many Services as batchAim allows at the cost seen,
// never fewer than batchFloor; small syncs do not move it.
func TestSyncBatchLimit(t *testing.T) {
	type obs struct {
		took     time.Duration
		services int
	}
	for _, tc := range []struct {
		name string
		seen []obs
		want int
	}{
		{"nothing seen", nil, 0},
		{"only small syncs", []obs{{time.Minute, 1}, {time.Minute, batchFloor - 1}}, 0},
		{"idle node", []obs{{50 * time.Millisecond, 10}}, int(batchAim / (5 * time.Millisecond))},
		{"starved node", []obs{{40 * time.Second, 20}}, batchFloor},
		{"half a second a Service", []obs{{5 * time.Second, 10}}, batchFloor + 2},
		{"a small slow sync is not taken", []obs{{50 * time.Millisecond, 10}, {10 * time.Second, 1}}, 1000},
		{"averaged", []obs{{10 * time.Millisecond, 10}, {30 * time.Millisecond, 10}}, int(batchAim / (2 * time.Millisecond))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b syncBatch
			for _, o := range tc.seen {
				b.observe(o.took, o.services)
			}
			if got := b.limit(); got != tc.want {
				t.Errorf("limit after %v = %d, want %d", tc.seen, got, tc.want)
			}
		})
	}
}

// TestPickBatch: past the limit, the Services with a UDP port go first,
// with any change overdue, then the oldest changes, ties by name; within
// it, every change.
func TestPickBatch(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	name := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	svc := func(protos ...corev1.Protocol) *model.Service {
		s := &model.Service{}
		for _, p := range protos {
			s.Spec.Ports = append(s.Spec.Ports, model.ServicePort{Protocol: p})
		}
		return s
	}
	services := map[types.NamespacedName]*model.Service{
		name("tcp-old"): svc(corev1.ProtocolTCP), name("tcp-mid"): svc(corev1.ProtocolTCP),
		name("tcp-new"): svc(corev1.ProtocolTCP), name("dns"): svc(corev1.ProtocolTCP, corev1.ProtocolUDP),
		name("udp-newest"): svc(corev1.ProtocolUDP), name("sctp"): svc(corev1.ProtocolSCTP),
	}
	dirty := map[types.NamespacedName]time.Time{
		name("tcp-old"): t0, name("tcp-mid"): t0.Add(time.Second), name("tcp-new"): t0.Add(2 * time.Second),
		name("dns"): t0.Add(3 * time.Second), name("udp-newest"): t0.Add(4 * time.Second),
		name("sctp"): t0.Add(time.Second), name("removed"): t0.Add(time.Second),
	}
	now := t0.Add(10 * time.Second)
	for _, tc := range []struct {
		limit int
		now   time.Time
		want  []string
	}{
		{1, now, []string{"dns"}},
		{3, now, []string{"dns", "udp-newest", "tcp-old"}},
		{5, now, []string{"dns", "udp-newest", "tcp-old", "removed", "sctp"}},
		// Overdue (older than batchOverdue): the oldest go before the UDP ones.
		{3, t0.Add(batchOverdue + 1500*time.Millisecond), []string{"tcp-old", "removed", "sctp"}},
	} {
		var got []string
		for _, n := range pickBatch(dirty, services, tc.limit, tc.now) {
			got = append(got, n.Name)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("limit %d (-want +got):\n%s", tc.limit, diff)
		}
	}
	for _, limit := range []int{0, len(dirty), len(dirty) + 1} {
		if got := pickBatch(dirty, services, limit, now); len(got) != len(dirty) {
			t.Errorf("limit %d: %d of %d changes taken, want all", limit, len(got), len(dirty))
		}
	}
}

// TestBacklogGoesInBoundedSyncs: on a node where a Service costs half a
// second to sync, 20 changed TCP Services and a UDP one changed last go in
// syncs of 10, the UDP Service in the first, then the oldest; the loop is
// kicked while some wait (backlogged, which spares them the runner's min
// period), and the backlog's age stays that of its oldest change. A
// rebuild (the cold start) takes every Service whatever the bound.
func TestBacklogGoesInBoundedSyncs(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	ipvs := fake.NewIPVS()
	p := New(Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, IPv4: true, MinSyncPeriod: time.Second, SyncPeriod: time.Hour, Clock: clk},
		nil, ipvs, fake.NewLinks(node), nil, nil, zap.NewNop())
	p.batch.perService = batchAim / 10 // as a starved node's syncs measured it
	const tcp = 20
	names := make([]string, 0, tcp+1)
	for i := range tcp {
		names = append(names, fmt.Sprintf("tcp-%02d", i))
	}
	names = append(names, "udp")
	for i, n := range names {
		svc := testService(n, fmt.Sprintf("10.96.0.%d", 10+i), "rr")
		if n == "udp" {
			svc.Spec.Ports[0].Protocol = corev1.ProtocolUDP
		}
		p.tracker.onService(svc, false)
		p.tracker.onSlice(udpSlice(testSlice(n, fmt.Sprintf("10.0.1.%d", 10+i)), n == "udp"), false)
	}
	if err := p.SyncOnce(false); err != nil {
		t.Fatal(err)
	}
	if got := len(ipvs.Dump()); got != 2*len(names) {
		t.Fatalf("the cold start programmed %d lines, want every Service (%d):\n%s", got, 2*len(names), strings.Join(ipvs.Dump(), "\n"))
	}
	drainKicks(p)

	for i, n := range names { // each moves to a new backend, one a second
		clk.Step(time.Second)
		p.tracker.onSlice(udpSlice(testSlice(n, fmt.Sprintf("10.0.2.%d", 10+i)), n == "udp"), false)
	}
	oldest := clk.Now().Add(-time.Duration(len(names)-1) * time.Second)
	_, pendingSince, _ := p.tracker.status()
	drainKicks(p)

	var wantMoved []string
	for round, batch := range [][]string{
		append([]string{"udp"}, names[:9]...), // the UDP Service first, then the oldest
		names[9:19],
		names[19:tcp],
	} {
		clk.Step(time.Second)
		if err := p.SyncOnce(false); err != nil {
			t.Fatal(err)
		}
		wantMoved = append(wantMoved, batch...)
		moved := movedServices(ipvs.Dump(), names)
		if diff := cmp.Diff(sorted(wantMoved), sorted(moved)); diff != "" {
			t.Errorf("Services on their new backend after sync %d (-want +got):\n%s", round, diff)
		}
		last := round == 2
		if got := p.backlogged(); got == last {
			t.Errorf("after sync %d backlogged = %v, want %v", round, got, !last)
		}
		if kicked := drainKicks(p); kicked == last {
			t.Errorf("after sync %d the loop kicked = %v, want %v", round, kicked, !last)
		}
		_, since, _ := p.tracker.status()
		if !last && !since.Equal(pendingSince) {
			t.Errorf("after sync %d the backlog is pending since %v, want its first change's %v", round, since, pendingSince)
		}
		if last && !since.IsZero() {
			t.Errorf("after the last sync pending since %v, want nothing pending", since)
		}
	}
	if !pendingSince.Equal(oldest) {
		t.Errorf("pending since %v, want the first change's %v", pendingSince, oldest)
	}
}

// udpSlice makes s's port UDP when udp.
func udpSlice(s *discoveryv1.EndpointSlice, udp bool) *discoveryv1.EndpointSlice {
	if udp {
		p := corev1.ProtocolUDP
		s.Ports[0].Protocol = &p
	}
	return s
}

// movedServices names the Services of names whose real server in dump is
// on 10.0.2.0/24 (their new backend), in dump's order.
func movedServices(dump, names []string) []string {
	var out []string
	for i, line := range dump {
		if !strings.HasPrefix(line, "  -> 10.0.2.") {
			continue
		}
		vs := dump[i-1]
		for j, n := range names {
			if strings.HasPrefix(vs, fmt.Sprintf("10.96.0.%d:", 10+j)) {
				out = append(out, n)
			}
		}
	}
	return out
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// drainKicks takes a pending kick of p's loop, and reports whether there
// was one.
func drainKicks(p *Proxier) bool {
	select {
	case <-p.runner.trigger:
		return true
	default:
		return false
	}
}
