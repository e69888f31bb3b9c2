package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// traffic is steady new connections (`vmagent hit --interval`) to one
// address, for as long as it runs.
type traffic struct {
	name    string
	proc    *vm.Proc
	started time.Time // on this host, when it was started
}

// startTraffic opens a new connection (TCP) or exchange (UDP) to addr
// every 50 ms from the client namespace until stopped.
func (e env) startTraffic(t *testing.T, proto, addr string) *traffic {
	t.Helper()
	return e.startTrafficTimeout(t, proto, addr, 2*time.Second)
}

// startTrafficTimeout is startTraffic with another timeout for each
// attempt.
func (e env) startTrafficTimeout(t *testing.T, proto, addr string, timeout time.Duration) *traffic {
	t.Helper()
	p, err := e.VM.Start(context.Background(), "vmagent", "hit", "--netns", bed.ClientNetns, "--proto", proto,
		"--addr", addr, "--n", "1000000", "--interval", "50ms", "--timeout", timeout.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return &traffic{name: proto + " " + addr, proc: p, started: time.Now()}
}

// stop ends the traffic and returns its attempts and failures (the
// attempt cut short by the stop is not counted), each failure with when it
// happened, since the traffic started. Failures that began before
// `before` (a time on this host) are counted apart, in early.
func (tr *traffic) stop(t *testing.T, before time.Time) (attempts, failed, early int, errs []string) {
	t.Helper()
	if err := tr.proc.Stop(); err != nil {
		t.Fatalf("stop %s: %v", tr.name, err)
	}
	var res nettest.HitResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(tr.proc.Output())), &res); err != nil {
		t.Fatalf("%s: %v\n%s", tr.name, err, tr.proc.Output())
	}
	i := 0
	for _, e := range res.Errors {
		if strings.Contains(e, "stopped after") {
			continue
		}
		if i < len(res.FailedAt) {
			if !before.IsZero() && tr.started.Add(res.FailedAt[i]).Before(before) {
				early++
			}
			e = fmt.Sprintf("at %s: %s", res.FailedAt[i].Round(10*time.Millisecond), e)
		}
		i++
		errs = append(errs, e)
	}
	return res.Total() + len(errs), len(errs) - early, early, errs
}

// established lists the IPVS connection table's ESTABLISHED entries to the
// given virtual addresses ("client virtual real").
func (e env) established(t *testing.T, vips []string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(e.ipvsadm(t, "-c"), "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && f[2] == "ESTABLISHED" && slices.Contains(vips, f[4]) {
			out = append(out, strings.Join(f[3:], " "))
		}
	}
	slices.Sort(out)
	return out
}

// programmedState is what an agent programs, in a form two agents can be
// compared by: virtual and real servers with weights (no counters), the
// addresses of its interface, its iptables rules of both families and its
// sets with their members.
func (e env) programmedState(t *testing.T) map[string][]string {
	t.Helper()
	st := map[string][]string{}
	for _, l := range strings.Split(e.ipvsadm(t), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			st["ipvs"] = append(st["ipvs"], strings.Join(f, " "))
		case len(f) >= 4 && f[0] == "->" && f[1] != "RemoteAddress:Port":
			st["ipvs"] = append(st["ipvs"], strings.Join(f[:4], " "))
		}
	}
	for _, l := range strings.Split(e.vmRun(t, "ip", "-o", "addr", "show", "dev", proxyIface), "\n") {
		// (The kernel's own link-local address changes with the interface.)
		if f := strings.Fields(l); len(f) >= 4 && !strings.HasPrefix(f[3], "fe80:") {
			st["addresses"] = append(st["addresses"], f[2]+" "+f[3])
		}
	}
	st["routes"] = e.routedRanges(t)
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(e.iptablesSave(t, tool), "\n") {
			if strings.Contains(l, "IPVSP") {
				st[tool] = append(st[tool], l)
			}
		}
	}
	for _, l := range strings.Split(e.vmRun(t, "ipset", "save"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && strings.HasPrefix(f[1], "IPVSP-") {
			st["ipset"] = append(st["ipset"], l)
		}
	}
	for k := range st {
		slices.Sort(st[k])
	}
	return st
}

