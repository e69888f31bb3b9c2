package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// faultCase is one fault rate of TestChaosKernelFaults.
type faultCase struct {
	name string
	rate float64
	seed int
}

// TestChaosKernelFaults: a test build of the agent (build tag faultinject,
// absent from the released binary) fails 10%, then 50%, of its IPVS,
// address and ipset writes. A Service that exists before the faults
// serves TCP and UDP traffic all along (new connections every 50 ms, a
// held TCP connection and a held UDP flow) while CHAOS_SIZE Services are
// created, a third of them then get new endpoints and a third are deleted. Every Service converges
// to its exact kernel state (virtual and real servers, VIPs, set
// entries), nothing deleted is left, no connection to the steady Service
// fails, the agent's failed Services wait for retries whose delay doubles
// per failure, and its metrics and logs show the failures.
func TestChaosKernelFaults(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	size := chaosSize(t)
	t.Cleanup(foreignVirtualServer(t, e.VM))

	// The option exists only in the test build.
	bin, err := e.InstallAgentVariant(ctx, "faultinject")
	if err != nil {
		t.Fatal(err)
	}
	if help := e.vmRun(t, bin, "run", "--help"); !strings.Contains(help, "--inject-write-failures") {
		t.Fatalf("the faultinject build has no --inject-write-failures:\n%s", help)
	}
	if help := e.vmRun(t, bed.GuestBinary, "run", "--help"); strings.Contains(help, "inject") {
		t.Fatalf("the released build has a fault injection flag:\n%s", help)
	}
	t.Cleanup(func() { // the package's other tests run the released agent
		_ = e.StopAgent()
		if err := e.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the released agent: %v", err)
		}
	})

	// The steady Service, programmed before any fault.
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	steady := e.createService(t, ns, "steady", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)})
	e.setSlice(t, steady, discoveryv1.AddressTypeIPv4, bes)
	e.expectBackends(t, "tcp", hostPort(steady.Spec.ClusterIP, 80), names(bes))
	e.expectBackends(t, "udp", hostPort(steady.Spec.ClusterIP, 53), names(bes))

	// The first case injects nothing: the same restart and churn under the
	// same load, so that what the faults change shows against it.
	for i, fc := range []faultCase{{"kernel-faults-0pct", 0, 0}, {"kernel-faults-10pct", 0.1, 1}, {"kernel-faults-50pct", 0.5, 2}} {
		t.Run(fc.name, func(t *testing.T) {
			e.faultCase(t, bin, fc, size, i, steady)
		})
	}
}

