package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
)

// pagedDump dumps the virtual servers as the kernel's IPVS does
// (ip_vs_genl_dump_services): in parts, each part resuming at a position
// (cb->args[0] = number of entries already passed), the table's lock
// released between parts. between runs after the first part: what the
// loop writes meanwhile.
type pagedDump struct {
	netlinkutil.IPVS
	page    int
	between func()
}

func (d *pagedDump) ListVirtualServers() ([]ktypes.VirtualServer, error) {
	var out []ktypes.VirtualServer
	pos := 0
	for part := 0; ; part++ {
		all, err := d.IPVS.ListVirtualServers() // the table as it is now, in its (hash) order
		if err != nil {
			return nil, err
		}
		if pos >= len(all) {
			return out, nil
		}
		end := min(pos+d.page, len(all))
		out = append(out, all[pos:end]...)
		pos = end
		if part == 0 && d.between != nil {
			d.between()
		}
	}
}

// unownedVS lists the kernel's virtual servers in 10.96.0.0/16 on an
// address neither bound nor routed (what e2e's unowned() reports).
func unownedVS(ipvs *fake.IPVS, links *fake.Links) []string {
	rng := netip.MustParsePrefix("10.96.0.0/16")
	vss, _ := ipvs.ListVirtualServers()
	bound := links.Addresses(testIface)
	routes := links.Routes(testIface)
	var out []string
	for _, v := range vss {
		a := v.Address
		if !rng.Contains(a) || slices.Contains(bound, a) ||
			slices.ContainsFunc(routes, func(r netlinkutil.LocalRoute) bool { return r.Prefix.Contains(a) }) {
			continue
		}
		out = append(out, v.VSKey.String())
	}
	return out
}

func svcN(i int) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: fmt.Sprint("s", i)}
}

func planN(i int) *model.ServicePlan {
	return modeltest.Plan(svcN(i), modeltest.VS(model.KindClusterIP, fmt.Sprintf("10.96.0.%d:80", i), "rr", "10.0.1.2:8080"))
}

// tornResyncRead programs s1..s3, then runs a periodic resync's read off
// the loop that dumps one virtual server per part while the loop deletes
// s1 (already dumped) between the first two parts: position 1 is then s3,
// and s2, which nobody touched, is skipped. The next full Sync takes the
// read.
func tornResyncRead(t *testing.T) (*Reconciler, *fake.IPVS, *fake.Links) {
	t.Helper()
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
	for i := 1; i <= 3; i++ {
		r.SetPlan(svcN(i), planN(i))
	}
	mustSync(t, r, true)
	reader := &pagedDump{IPVS: ipvs, page: 1}
	reader.between = func() {
		r.SetPlan(svcN(1), nil)
		mustSync(t, r, false)
	}
	r.SetResyncReader(reader, links)
	run, ok := r.StartResyncRead()
	if !ok {
		t.Fatal("no read off the loop")
	}
	run()
	reader.between = nil
	return r, ipvs, links
}

// TestTornOffLoopDumpNotAdopted: the periodic resync's dump off the loop
// runs while the loop deletes Services. IPVS dumps by position, so a
// delete of an entry already passed shifts the rest back and the next part
// skips one that nobody touched. Were that read adopted, the view would
// lack it; when its Service went, Diff would have nothing to delete and
// would unbind its address: the virtual server left on an address nobody
// holds, owned by no agent again (e2e's TestChaosKernelFaults saw it). The
// read is not adopted; the sync reads the kernel in the loop.
func TestTornOffLoopDumpNotAdopted(t *testing.T) {
	r, ipvs, links := tornResyncRead(t)
	st, err := r.Sync(true)
	t.Logf("adopting resync: full %v, failed %v, err %v", st.Full, st.Failed, err)

	// s2 goes: its virtual server is not in the view.
	r.SetPlan(svcN(2), nil)
	if _, err := r.Sync(false); err != nil {
		t.Logf("sync deleting s2: %v", err)
	}
	if un := unownedVS(ipvs, links); len(un) > 0 {
		// A new agent over this kernel does not own it either.
		r2 := NewReconciler(ipvs, links, Config{Ownership: testOwnership()}, zap.NewNop())
		r2.SetPlan(svcN(3), planN(3))
		mustSync(t, r2, true)
		t.Errorf("virtual servers left on addresses neither bound nor routed: %v (after a restart: %v); kernel:\n%v",
			un, unownedVS(ipvs, links), ipvs.Dump())
	}
}

// lostAnswers applies the writes and reports those chosen as lost
// (ErrOutcomeUnknown), as nlbatch does when the receive buffer overflows
// after the kernel applied them.
type lostAnswers struct {
	*fake.IPVS
	lose func(w netlinkutil.Write) bool
}

func (l *lostAnswers) Apply(writes []netlinkutil.Write) []error {
	errs := l.IPVS.Apply(writes)
	for i, w := range writes {
		if errs[i] == nil && l.lose != nil && l.lose(w) {
			errs[i] = netlinkutil.WrapWrite(w, netlinkutil.ErrOutcomeUnknown)
		}
	}
	return errs
}

// TestLostAddAnswerKeepsTheAddress: an add whose answer is lost may be
// applied; the next full sync is due only after RetryBase, and a partial
// sync before it that deletes the Service must not unbind its address with
// the virtual server still there: the view keeps the virtual server until
// a full read settles it.
func TestLostAddAnswerKeepsTheAddress(t *testing.T) {
	inner, links := fake.NewIPVS(), fake.NewLinks(node)
	ipvs := &lostAnswers{IPVS: inner}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 27, 20, 0, 0, 0, time.UTC))
	r := NewReconciler(ipvs, links, Config{Ownership: testOwnership(), Clock: clk}, zap.NewNop())
	r.SetPlan(svcN(1), planN(1))
	mustSync(t, r, true)

	ipvs.lose = func(w netlinkutil.Write) bool { return w.Kind == ktypes.OpAddVirtualServer }
	r.SetPlan(svcN(2), planN(2))
	_, err := r.Sync(false)
	t.Logf("sync adding s2: %v; full due: %v", err, r.FullDue())
	ipvs.lose = nil

	clk.Step(100 * time.Millisecond) // within RetryBase (1s)
	r.SetPlan(svcN(2), nil)
	st, err := r.Sync(false)
	t.Logf("sync deleting s2: full %v, err %v", st.Full, err)
	if un := unownedVS(inner, links); len(un) > 0 {
		t.Errorf("virtual servers left on addresses neither bound nor routed: %v", un)
	}
}

// TestTornDumpDeletedAtAdoption: as TestTornOffLoopDumpNotAdopted, but
// the skipped virtual server's Service goes in the very sync that would
// adopt the read (no add would be tried, no EEXIST logged, the address
// unbound).
func TestTornDumpDeletedAtAdoption(t *testing.T) {
	r, ipvs, links := tornResyncRead(t)
	r.SetPlan(svcN(2), nil) // the event arrives before the resync's sync
	st, err := r.Sync(true)
	t.Logf("adopting resync: full %v, failed %v, err %v", st.Full, st.Failed, err)
	if un := unownedVS(ipvs, links); len(un) > 0 {
		t.Errorf("virtual servers left on addresses neither bound nor routed: %v", un)
	}
}