// TestTakeoverFromKubeProxy: kube-proxy v1.36.3 in IPVS mode serves a
// Service through its clusterIP (TCP and UDP), a node port (masqueraded)
// and an externalIP; clients hold a TCP connection through each and open
// new ones every 50 ms. kube-proxy stops and `run --takeover-kube-proxy`
// starts: no held connection breaks, no new connection fails, the IPVS
// connection table keeps the held connections' entries, nothing of
// kube-proxy is left, and the state equals what a fresh ipvs-proxy
// programs. Then the rollback (cleanup, kube-proxy starts), whose window
// is measured.
func TestTakeoverFromKubeProxy(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if all, err := e.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err == nil {
		// (kube-proxy programs every one of them: earlier tests' leftovers
		// make its syncs long.)
		t.Logf("Services in the cluster: %d", len(all.Items))
	}
	kp := e.kubeProxy(t, kubeproxy.Options{})
	t.Cleanup(func() { _ = e.StopAgent() }) // before the fixture's own cleanup
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	const extIP = "10.251.0.30"
	svc := e.createService(t, ns, "web", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalIPs = []string{extIP}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	ip := svc.Spec.ClusterIP
	nodePort := svc.Spec.Ports[0].NodePort
	tcpAddrs := []string{hostPort(ip, 80), hostPort(nodeAddr, nodePort), hostPort(extIP, 80)}
	udpAddr := hostPort(ip, 53)
	// kube-proxy syncs everything each time: under emulation a sync takes
	// seconds.
	eventually(t, 2*time.Minute, func() error {
		if out := e.vmRun(t, "ip", "-o", "addr", "show", "dev", kubeproxy.Interface); !strings.Contains(out, " "+extIP+"/32 ") {
			return fmt.Errorf("kube-proxy has not bound %s yet:\n%s", extIP, out)
		}
		return nil
	})
	for _, a := range tcpAddrs {
		e.expectBackends(t, "tcp", a, names(bes))
	}
	e.expectBackends(t, "udp", udpAddr, names(bes))

	// The measurement starts right after one of kube-proxy's periodic
	// syncs, so that none falls inside it: under emulation kube-proxy's own
	// syncs (3-10 s of every 30 s here) refused a few new connections and
	// stalled held ones while kube-proxy alone served, in 5 of 16 early
	// runs; those are kube-proxy's, not the takeover's.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := kp.WaitNextSync(wctx); err != nil {
		t.Fatal(err)
	}
	type held struct {
		conn    *heldConn
		backend string
	}
	var holds []held
	for _, a := range tcpAddrs {
		c, b := e.holdConn(t, a)
		holds = append(holds, held{c, b})
	}
	entriesBefore := e.established(t, tcpAddrs)
	if len(entriesBefore) != len(tcpAddrs) {
		t.Fatalf("IPVS connection entries of the held connections: %q, want %d", entriesBefore, len(tcpAddrs))
	}
	// The timeline, logged if the test fails.
	var timeline []string
	mark := func(what string) { timeline = append(timeline, time.Now().Format("15:04:05.000")+" "+what) }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("timeline:\n%s", strings.Join(timeline, "\n"))
		}
	})
	mark("held connections open")
	// What a broken held connection leaves to explain it (a quiet CI run
	// once lost the masqueraded node port's, 1.3 s after kube-proxy's stop,
	// before ipvs-proxy's first sync): the connection tables, before and
	// at the failure, and the agent's log up to its first sync.
	ctBefore := e.vmRun(t, "vmagent", "conntrack", "--port", fmt.Sprint(nodePort))
	ipvsBefore := e.ipvsadm(t, "-c")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("conntrack entries to port %d when the held connections opened:\n%s\nand now:\n%s", nodePort, ctBefore,
			e.vmRun(t, "vmagent", "conntrack", "--port", fmt.Sprint(nodePort)))
		t.Logf("IPVS connection table when the held connections opened:\n%s\nand now:\n%s", ipvsBefore, e.ipvsadm(t, "-c"))
		t.Logf("the agent's log to its first sync:\n%s", head(e.AgentOutput(), 200))
	})
	var traffics []*traffic
	for _, a := range tcpAddrs {
		traffics = append(traffics, e.startTraffic(t, "tcp", a))
	}
	traffics = append(traffics, e.startTraffic(t, "udp", udpAddr))
	time.Sleep(2 * time.Second) // traffic before the switch (and the wait below)

	// The switch: kube-proxy stops, its state serving; ipvs-proxy takes over.
	stopAt := time.Now()
	mark("kube-proxy told to stop")
	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mark("kube-proxy gone; agent starting")
	if err := e.StartAgent(ctx, "--takeover-kube-proxy"); err != nil {
		t.Fatal(err)
	}
	firstSync := time.Since(start)
	mark("agent's first sync done")
	eventually(t, time.Minute, func() error {
		if !strings.Contains(e.AgentOutput(), `"msg":"took over from kube-proxy"`) {
			return fmt.Errorf("the agent has not finished taking over")
		}
		return nil
	})
	tookOver := time.Since(start)
	mark("takeover done")
	time.Sleep(2 * time.Second) // traffic after the switch
	for _, h := range holds {
		h.conn.expectAnswers(3, h.backend)
	}
	totalAttempts, totalFailed, totalEarly := 0, 0, 0
	for _, tr := range traffics {
		// (The hit's own start lags this host's by the VM agent's round
		// trip: a failure right at the stop may count as the takeover's.)
		attempts, failed, early, errs := tr.stop(t, stopAt)
		t.Logf("takeover: %s: %d new connections, %d failed from kube-proxy's stop on, %d before it %v", tr.name, attempts, failed, early, errs)
		totalAttempts += attempts
		totalFailed += failed
		totalEarly += early
		if attempts < 20 {
			t.Errorf("%s: only %d attempts: the traffic did not run", tr.name, attempts)
		}
	}
	entriesAfter := e.established(t, tcpAddrs)
	for _, en := range entriesBefore {
		if !slices.Contains(entriesAfter, en) {
			t.Errorf("the IPVS connection entry %q is gone after the takeover: %q", en, entriesAfter)
		}
	}
	t0 := traffics[0].started
	t.Logf("takeover timeline since the traffic began: kube-proxy told to stop at %s, gone at %s, first sync at %s, takeover done at %s",
		stopAt.Sub(t0).Round(10*time.Millisecond), start.Sub(t0).Round(10*time.Millisecond), start.Add(firstSync).Sub(t0).Round(10*time.Millisecond),
		start.Add(tookOver).Sub(t0).Round(10*time.Millisecond))
	first := firstFullSync(e.AgentOutput())
	t.Logf("takeover figures: first sync %s after the start (%s), done after %s; %d held connections kept; new connections %d, failed %d (and %d while kube-proxy still ran)",
		firstSync.Round(time.Millisecond), first, tookOver.Round(time.Millisecond), len(holds), totalAttempts, totalFailed, totalEarly)
	if totalFailed > 0 {
		t.Errorf("%d of %d new connections failed during the takeover", totalFailed, totalAttempts)
	}
	e.expectNoKubeProxyState(t)

	// What the takeover left is what a fresh ipvs-proxy programs.
	took := e.programmedState(t)
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	e.vmRun(t, bed.GuestBinary, "cleanup")
	if err := e.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if diff := cmp.Diff(e.programmedState(t), took); diff != "" {
			return fmt.Errorf("the takeover's state differs from a fresh agent's (-fresh +takeover):\n%s", diff)
		}
		return nil
	})

	// Rollback: the agent stops and cleans up, kube-proxy starts.
	for _, a := range tcpAddrs[:1] {
		e.expectBackends(t, "tcp", a, names(bes))
	}
	tr := e.startTraffic(t, "tcp", tcpAddrs[0])
	time.Sleep(time.Second)
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	e.vmRun(t, bed.GuestBinary, "cleanup")
	kp2, err := kubeproxy.Start(ctx, e.Bed, kubeproxy.Options{Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kp2.Stop() })
	var back time.Duration
	eventually(t, 2*time.Minute, func() error {
		res := e.hit(t, "tcp", tcpAddrs[0], 2)
		if res.Total() < 2 {
			return fmt.Errorf("kube-proxy does not serve %s yet: %v", tcpAddrs[0], res.Errors)
		}
		back = time.Since(start)
		return nil
	})
	attempts, failed, _, _ := tr.stop(t, time.Time{})
	t.Logf("rollback figures: Service traffic back %s after the cleanup began; new connections %d, failed %d (one every 50 ms)",
		back.Round(time.Millisecond), attempts, failed)
}

// head is the first n lines of s.
func head(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("... (%d more lines)\n", len(lines)-n))
	}
	return strings.Join(lines, "")
}