// faultCase runs one fault rate with traffic to the steady Service; k
// numbers the case (for its addresses).
func (e env) faultCase(t *testing.T, bin string, fc faultCase, size, k int, steady *corev1.Service) {
	ctx := context.Background()
	peaks := startPeaks(ctx, t, e.bedVM())
	tcpAddr, udpAddr := hostPort(steady.Spec.ClusterIP, 80), hostPort(steady.Spec.ClusterIP, 53)
	traffics := []*traffic{e.startTraffic(t, "tcp", tcpAddr), e.startTraffic(t, "udp", udpAddr)}
	holds := []*heldConn{e.holdFlow(t, "tcp", tcpAddr), e.holdFlow(t, "udp", udpAddr)}
	// The timeline since the traffic began, to place its failures.
	var timeline []string
	mark := func(what string) {
		timeline = append(timeline, fmt.Sprintf("%s %s", time.Since(traffics[0].started).Round(10*time.Millisecond), what))
	}
	defer func() { t.Logf("%s timeline: %s", fc.name, strings.Join(timeline, "; ")) }()

	// The agent restarts as the test build, failing writes at the rate.
	mark("agent stops")
	prevLog := e.AgentOutput()
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	mark("agent stopped")
	// What the previous agent left unowned (a virtual server of the
	// range on no bound address and in no routed range) no agent will
	// ever delete: name it, with that agent's lines about it.
	if un := unowned(e.kernelState(t)); len(un) > 0 {
		t.Errorf("%s: the previous agent left virtual servers on addresses it does not hold: %v; its log lines naming them:\n%s",
			fc.name, un, linesNaming(prevLog, un, 60))
	}
	// It binds one address per clusterIP (--route-service-cidrs=false):
	// hundreds of address writes fail at the rate, where the Service
	// range's route would be one write. Its start moves the node from the
	// bed agent's routed range to bound addresses, and the bed agent's
	// restart after the case moves it back.
	if err := e.StartAgentBinary(ctx, bin, "--inject-write-failures", fmt.Sprint(fc.rate), "--inject-seed", fmt.Sprint(fc.seed),
		"--route-service-cidrs=false"); err != nil {
		t.Fatal(err)
	}
	mark("test build's first sync done")

	// Churn under faults: size Services, then a third get new endpoints
	// and a third are deleted.
	ns := e.namespace(t)
	c := &churn{e: e, ns: ns, base: k * 4000}
	// The case's Services go with it: the bed's later tests (kube-proxy's
	// syncs in TestTakeoverFromKubeProxy among them) should not carry them.
	// The agent that runs the case removes them under its faults before
	// the next case stops it: nothing of the case may be left (a stop in
	// the middle of deletions is TestChaosAgentRestart's).
	t.Cleanup(func() {
		c.mu.Lock()
		live := slices.Collect(maps.Keys(c.svcs))
		c.mu.Unlock()
		for _, i := range live {
			c.delete(t, i)
		}
		var left string
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
			if left = c.diff(e.kernelState(t)); left == "" {
				return
			}
			if time.Now().After(deadline) {
				break
			}
		}
		t.Errorf("%s: the case's Services deleted, two minutes later the kernel still has:\n%s\nthe agent's log lines naming them:\n%s",
			fc.name, left, linesNaming(e.AgentOutput(), strings.Split(left, "\n"), 60))
	})
	start := time.Now()
	c.run(t, size, func(i int) { c.create(t, i) })
	c.run(t, size, func(i int) {
		switch i % 3 {
		case 0:
			c.setEndpoints(t, i, 1)
		case 1:
			c.delete(t, i)
		}
	})
	churned := time.Now()
	mark("churn done")
	t.Logf("%s: %d Services created, %d changed, %d deleted in %s", fc.name, size, (size+2)/3, (size+1)/3, churned.Sub(start).Round(time.Millisecond))

	// Convergence: the exact state of every Service of the case.
	var last string
	deadline := churned.Add(15 * time.Minute)
	for {
		st := e.kernelState(t)
		diff := c.diff(st)
		if diff == "" {
			break
		}
		if diff != last {
			last = diff
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not converged after %s:\n%s\nagent problems:\n%s", fc.name, time.Since(churned).Round(time.Second), diff,
				tailLines(e.AgentOutput(), 40))
		}
		time.Sleep(2 * time.Second)
	}
	converge := time.Since(churned)
	mark("converged")
	t.Logf("%s: converged %s after the churn ended", fc.name, converge.Round(100*time.Millisecond))

	// It stays so through a full resync (the bed's --sync-period is 5s),
	// and nothing is leaked anywhere in the service range. A cleanup
	// write can fail too (a rebuild's temporary set whose destroy failed
	// stays until a later sync destroys it): leftovers must be gone
	// within a minute of resyncs, each of which retries them.
	time.Sleep(6 * time.Second)
	st := e.kernelState(t)
	if diff := c.diff(st); diff != "" {
		t.Errorf("%s: the state moved after convergence:\n%s", fc.name, diff)
	}
	leaks := e.leaks(t, st)
	for cleaned := time.Now(); len(leaks) > 0 && time.Since(cleaned) < time.Minute; {
		time.Sleep(2 * time.Second)
		leaks = e.leaks(t, e.kernelState(t))
		if len(leaks) == 0 {
			t.Logf("%s: leftovers of failed cleanup writes gone %s after the first look", fc.name, time.Since(cleaned).Round(time.Second))
		}
	}
	for _, l := range leaks {
		t.Errorf("%s: leaked: %s", fc.name, l)
	}
	if len(leaks) > 0 {
		t.Logf("%s: the agent's log lines naming a leaked address:\n%s", fc.name, linesNaming(e.AgentOutput(), leaks, 60))
	}

	// Metrics: the injector's counts, the agent's failures, none left.
	var m map[string]float64
	eventually(t, time.Minute, func() error {
		m = e.scrape(t)
		if v := m["ipvs_proxy_services_failing"]; v != 0 {
			return fmt.Errorf("ipvs_proxy_services_failing = %v after convergence", v)
		}
		return nil
	})
	writes, failed := 0, 0
	var kinds []string
	for _, kind := range []string{"ipvs", "address", "ipset"} {
		w := int(m[`ipvs_proxy_fault_injection_writes_total{kind="`+kind+`"}`])
		f := int(m[`ipvs_proxy_fault_injection_failures_total{kind="`+kind+`"}`])
		writes += w
		failed += f
		kinds = append(kinds, fmt.Sprintf("%s %d/%d", kind, f, w))
		if w == 0 || (f == 0) != (fc.rate == 0) {
			t.Errorf("%s: %d of %d %s writes failed at rate %v", fc.name, f, w, kind, fc.rate)
		} else if got := float64(f) / float64(w); math.Abs(got-fc.rate) > 0.1 {
			t.Errorf("%s: %d of %d %s writes failed (%.2f), want about %v", fc.name, f, w, kind, got, fc.rate)
		}
	}
	svcFailures := m["ipvs_proxy_service_sync_failures_total"]
	if (svcFailures == 0) != (fc.rate == 0) {
		t.Errorf("%s: ipvs_proxy_service_sync_failures_total is %v with %d injected failures", fc.name, svcFailures, failed)
	}

	// Logs: the failed Services by name, each retried after its backoff.
	back := "no failure"
	if rs := retryLines(t, e.AgentOutput()); fc.rate > 0 {
		back = checkBackoff(t, fc.name, rs, ns)
	} else if len(rs) > 0 {
		t.Errorf("%s: Services failed without injected failures: %+v", fc.name, rs[0])
	}

	// Traffic to the steady Service: the held flows kept their
	// backends, and no new connection or exchange was refused, reset or
	// unreachable (what a missing virtual server, real server or VIP, or
	// a wrong rule, gives). Timeouts are counted apart: on a loaded host
	// the emulated VM stalls for seconds (a UDP dial, which sends
	// nothing, timed out), and the control case at rate 0 has them too.
	for _, h := range holds {
		if err := h.verify(15 * time.Second); err != nil {
			t.Errorf("%s: %v", fc.name, err)
		}
	}
	attempted, failedConns, timeouts := 0, 0, 0
	var timeoutErrs []string
	for _, tr := range traffics {
		a, f, _, errs := tr.stop(t, time.Time{})
		attempted += a
		failedConns += f
		for _, err := range errs {
			if strings.Contains(err, ": timeout: ") {
				timeouts++
				timeoutErrs = append(timeoutErrs, tr.name+" "+err)
			} else {
				t.Errorf("%s: %s failed: %s", fc.name, tr.name, err)
			}
		}
		if a < 20 {
			t.Errorf("%s: %s: only %d attempts: the traffic did not run", fc.name, tr.name, a)
		}
	}
	if timeouts > 0 {
		t.Logf("%s: %d of %d attempts timed out: %s", fc.name, timeouts, attempted, strings.Join(timeoutErrs, "; "))
	}
	steadyNote := fmt.Sprintf("%d of %d failed", failedConns, attempted)
	if failedConns > 0 {
		steadyNote += ", all timeouts (VM stalls: compare the 0pct control)"
	}
	notes := fmt.Sprintf("rate %v seed %d, %d Services created, %d changed, %d deleted; injected failures %s; agent: %v failed Service syncs, %s; "+
		"steady Service: %s, a held TCP connection and a held UDP flow kept their backends (%d and %d answers)",
		fc.rate, fc.seed, size, (size+2)/3, (size+1)/3, strings.Join(kinds, ", "), svcFailures, back, steadyNote, holds[0].answers(), holds[1].answers())
	peaks.record(t, chaos.Row{Case: fc.name, TrafficAttempted: attempted, TrafficFailed: failedConns, KernelWrites: writes,
		ConvergeSeconds: math.Round(converge.Seconds()*10) / 10, Leaks: len(leaks), Notes: notes})
}

