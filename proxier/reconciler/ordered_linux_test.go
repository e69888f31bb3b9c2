package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

const expireNodestConnSysctl = "net/ipv4/vs/expire_nodest_conn"

// orderedBed is one node's IPVS with four backends and a client, each in
// its own namespace.
type orderedBed struct {
	t      *testing.T
	h      netlinkutil.IPVS
	client string
}

func newOrderedBed(t *testing.T) *orderedBed {
	nltest.InFreshNetns(t)
	h, err := netlinkutil.NewIPVS()
	nltest.Require(t, "IPVS", err)
	t.Cleanup(h.Close)
	b := &orderedBed{t: t, h: h}
	l, err := netlinkutil.NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureDummy("ord0"); err != nil {
		nltest.Require(t, "dummy interfaces", err)
	}
	sys := netlinkutil.Sysctls{Root: "/proc/sys"}
	for k, v := range map[string]string{"net/ipv4/ip_forward": "1", expireNodestConnSysctl: "1"} {
		if _, err := sys.Ensure(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("ordns%d", i)
		err := nettest.AddNetns(name, nettest.NetnsConfig{HostAddr: netip.MustParsePrefix(fmt.Sprintf("10.0.%d.1/24", i)),
			Addr: netip.MustParsePrefix(fmt.Sprintf("10.0.%d.2/24", i))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nettest.DelNetns(name) })
		if i == 5 {
			b.client = name
			continue
		}
		srv, err := nettest.Serve(nettest.ServeConfig{Netns: name, Name: fmt.Sprintf("be%d", i), Port: 8080, TCP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
	}
	for i := 1; i <= 6; i++ {
		if err := l.AddAddress("ord0", netip.MustParseAddr(fmt.Sprintf("10.96.0.%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// program makes the virtual server hold rss ("N" is backend N at weight
// 1, "N@0" at weight 0) as the reconciler does: the kernel's list read,
// model.Diff, one batch.
func (b *orderedBed) program(vs ktypes.VirtualServer, rss ...string) {
	b.t.Helper()
	w := model.Want{Service: types.NamespacedName{Namespace: "ns", Name: "svc"}, VSPlan: model.VSPlan{VirtualServer: vs}}
	for _, r := range rss {
		n, weight, _ := strings.Cut(r, "@")
		if weight == "" {
			weight = "1"
		}
		w.RealServers = append(w.RealServers, ktypestest.RS(fmt.Sprintf("10.0.%s.2:8080@%s", n, weight)))
	}
	have := model.NewKernel(nil, nil)
	if b.exists(vs) {
		cur, err := b.h.ListRealServers(vs.VSKey)
		if err != nil {
			b.t.Fatal(err)
		}
		have.PutVirtualServer(vs)
		have.RealServers[vs.VSKey] = cur
	}
	want := model.Desired{VirtualServers: map[ktypes.VSKey]model.Want{vs.VSKey: w}}
	ops := model.Diff(want, have, model.Scope{Keys: []ktypes.VSKey{vs.VSKey}})
	for i, err := range b.h.Apply(ops) {
		if err != nil {
			b.t.Fatalf("%s: %v", ops[i], err)
		}
	}
}

func (b *orderedBed) exists(vs ktypes.VirtualServer) bool {
	b.t.Helper()
	vss, err := b.h.ListVirtualServers()
	if err != nil {
		b.t.Fatal(err)
	}
	for _, v := range vss {
		if v.VSKey == vs.VSKey {
			return true
		}
	}
	return false
}

// plain makes the same changes the way the kernel's list order was left
// before: adds in the endpoints' order, deletes of the gone ones.
func (b *orderedBed) plain(vs ktypes.VirtualServer, rss ...string) {
	b.t.Helper()
	if !b.exists(vs) {
		if err := b.h.AddVirtualServer(vs); err != nil {
			b.t.Fatal(err)
		}
	}
	cur, err := b.h.ListRealServers(vs.VSKey)
	if err != nil {
		b.t.Fatal(err)
	}
	keep := map[ktypes.RSKey]bool{}
	for _, r := range rss {
		n, weight, _ := strings.Cut(r, "@")
		if weight == "" {
			weight = "1"
		}
		rs := ktypestest.RS(fmt.Sprintf("10.0.%s.2:8080@%s", n, weight))
		keep[rs.RSKey] = true
		if err := b.h.AddRealServer(vs.VSKey, rs); err != nil {
			if err := b.h.UpdateRealServer(vs.VSKey, rs); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	for _, rs := range cur {
		if !keep[rs.RSKey] {
			if err := b.h.DeleteRealServer(vs.VSKey, rs.RSKey); err != nil {
				b.t.Fatal(err)
			}
		}
	}
}

// mapping connects once from each source port and returns which backend
// answered each.
func (b *orderedBed) mapping(vip string, ports []int) map[int]string {
	b.t.Helper()
	out := map[int]string{}
	for _, p := range ports {
		res, err := nettest.Hit(context.Background(), nettest.HitConfig{Netns: b.client, Proto: "tcp", Addr: vip + ":80", N: 1, SourcePort: p})
		if err != nil {
			b.t.Fatal(err)
		}
		out[p] = strings.Join(res.Errors, ",")
		for name := range res.Answers {
			out[p] = name
		}
	}
	return out
}

func disagree(a, b map[int]string) int {
	n := 0
	for p, v := range a {
		if b[p] != v {
			n++
		}
	}
	return n
}

// TestOrderedTablesAgreeOnKernel: one virtual server programmed at once,
// another through endpoints that came, went and came back in another
// order, a third the same way with the kernel's plain order (before this
// change). For sh (with sh-port) and mh (with mh-fallback and mh-port,
// and an endpoint draining at weight 0) the first two map every client
// source port to the same backend; the control does not. Connections held
// on real servers that a change moves keep answering.
func TestOrderedTablesAgreeOnKernel(t *testing.T) {
	b := newOrderedBed(t)
	ports := make([]int, 120)
	for i := range ports {
		ports[i] = 21000 + i*7
	}
	for i, sched := range []string{"sh", "mh"} {
		vs := func(n int) ktypes.VirtualServer {
			return ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.MustParseAddr(fmt.Sprintf("10.96.0.%d", 3*i+n)), Protocol: ktypes.TCP, Port: 80},
				Scheduler: sched, Flags: ktypes.FlagSched1 | ktypes.FlagSched2}
		}
		final := []string{"1", "2", "3", "4"}
		if sched == "mh" {
			final = []string{"1", "2@0", "3", "4"} // 2 drains: it keeps its slots
		}
		b.program(vs(1), "1", "2", "3", "4")
		b.program(vs(1), final...)
		history := [][]string{{"3"}, {"2", "3"}, {"2", "3", "4"}, {"1", "3"}}
		for _, set := range history {
			b.program(vs(2), set...)
			b.plain(vs(3), set...)
		}
		// The last change moves 1 and 3 to the head: connections held on
		// them go on.
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var out strings.Builder
		errs := make(chan error, 10)
		for j := 0; j < 10; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- nettest.Hold(ctx, nettest.HoldConfig{Netns: b.client, Addr: vs(2).Address.String() + ":80", Interval: 10 * time.Millisecond},
					lockedOut{&mu, &out})
			}()
		}
		time.Sleep(500 * time.Millisecond)
		b.program(vs(2), final...)
		b.plain(vs(3), final...)
		time.Sleep(time.Second)
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("%s: a connection held through the moves failed: %v", sched, err)
			}
		}
		mu.Lock()
		held := out.String()
		mu.Unlock()
		if !strings.Contains(held, " be1 ") && !strings.Contains(held, " be3 ") {
			t.Errorf("%s: no held connection was on a moved real server (1 or 3):\n%s", sched, held)
		}
		if v, err := (netlinkutil.Sysctls{Root: "/proc/sys"}).Get(expireNodestConnSysctl); err != nil || v != "1" {
			t.Errorf("%s after the moves: %q, %v; want 1", expireNodestConnSysctl, v, err)
		}

		m1, m2, m3 := b.mapping(vs(1).Address.String(), ports), b.mapping(vs(2).Address.String(), ports), b.mapping(vs(3).Address.String(), ports)
		t.Logf("%s: %d source ports: canonical vs canonical after churn disagree on %d; vs plain kernel order on %d",
			sched, len(ports), disagree(m1, m2), disagree(m1, m3))
		if n := disagree(m1, m2); n != 0 {
			t.Errorf("%s: the two canonical tables disagree on %d of %d source ports: %v vs %v", sched, n, len(ports), m1, m2)
		}
		if disagree(m1, m3) == 0 {
			t.Errorf("%s: the control (plain kernel order) agrees on every source port: the test does not discriminate", sched)
		}
	}
}

type lockedOut struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedOut) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