// churn makes and changes the Services of one case: svc-<i>, one TCP port
// 80, two endpoints (addresses with nothing behind them: only the kernel
// state is checked) that are unique to the case.
type churn struct {
	e    env
	ns   string
	base int // first endpoint number of the case

	mu      sync.Mutex
	svcs    map[int]*corev1.Service
	eps     map[int][]string // live Services' endpoint addresses
	deleted map[string]bool  // clusterIPs of deleted Services
	gone    map[string]bool  // endpoint addresses removed
	next    int
}

// run calls fn for 0..n-1 from four workers.
func (c *churn) run(t *testing.T, n int, fn func(i int)) {
	t.Helper()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				fn(i)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

func (c *churn) addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.base + c.next
	c.next++
	return fmt.Sprintf("10.102.%d.%d", n/250, n%250+1)
}

func (c *churn) create(t *testing.T, i int) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: fmt.Sprint("svc-", i)},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80)}}}
	out, err := c.e.Client.CoreV1().Services(c.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Errorf("create %s: %v", svc.Name, err)
		return
	}
	c.mu.Lock()
	if c.svcs == nil {
		c.svcs, c.eps, c.deleted, c.gone = map[int]*corev1.Service{}, map[int][]string{}, map[string]bool{}, map[string]bool{}
	}
	c.svcs[i] = out
	c.mu.Unlock()
	c.setEndpoints(t, i, 2)
}

// setEndpoints gives Service i n fresh endpoints.
func (c *churn) setEndpoints(t *testing.T, i, n int) {
	c.mu.Lock()
	svc := c.svcs[i]
	old := c.eps[i]
	c.mu.Unlock()
	var bes []backend
	var addrs []string
	for range n {
		a := c.addr()
		addrs = append(addrs, a)
		bes = append(bes, bed.Backend{Name: a, Addr: a, Node: nodeName})
	}
	if err := c.e.SetEndpoints(context.Background(), svc, discoveryv1.AddressTypeIPv4, bes); err != nil {
		t.Error(err)
		return
	}
	c.mu.Lock()
	c.eps[i] = addrs
	for _, a := range old {
		c.gone[a] = true
	}
	c.mu.Unlock()
}

func (c *churn) delete(t *testing.T, i int) {
	c.mu.Lock()
	svc := c.svcs[i]
	c.mu.Unlock()
	if err := c.e.Client.CoreV1().Services(c.ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete %s: %v", svc.Name, err)
		return
	}
	// (Without the garbage collector the slice stays; the agent drops
	// slices of a Service that is gone.)
	c.mu.Lock()
	c.deleted[svc.Spec.ClusterIP] = true
	for _, a := range c.eps[i] {
		c.gone[a] = true
	}
	delete(c.svcs, i)
	delete(c.eps, i)
	c.mu.Unlock()
}

// kernelState is the VM's IPVS table, the proxy interface's addresses and
// the owned sets' entries, as lines.
type kernelState struct {
	ipvs   []string // "TCP 10.96.0.5:80 rr" and "TCP 10.96.0.5:80 -> 10.102.0.1:8080 Masq 1"
	addrs  []string // "10.96.0.5"
	sets   []string // "IPVSP-CLUSTER-IP 10.96.0.5,tcp:80"
	routes []string // "10.96.0.0/16": routed as local through the interface
}

func (e env) kernelState(t *testing.T) kernelState {
	t.Helper()
	var st kernelState
	var vs string
	for _, l := range strings.Split(e.ipvsadm(t), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			vs = f[0] + " " + f[1]
			st.ipvs = append(st.ipvs, strings.Join(f[:3], " "))
		case len(f) >= 4 && f[0] == "->" && f[1] != "RemoteAddress:Port":
			st.ipvs = append(st.ipvs, vs+" -> "+strings.Join(f[1:4], " "))
		}
	}
	for _, l := range strings.Split(e.vmRun(t, "ip", "-o", "-4", "addr", "show", "dev", proxyIface), "\n") {
		if f := strings.Fields(l); len(f) >= 4 {
			st.addrs = append(st.addrs, strings.TrimSuffix(f[3], "/32"))
		}
	}
	for _, l := range strings.Split(e.vmRun(t, "ipset", "save"), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "add" && strings.HasPrefix(f[1], "IPVSP-") {
			st.sets = append(st.sets, f[1]+" "+f[2])
		}
	}
	st.routes = e.routedRanges(t)
	return st
}

// diff compares the kernel's state of the case's addresses (its
// clusterIPs, live and deleted, and its endpoints, present and removed)
// with the live Services' own; "" when equal.
func (c *churn) diff(st kernelState) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	mine := map[string]bool{}
	var want kernelState
	for i, svc := range c.svcs {
		ip := svc.Spec.ClusterIP
		mine[ip] = true
		vs := "TCP " + ip + ":80"
		want.ipvs = append(want.ipvs, vs+" "+scheduler.Default)
		want.addrs = append(want.addrs, ip)
		want.sets = append(want.sets, "IPVSP-CLUSTER-IP "+ip+",tcp:80", "IPVSP-SERVICE "+ip+",tcp:80", "IPVSP-VIP "+ip)
		for _, a := range c.eps[i] {
			mine[a] = true
			want.ipvs = append(want.ipvs, vs+" -> "+a+":8080 Masq 1")
			want.sets = append(want.sets, "IPVSP-HAIRPIN "+a+",tcp:8080,"+a)
		}
	}
	for ip := range c.deleted {
		mine[ip] = true
	}
	for a := range c.gone {
		mine[a] = true
	}
	// A line is the case's when an address in it is.
	ours := func(l string) bool {
		for _, tok := range strings.FieldsFunc(l, func(r rune) bool { return r == ' ' || r == ',' || r == ':' }) {
			if mine[tok] {
				return true
			}
		}
		return false
	}
	var out []string
	for _, part := range []struct {
		what      string
		got, want []string
	}{{"IPVS", st.ipvs, want.ipvs}, {"VIPs", st.addrs, want.addrs}, {"sets", st.sets, want.sets}} {
		got := slices.DeleteFunc(slices.Clone(part.got), func(l string) bool { return !ours(l) })
		missing, extra := lineDiff(part.want, got)
		if len(missing) > 0 {
			out = append(out, fmt.Sprintf("%s missing %d: %s", part.what, len(missing), sample(missing)))
		}
		if len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s extra %d: %s", part.what, len(extra), sample(extra)))
		}
	}
	if len(st.routes) > 0 {
		out = append(out, fmt.Sprintf("routes left while binding: %v", st.routes))
	}
	return strings.Join(out, "\n")
}

// lineDiff returns the lines of want not in got and of got not in want.
func lineDiff(want, got []string) (missing, extra []string) {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range want {
		w[l] = true
	}
	for _, l := range got {
		g[l] = true
		if !w[l] {
			extra = append(extra, l)
		}
	}
	for _, l := range want {
		if !g[l] {
			missing = append(missing, l)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra
}

func sample(ls []string) string {
	if len(ls) > 8 {
		return strings.Join(ls[:8], "; ") + fmt.Sprintf("; and %d more", len(ls)-8)
	}
	return strings.Join(ls, "; ")
}

// leaks lists what the kernel holds in the service range (the bed's
// 10.96.0.0/16) that no Service of the cluster wants: a virtual server or
// VIP on an address that is no live clusterIP, and the rebuild sets
// ("-N") a sync left behind.
func (e env) leaks(t *testing.T, st kernelState) []string {
	t.Helper()
	list, err := e.Client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, s := range list.Items {
		for _, ip := range s.Spec.ClusterIPs {
			live[ip] = true
		}
	}
	svcRange := netip.MustParsePrefix("10.96.0.0/16")
	inRange := func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && svcRange.Contains(a)
	}
	var out []string
	for _, l := range st.ipvs {
		if f := strings.Fields(l); len(f) == 3 {
			host, _, _ := strings.Cut(f[1], ":")
			if inRange(host) && !live[host] {
				out = append(out, "virtual server "+l)
			}
		}
	}
	anchors := map[string]bool{} // bound beside a routed range
	for _, r := range st.routes {
		if p, err := netip.ParsePrefix(r); err == nil {
			if a, ok := model.RangeAnchor(p); ok {
				anchors[a.String()] = true
			}
		}
	}
	for _, a := range st.addrs {
		if inRange(a) && !live[a] && !anchors[a] {
			out = append(out, "VIP "+a)
		}
	}
	for _, l := range st.sets {
		name, entry, _ := strings.Cut(l, " ")
		if strings.HasSuffix(name, "-N") {
			out = append(out, "rebuild set entry "+l)
			continue
		}
		host, _, _ := strings.Cut(entry, ",")
		if inRange(host) && !live[host] {
			out = append(out, "set entry "+l)
		}
	}
	return out
}

// retryLine is one "service not fully programmed; retrying it alone" log
// line of the agent.
type retryLine struct {
	Msg       string  `json:"msg"`
	TS        float64 `json:"ts"`
	Service   string  `json:"service"`
	Failures  int     `json:"failures"`
	RetryIn   float64 `json:"retryIn"` // zap's durations are seconds
	NextRetry float64 `json:"nextRetry"`
	Error     string  `json:"error"`
	// SyncEnd and SyncTook are those of the sync that failed: its
	// "synced" line's time (logged at its end, at debug level as the
	// bed runs the agent) and the time it took.
	SyncEnd, SyncTook float64 `json:"-"`
}

func retryLines(t *testing.T, log string) []retryLine {
	t.Helper()
	var out []retryLine
	pending := 0 // lines of the current sync, waiting for its "synced"
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, `"msg":"synced"`):
			var st struct {
				TS   float64 `json:"ts"`
				Took float64 `json:"took"`
			}
			if err := json.Unmarshal([]byte(l), &st); err != nil {
				t.Errorf("agent log line: %v: %s", err, l)
				continue
			}
			for i := len(out) - pending; i < len(out); i++ {
				out[i].SyncEnd, out[i].SyncTook = st.TS, st.Took
			}
			pending = 0
		case strings.Contains(l, `"service not fully programmed; retrying it alone"`):
			var r retryLine
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Errorf("agent log line: %v: %s", err, l)
				continue
			}
			out = append(out, r)
			pending++
		}
	}
	return out[:len(out)-pending]
}

// checkBackoff checks the retry lines of the case's Services: each names
// its Service and the injected failure; the failures in a row count up one
// at a time, and each retry waits min(2^(failures-1) s, 5 s) (the agent's
// 1 s base, its --sync-period of 5 s as the maximum) from a moment within
// the sync that failed (found from the sync's "synced" line). It returns a
// summary for the notes.
func checkBackoff(t *testing.T, what string, lines []retryLine, ns string) string {
	t.Helper()
	last := map[string]int{}
	byFailures := map[int][]float64{}
	services, maxF, injected := 0, 0, 0
	var long []string
	defer func() {
		if len(long) > 0 {
			t.Logf("%s: Services failing 8 times or more in a row:\n%s", what, strings.Join(long, "\n"))
		}
	}()
	for _, r := range lines {
		if !strings.HasPrefix(r.Service, ns+"/") {
			continue
		}
		if strings.Contains(r.Error, "injected write failure") {
			injected++
		}
		// Every failure is an injected one, or follows from one (a
		// real server of a virtual server whose add failed).
		for _, part := range strings.Split(r.Error, "\n") {
			if !strings.Contains(part, "injected write failure") && !strings.Contains(part, "address not bound") {
				t.Errorf("%s: %s failed (%d in a row) for another reason than an injected failure: %s", what, r.Service, r.Failures, part)
			}
		}
		if r.Failures >= 8 {
			long = append(long, fmt.Sprintf("%s #%d at %.1f: %s", r.Service, r.Failures, r.TS, r.Error))
		}
		if _, ok := last[r.Service]; !ok {
			services++
		}
		if prev := last[r.Service]; r.Failures != prev+1 && r.Failures != 1 {
			t.Errorf("%s: %s: %d failures in a row after %d", what, r.Service, r.Failures, prev)
		}
		last[r.Service] = r.Failures
		maxF = max(maxF, r.Failures)
		want := math.Min(math.Pow(2, float64(r.Failures-1)), 5)
		byFailures[r.Failures] = append(byFailures[r.Failures], r.RetryIn)
		if math.Abs(r.RetryIn-want) > 0.001 {
			t.Errorf("%s: %s failed %d times in a row: retry in %.3fs, want %.0fs", what, r.Service, r.Failures, r.RetryIn, want)
		}
		// The backoff counts from the reconciler's clock, read after the
		// sync has built the changed plans: within the sync. The sync's
		// start is known only as its "synced" line's time less the time
		// it took, and that line comes after the metrics are taken (a
		// stalled VM puts tenths of a second in between, as CI saw):
		// a second of slack on that side.
		if failed := r.NextRetry - r.RetryIn; failed > r.SyncEnd+0.001 || failed < r.SyncEnd-r.SyncTook-1 {
			t.Errorf("%s: %s failed %d times in a row at %.3f, outside its sync (%.3f to %.3f)",
				what, r.Service, r.Failures, failed, r.SyncEnd-r.SyncTook, r.SyncEnd)
		}
	}
	if services == 0 {
		t.Errorf("%s: no agent log line names a failing Service of %s", what, ns)
		return "no retries logged"
	}
	if injected == 0 {
		t.Errorf("%s: no retry log line carries the injected failure", what)
	}
	var delays []string
	for f := 1; f <= min(maxF, 5); f++ {
		d := byFailures[f]
		sum := 0.0
		for _, x := range d {
			sum += x
		}
		mean := sum / float64(len(d))
		delays = append(delays, fmt.Sprintf("%d: %.1fs×%d", f, mean, len(d)))
	}
	return fmt.Sprintf("%d Services logged failing (%d lines), up to %d failures in a row; mean retry delay by failures in a row %s",
		services, len(lines), maxF, strings.Join(delays, ", "))
}

// linesNaming returns up to limit lines of log that name an IPv4 address
// found in one of what.
func linesNaming(log string, what []string, limit int) string {
	addrs := map[string]bool{}
	for _, w := range what {
		for _, f := range strings.FieldsFunc(w, func(r rune) bool { return r == ' ' || r == ':' || r == ',' || r == ';' }) {
			if a, err := netip.ParseAddr(f); err == nil && a.Is4() {
				addrs[a.String()] = true
			}
		}
	}
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for a := range addrs {
			if strings.Contains(l, a+":") || strings.Contains(l, a+"\"") || strings.Contains(l, a+" ") {
				out = append(out, l)
				break
			}
		}
		if len(out) == limit {
			break
		}
	}
	return strings.Join(out, "\n")
}

// unowned lists the virtual servers of the Service range (10.96.0.0/16)
// whose address is neither bound nor in a routed range.
func unowned(st kernelState) []string {
	svcRange := netip.MustParsePrefix("10.96.0.0/16")
	bound := map[string]bool{}
	for _, a := range st.addrs {
		bound[a] = true
	}
	var routes []netip.Prefix
	for _, r := range st.routes {
		if p, err := netip.ParsePrefix(r); err == nil {
			routes = append(routes, p)
		}
	}
	var out []string
	for _, l := range st.ipvs {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		host, _, _ := strings.Cut(f[1], ":")
		a, err := netip.ParseAddr(host)
		if err != nil || !svcRange.Contains(a) || bound[host] || slices.ContainsFunc(routes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		out = append(out, l)
	}
	return out
}
