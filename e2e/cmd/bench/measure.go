package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/workload"
)

// The two proxies run with the same periods: a change is synced 100 ms
// after the last, and a full sync runs every 30 s (kube-proxy's default;
// kube-proxy's every sync is full). Both know the cluster CIDR and put
// node ports on eth0.
var ipvsProxyArgs = []string{"--min-sync-period", "100ms", "--sync-period", "30s",
	"--nodeport-addresses", bed.NodePortCIDR, "--cluster-cidr", bed.ClusterCIDR}

var kubeProxyOptions = kubeproxy.Options{MinSyncPeriod: 100 * time.Millisecond, SyncPeriod: 30 * time.Second, NoWait: true}

// The proxies compared, by the names -proxies takes.
const (
	ipvsProxy = "ipvs-proxy"
	// ipvsProxyBound is ipvs-proxy binding one address per clusterIP
	// to its interface (--route-service-cidrs=false), as kube-proxy's
	// IPVS mode does; ipvs-proxy routes the Service range of the
	// cluster's ServiceCIDR as local through it (the default).
	ipvsProxyBound    = "ipvs-proxy-bound"
	kubeProxyIPVS     = "kube-proxy-ipvs"
	kubeProxyNFTables = "kube-proxy-nftables"
)

const (
	ipvsbench = "/usr/local/bin/ipvsbench"
	// helperTimeout bounds one in-VM measurement (kube-proxy at 10,000
	// Services takes many minutes to settle under emulation).
	helperTimeout = 3 * time.Hour
	// notSettled is in ipvsbench settle's error past its -timeout, and
	// notLanded in its latency and burst errors past it.
	notSettled = "not settled"
	notLanded  = "not in the kernel after"
)

// running is a started proxy.
type running interface {
	Stop() error
	Output() string
}

// proxyKind is one of the proxies compared.
type proxyKind struct {
	name string
	comm string // its process name in the VM
	// dataplane is where ipvsbench looks for its Services: "ipvs" (with
	// iface, its dummy interface, and set, its ipset of
	// clusterIP,proto:port) or "nftables".
	dataplane  string
	iface, set string
	// kubeProxy: upstream's, whose every periodic sync is counted as one
	// (kube-proxy's IPVS mode: all full; nftables mode: see printNotes).
	kubeProxy bool
	// ours: ipvs-proxy, whose log tells each sync's parts and which
	// serves its heap profile.
	ours bool
	// start starts it; it may return before or after its first sync.
	start func(ctx context.Context, b *bed.Bed) (running, error)
	// agentArgs are the flags start gives ipvs-proxy (withDebugLog).
	agentArgs []string
}

// boundArgs make ipvs-proxy bind one address per clusterIP.
var boundArgs = []string{"--route-service-cidrs=false"}

var proxyKinds = map[string]proxyKind{
	ipvsProxy: {name: ipvsProxy, comm: "ipvs-proxy", dataplane: "ipvs", iface: bed.Interface, set: "IPVSP-CLUSTER-IP",
		ours: true, start: startAgent()},
	ipvsProxyBound: {name: ipvsProxyBound, comm: "ipvs-proxy", dataplane: "ipvs", iface: bed.Interface, set: "IPVSP-CLUSTER-IP",
		ours: true, agentArgs: boundArgs, start: startAgent(boundArgs...)},
	kubeProxyIPVS: {name: kubeProxyIPVS, comm: "kube-proxy", dataplane: "ipvs", iface: kubeproxy.Interface, set: "KUBE-CLUSTER-IP",
		kubeProxy: true,
		start: func(ctx context.Context, b *bed.Bed) (running, error) {
			o := kubeProxyOptions
			o.Log = logf
			return kubeproxy.Start(ctx, b, o)
		}},
	kubeProxyNFTables: {name: kubeProxyNFTables, comm: "kube-proxy", dataplane: "nftables", kubeProxy: true,
		start: func(ctx context.Context, b *bed.Bed) (running, error) {
			if err := kubeproxy.LoadNFTablesModules(ctx, b.VM); err != nil {
				return nil, err
			}
			o := kubeProxyOptions
			o.Log, o.Mode = logf, kubeproxy.ModeNFTables
			return kubeproxy.Start(ctx, b, o)
		}},
}

// startAgent starts the bed's ipvs-proxy with extra flags. --profiling:
// the bench saves its heap profile after the cold start (heapProfile).
func startAgent(extra ...string) func(ctx context.Context, b *bed.Bed) (running, error) {
	return startAgentAt(bed.GuestBinary, extra...)
}

// startAgentAt is startAgent with the agent at binary in the guest.
func startAgentAt(binary string, extra ...string) func(ctx context.Context, b *bed.Bed) (running, error) {
	return func(ctx context.Context, b *bed.Bed) (running, error) {
		if err := b.StartAgentBinary(ctx, binary, append([]string{"--log-level", "info", "--profiling"}, extra...)...); err != nil {
			return nil, err
		}
		return agent{b}, nil
	}
}

// agent is the bed's ipvs-proxy as a running proxy.
type agent struct{ b *bed.Bed }

func (a agent) Stop() error    { return a.b.StopAgent() }
func (a agent) Output() string { return a.b.AgentOutput() }

// bench holds what every measurement uses.
type bench struct {
	bed    *bed.Bed
	client kubernetes.Interface
	cfg    config
	dp     *dataPath // nil: the data path is not measured
}

// settled is ipvsbench settle's answer (seconds since the proxy started).
type settled struct {
	VirtualServers float64 `json:"virtualServers"`
	Idle           float64 `json:"idle"`
	CPUSelf        float64 `json:"cpuSelf"`
	CPUChildren    float64 `json:"cpuChildren"`
	Checks         int     `json:"checks"`
}

// proxyResult is one proxy's figures at one size.
type proxyResult struct {
	proxy  string
	cold   settled
	change []float64 // seconds, sorted
	burst  float64
	// burstIssued: how long the apiserver took to accept the burst's
	// updates (part of burst, the same for any proxy).
	burstIssued float64
	resync      []float64 // changes made during a periodic full sync, sorted
	// busy: changes made while ipvs-proxy's resync and glue check run
	// (-busy-rounds), sorted; busyWindow: the span they were spread
	// over, in seconds.
	busy       []float64
	busyWindow float64
	// resyncTries: changes made once the proxy woke up, inside a full
	// sync or not.
	resyncTries int
	rssKiB      int
	restart     settled
	// overBound: the cold start did not settle within the bound (-bound);
	// nothing else was measured.
	overBound bool
	bound     time.Duration
	// changeOver, burstOver, restartOver: that measure did not end within
	// the bound; it and those after it were not measured.
	changeOver, burstOver, restartOver bool
	// restartDiff counts kernel lines that differ before and after the
	// restart, by kind; restartWrites are the writes the proxy counted
	// itself (-1: it does not say).
	restartDiff   map[string]int
	restartWrites int
	// ipvs-proxy's own account of its first sync.
	coldSync []syncRecord
	data     dataPathResult
}

// helper runs ipvsbench in the VM and decodes its JSON answer into out.
func (bn *bench) helper(ctx context.Context, out any, args ...string) error {
	return bn.guestJSON(ctx, out, append([]string{ipvsbench}, args...))
}

// clean stops nothing: no proxy may run. It removes both proxies' state
// from the kernel and checks that IPVS is empty.
func (bn *bench) clean(ctx context.Context) error {
	for _, p := range proxyKinds {
		r, err := bn.bed.VM.Run(ctx, "pidof", p.comm)
		if err != nil {
			return fmt.Errorf("%s still runs (pidof: %q, %w)", p.name, r.Stdout, err)
		}
		if r.ExitCode == 0 {
			return fmt.Errorf("%s still runs (pidof: %q)", p.name, r.Stdout)
		}
	}
	said, err := kubeproxy.Cleanup(ctx, bn.bed)
	if err != nil {
		return fmt.Errorf("cleanup: %w\n%s", err, said)
	}
	if _, err := kubeproxy.CleanupNFTables(ctx, bn.bed.VM); err != nil {
		return err
	}
	if out, _ := bn.bed.IPVSTable(ctx); strings.Contains(out, "\nTCP ") {
		var left []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "TCP ") || strings.HasPrefix(l, "UDP ") {
				left = append(left, l)
			}
		}
		routes, _ := bn.bed.VM.Run(ctx, "ip", "route", "show", "table", "local", "type", "local")
		return fmt.Errorf("IPVS not empty after the cleanup: %d virtual servers left, the first %q; the cleanup said:\n%s\nlocal routes:\n%.3000s",
			len(left), left[:min(len(left), 5)], said, routes.Stdout)
	}
	if err := reloadIPVS(ctx, bn.bed.VM); err != nil {
		return err
	}
	// Deleting thousands of addresses leaves the kernel work to finish in
	// the background; let it, so that what comes next is timed alone.
	time.Sleep(5 * time.Second)
	return nil
}

// reloadIPVS unloads the IPVS modules and loads them again. IPVS keeps a
// deleted real server for two to three minutes in a list (its "trash",
// for connections that still point at it) that every later add of a real
// server walks: right after a cleanup of 100,000 real servers the next
// proxy's cold sync would pay for the last one's deletes (ipvs-proxy
// with bound addresses at 2,000 × 50: 3m0.7s after ipvs-proxy's cleanup,
// 11.4s on a fresh kernel). Unloading frees the list; a node starting its
// proxy after a boot has none either.
func reloadIPVS(ctx context.Context, v *vm.VM) error {
	out, err := v.RunOK(ctx, "cat", "/proc/modules")
	if err != nil {
		return fmt.Errorf("reloading IPVS: %w", err)
	}
	var users []string // every ip_vs module but ip_vs itself
	loaded := false
	for _, l := range strings.Split(out, "\n") {
		switch name, _, _ := strings.Cut(l, " "); {
		case name == "ip_vs":
			loaded = true
		case strings.HasPrefix(name, "ip_vs_"):
			users = append(users, name)
		}
	}
	if !loaded {
		return fmt.Errorf("reloading IPVS: ip_vs is not a loaded module:\n%s", out)
	}
	steps := [][]string{{"rmmod", "ip_vs"}, append([]string{"modprobe", "-a", "ip_vs"}, users...)}
	if len(users) > 0 { // the modules that use ip_vs go before it
		steps = slices.Insert(steps, 0, append([]string{"rmmod"}, users...))
	}
	for _, argv := range steps {
		if _, err := v.RunOK(ctx, argv...); err != nil {
			return fmt.Errorf("reloading IPVS: %s: %w", strings.Join(argv, " "), err)
		}
	}
	logf("IPVS modules reloaded (ip_vs and %d schedulers and helpers): no deleted real servers kept", len(users))
	return nil
}

// writeExpected writes the Services as they are now into the VM.
func (bn *bench) writeExpected(ctx context.Context, path string) ([]service, []string, error) {
	exp, names, err := expected(ctx, bn.client)
	if err != nil {
		return nil, nil, err
	}
	data, err := json.Marshal(exp)
	if err != nil {
		return nil, nil, err
	}
	return exp, names, bn.bed.VM.WriteFile(ctx, path, data, 0o644)
}

// settle starts p and follows it with ipvsbench settle until everything
// is programmed and it is idle. kube-proxy v1.36.3 sometimes dies at its
// start (see package kubeproxy): then its state is removed and it is
// started again, up to three times.
func (bn *bench) settle(ctx context.Context, p proxyKind, cold bool) (settled, running, error) {
	const expect = "/tmp/expect.json"
	exp, _, err := bn.writeExpected(ctx, expect)
	if err != nil {
		return settled{}, nil, err
	}
	for try := 1; ; try++ {
		type started struct {
			r   running
			err error
		}
		ch := make(chan started, 1)
		var s settled
		var errSettle error
		done := make(chan struct{})
		go func() {
			defer close(done)
			args := []string{"settle", "-comm", p.comm, "-expect", expect, "-dataplane", p.dataplane,
				"-quiet", bn.cfg.quiet.String(), "-timeout", bn.cfg.bound.String()}
			if p.dataplane == "ipvs" {
				args = append(args, "-iface", p.iface, "-set", p.set)
			}
			errSettle = bn.helper(ctx, &s, args...)
		}()
		time.Sleep(time.Second) // ipvsbench settle is up and looking
		go func() {
			r, err := p.start(ctx, bn.bed)
			ch <- started{r, err}
		}()
		if p.ours && cold && bn.cfg.cpuProfile > 0 {
			go bn.cpuProfile(ctx, p.name, len(exp), bn.cfg.cpuProfile)
		}
		<-done
		st := <-ch
		if errSettle == nil && st.err == nil {
			return s, st.r, nil
		}
		out := ""
		if st.r != nil {
			out = st.r.Output()
			_ = st.r.Stop()
		}
		err := errors.Join(errSettle, st.err)
		if !p.kubeProxy || try == 3 || !cold || ctx.Err() != nil || !strings.Contains(err.Error(), "has ended") {
			return s, nil, fmt.Errorf("%w\n%s", err, tailLines(out, 60))
		}
		logf("%s died before it settled; starting it again on a clean kernel, as a kubelet would:\n%s", p.name, tailLines(out, 20))
		if err := bn.clean(ctx); err != nil {
			return s, nil, err
		}
	}
}

func (bn *bench) measure(ctx context.Context, p proxyKind, n int) (proxyResult, error) {
	r := proxyResult{proxy: p.name, restartWrites: -1, bound: bn.cfg.bound}
	if p.ours && bn.cfg.gctrace {
		p = withGCTrace(p)
	}
	if err := bn.clean(ctx); err != nil {
		return r, err
	}
	// 1. Cold: into a clean kernel.
	cold, proc, err := bn.settle(ctx, p, true)
	if err != nil && strings.Contains(err.Error(), notSettled) {
		// Past the bound: reported as such, not waited on; its other
		// figures are not measured.
		logf("%s, %d Services, cold: not programmed and idle within %v: %v", p.name, n, bn.cfg.bound, err)
		r.overBound = true
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("cold start: %w", err)
	}
	defer func() {
		if proc != nil {
			_ = proc.Stop()
		}
	}()
	r.cold = cold
	coldLines := 0
	if p.ours {
		r.coldSync = syncs(proc.Output())
		// The first sync's parts, as soon as they are there.
		lines := fullSyncLines(proc.Output())
		for _, l := range lines {
			logf("%s, %d Services, cold: %s", p.name, n, l)
		}
		coldLines = len(lines)
		if tl := startTimeline(proc.Output()); tl != "" {
			logf("%s, %d Services, cold: from the first log line: %s; every virtual server %.2fs and idle %.2fs after the process started",
				p.name, n, tl, cold.VirtualServers, cold.Idle)
		}
		if path, err := bn.heapProfile(ctx, p.name, n); err != nil {
			logf("%s, %d Services: no heap profile: %v", p.name, n, err)
		} else {
			logf("%s, %d Services: heap profile after the cold start: go tool pprof -sample_index=inuse_space %s", p.name, n, path)
		}
	}
	logf("%s, %d Services, cold: every virtual server after %.3fs, everything and idle after %.3fs (%d checks), CPU %.2fs + %.2fs (children)",
		p.name, n, cold.VirtualServers, cold.Idle, cold.Checks, cold.CPUSelf, cold.CPUChildren)
	if bn.dp != nil {
		if r.data, err = bn.measureDataPath(ctx, p, n); err != nil {
			return r, err
		}
	}
	if !bn.cfg.controlPlaneAt(n) {
		return r, nil
	}

	exp, names, err := expected(ctx, bn.client)
	if err != nil {
		return r, err
	}
	vip := map[string]string{}
	for i, s := range exp {
		vip[names[i]] = fmt.Sprintf("%s:%d", s.VIP, s.Port)
	}
	single := workload.ServiceName(n / 2)
	changeArgs := []string{"-kubeconfig", bed.GuestKubecfg, "-namespace", namespace, "-timeout", bn.cfg.bound.String(),
		"-dataplane", p.dataplane}

	// 2. Single changes.
	var lat struct {
		Seconds []float64 `json:"seconds"`
		At      []float64 `json:"at"`
		Poll    []float64 `json:"poll"`
	}
	err = bn.helper(ctx, &lat, append([]string{"latency", "-slice", single, "-vs", vip[single],
		"-rounds", strconv.Itoa(bn.cfg.rounds)}, changeArgs...)...)
	if r.changeOver = pastBound(p, n, "one change", err, notLanded); r.changeOver {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.change = slices.Sorted(slices.Values(lat.Seconds))
	logf("%s, %d Services: one change %v (each seen by a read of %v s)", p.name, n, lat.Seconds, lat.Poll)

	// 3. A burst of changes, to Services other than the single one.
	var spec []map[string]string
	for k := 0; k < bn.cfg.burst; k++ {
		name := workload.ServiceName(k*n/bn.cfg.burst + 1)
		spec = append(spec, map[string]string{"slice": name, "vs": vip[name]})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return r, err
	}
	if err := bn.bed.VM.WriteFile(ctx, "/tmp/burst.json", data, 0o644); err != nil {
		return r, err
	}
	var burst struct {
		Seconds float64 `json:"seconds"`
		Issued  float64 `json:"issued"`
	}
	err = bn.helper(ctx, &burst, append([]string{"burst", "-changes", "/tmp/burst.json"}, changeArgs...)...)
	if r.burstOver = pastBound(p, n, "burst", err, notLanded); r.burstOver {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.burst, r.burstIssued = burst.Seconds, burst.Issued
	logf("%s, %d Services: %d changes in %.3fs (issued in %.3fs)", p.name, n, bn.cfg.burst, burst.Seconds, burst.Issued)
	if r.rssKiB, err = bn.peakRSS(ctx, p, n, "cold start, changes and burst", proc.Output()); err != nil {
		return r, err
	}

	// 4. A restart with nothing changed.
	before, err := bn.snapshot(ctx, p)
	if err != nil {
		return r, err
	}
	err = proc.Stop()
	proc = nil
	if err != nil {
		return r, err
	}
	// The busy rounds' process: with -busy-debug its every sync is logged.
	r.restart, proc, err = bn.settle(ctx, bn.busyProcess(p), false)
	if r.restartOver = pastBound(p, n, "restart", err, notSettled); r.restartOver {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("restart: %w", err)
	}
	after, err := bn.snapshot(ctx, p)
	if err != nil {
		return r, err
	}
	r.restartDiff = map[string]int{}
	for kind := range before {
		r.restartDiff[kind] = diffCount(before[kind], after[kind])
	}
	if p.ours {
		if s := syncs(proc.Output()); len(s) > 0 {
			r.restartWrites = s[0].writes
		}
	}
	logf("%s, %d Services: restart: everything and idle after %.3fs (%d checks), kernel lines changed %v, writes it counted %d",
		p.name, n, r.restart.Idle, r.restart.Checks, r.restartDiff, r.restartWrites)

	// 5. Single changes made while a periodic full sync runs.
	if err := bn.duringSync(ctx, p, &r, proc, append([]string{"latency", "-slice", single, "-vs", vip[single],
		"-during-sync-of", p.comm}, changeArgs...)); err != nil {
		return r, err
	}
	if err := bn.whileBusy(ctx, p, &r, proc, append([]string{"latency", "-slice", single, "-vs", vip[single]}, changeArgs...)); err != nil {
		return r, err
	}
	if p.ours {
		// Where the full syncs' time went: the proxy's own account.
		for _, l := range fullSyncLines(proc.Output())[coldLines:] {
			logf("%s, %d Services: %s", p.name, n, l)
		}
	}
	rss, err := bn.peakRSS(ctx, p, n, "restart and periodic syncs", proc.Output())
	if err != nil {
		return r, err
	}
	r.rssKiB = max(r.rssKiB, rss)
	return r, nil
}

// pastBound tells whether err is a measure's helper giving up at the bound
// (its message holds marker), and logs it: that measure is reported as
// "> bound" and the proxy is not measured further at that shape.
func pastBound(p proxyKind, n int, what string, err error, marker string) bool {
	if err == nil || !strings.Contains(err.Error(), marker) {
		return false
	}
	logf("%s, %d Services, %s: not done within the bound, not measured further: %v", p.name, n, what, err)
	return true
}

var fullSyncLog = regexp.MustCompile(`"msg":"(synced".*"kind":"full"|iptables glue synced".*"full":true|iptables glue checked"|full resync complete").*`)

// startTimeline tells, from ipvs-proxy's JSON log, when its start's steps
// ended, in seconds after its first line: the wait for the initial lists,
// their arrival, and the first sync ("" if a step is not in the log).
func startTimeline(log string) string {
	steps := []struct{ name, msg string }{
		{"watching", "waiting for the initial list of Services, EndpointSlices and the Node"},
		{"lists received", "initial list received"},
		{"first sync done", "synced"},
	}
	var first float64
	var out []string
	for _, l := range strings.Split(log, "\n") {
		var e struct {
			TS  float64 `json:"ts"`
			Msg string  `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &e) != nil || e.TS == 0 {
			continue
		}
		if first == 0 {
			first = e.TS
		}
		if len(out) < len(steps) && e.Msg == steps[len(out)].msg {
			out = append(out, fmt.Sprintf("%s %.2fs", steps[len(out)].name, e.TS-first))
		}
	}
	if len(out) < len(steps) {
		return ""
	}
	return strings.Join(out, ", ")
}

// fullSyncLines are the log lines of ipvs-proxy's full syncs: the whole
// sync with its IPVS part, kernel read and consumers, the glue's part with
// its own parts (a full sync in the loop, or a check read off the loop and
// applied later), and the end of each sliced resync.
func fullSyncLines(log string) []string {
	return fullSyncLog.FindAllString(log, -1)
}

// duringSync times changes made once p's periodic sync has begun (args:
// ipvsbench latency's). kube-proxy's every sync is full; ipvs-proxy's log
// tells whether a change fell inside a full sync, and changes that did
// not (other work woke it) are made again, up to three times as many.
func (bn *bench) duringSync(ctx context.Context, p proxyKind, r *proxyResult, proc running, args []string) error {
	want := bn.cfg.resyncRounds
	if want == 0 || p.dataplane == "nftables" {
		// kube-proxy's nftables mode syncs in full once an hour; its
		// 30 s syncs are partial (and cheap when nothing changed).
		return nil
	}
	var all []float64
	for attempt := 0; len(r.resync) < want && attempt < 3*want; attempt++ {
		var lat struct {
			Seconds []float64 `json:"seconds"`
			At      []float64 `json:"at"`
		}
		rounds := 1
		if p.kubeProxy {
			rounds = want
		}
		if err := bn.helper(ctx, &lat, append(args, "-rounds", strconv.Itoa(rounds))...); err != nil {
			// A proxy that never goes quiet (one full sync after
			// another) gives no start of a sync to aim at: a try
			// without a figure.
			if !strings.Contains(err.Error(), "no quiet period") {
				return err
			}
			logf("%s: %v", p.name, err)
			r.resyncTries++
			continue
		}
		all = append(all, lat.Seconds...)
		for i, t := range lat.At {
			if p.kubeProxy || inFullSync(proc.Output(), []float64{t}) == 1 {
				r.resync = append(r.resync, lat.Seconds[i])
			}
		}
	}
	slices.Sort(r.resync)
	r.resyncTries += len(all)
	logf("%s: one change during a periodic sync %v; %d of them inside a full sync %v", p.name, all, len(r.resync), r.resync)
	return nil
}

// peakRSS is the proxy's VmHWM in KiB, read with the rest of its status,
// which logMemory splits for ipvs-proxy (when: what the process has done;
// log: its output).
func (bn *bench) peakRSS(ctx context.Context, p proxyKind, n int, when, log string) (int, error) {
	out, err := bn.bed.VM.RunOK(ctx, "sh", "-c", "cat /proc/$(pidof "+p.comm+")/status")
	if err != nil {
		return 0, err
	}
	m := vmHWMLine.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no VmHWM in %q", out)
	}
	bn.logMemory(ctx, p, n, when, out, log)
	return strconv.Atoi(m[1])
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// snapshot is the kernel state a proxy programs, as lines by kind: the
// IPVS table (ipvsadm -Sn: virtual servers with their flags and
// scheduler, real servers with their weights), the addresses on its
// interface, every ipset with its entries (ipset save) and the iptables
// rules of both families (without counters).
func (bn *bench) snapshot(ctx context.Context, p proxyKind) (map[string][]string, error) {
	out := map[string][]string{}
	lines := func(kind string, keep func(string) (string, bool), argv ...string) error {
		text, err := bn.bed.VM.RunOK(ctx, argv...)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(text, "\n") {
			if l, ok := keep(l); ok {
				out[kind] = append(out[kind], l)
			}
		}
		return nil
	}
	all := func(l string) (string, bool) { return l, l != "" }
	errs := []error{
		lines("IPVS", all, "ipvsadm", "-Sn"),
		lines("ipset", all, "ipset", "save"),
	}
	if p.iface != "" {
		errs = append(errs, lines("VIPs", func(l string) (string, bool) {
			f := strings.Fields(l)
			return strings.Join(f[:min(len(f), 2)], " "), len(f) > 1 && f[0] == "inet"
		}, "ip", "addr", "show", "dev", p.iface))
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		errs = append(errs, lines("iptables", func(l string) (string, bool) {
			return counters.ReplaceAllString(l, ""), l != "" && !strings.HasPrefix(l, "#")
		}, tool))
	}
	if p.dataplane == "nftables" {
		text, err := bn.bed.VM.RunOK(ctx, "nft", "list", "table", "ip", kubeproxy.NFTablesTable)
		out["nftables"] = nftLines(text)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

var nftCounter = regexp.MustCompile(`\s*counter packets \d+ bytes \d+`)

// nftLines is `nft list table` as lines to compare as a multiset: a set's
// or map's elements one per line (their order follows the kernel's hash,
// which a new set draws afresh), counters left out.
func nftLines(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(nftCounter.ReplaceAllString(l, ""))
		l = strings.TrimPrefix(l, "elements = {")
		l = strings.TrimSuffix(l, "}")
		if !strings.Contains(l, " : ") && !strings.Contains(l, ",") || strings.Contains(l, "{") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
			continue
		}
		for _, e := range strings.Split(l, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}

// diffCount is the number of lines in one of a and b and not in the other
// (as multisets).
func diffCount(a, b []string) int {
	count := map[string]int{}
	for _, l := range a {
		count[l]++
	}
	for _, l := range b {
		count[l]--
	}
	n := 0
	for _, c := range count {
		n += max(c, -c)
	}
	return n
}

var fullSyncLine = regexp.MustCompile(`"ts":([0-9.e+]+).*"msg":"synced".*"kind":"full".*"took":([0-9.e-]+)`)

// inFullSync counts the times (Unix seconds) that fall inside one of the
// full syncs in ipvs-proxy's log.
func inFullSync(log string, at []float64) int {
	n := 0
	for _, t := range at {
		for _, m := range fullSyncLine.FindAllStringSubmatch(log, -1) {
			end, _ := strconv.ParseFloat(m[1], 64)
			took, _ := strconv.ParseFloat(m[2], 64)
			if end-took <= t && t <= end {
				n++
				break
			}
		}
	}
	return n
}

// floorResult compares ipvs-proxy's cold sync with bare netlink calls.
type floorResult struct {
	floor, addrs time.Duration
	calls        int
	adoptWrites  int
}

// floor creates the objects with bare netlink calls, one at a time, in a
// clean kernel, then starts ipvs-proxy on that kernel and counts its
// writes.
func (bn *bench) floor(ctx context.Context, n int) (floorResult, error) {
	var fr floorResult
	if err := bn.clean(ctx); err != nil {
		return fr, err
	}
	if _, _, err := bn.writeExpected(ctx, "/tmp/floor.json"); err != nil {
		return fr, err
	}
	var fl struct {
		Seconds        float64 `json:"seconds"`
		AddressSeconds float64 `json:"addressSeconds"`
		Calls          int     `json:"calls"`
	}
	if err := bn.helper(ctx, &fl, "floor", "/tmp/floor.json"); err != nil {
		return fr, err
	}
	fr.floor, fr.calls = time.Duration(fl.Seconds*float64(time.Second)), fl.Calls
	fr.addrs = time.Duration(fl.AddressSeconds * float64(time.Second))
	if err := bn.bed.StartAgent(ctx, "--log-level", "info"); err != nil {
		return fr, err
	}
	s := syncs(bn.bed.AgentOutput())
	if err := bn.bed.StopAgent(); err != nil {
		return fr, err
	}
	if len(s) == 0 {
		return fr, errors.New("no first sync in the agent's log")
	}
	fr.adoptWrites = s[0].writes
	logf("%d Services: floor %v (binding the VIPs: %v), %d calls; ipvs-proxy's writes on it: %d", n, fr.floor, fr.addrs, fr.calls, fr.adoptWrites)
	return fr, nil
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// heapProfile saves ipvs-proxy's heap profile (its --profiling endpoint on
// its debug address, reached through the VM agent's dial) to
// bin/bench/heap-<proxy>-<n>.pb.gz: what it keeps once idle
// (inuse_space) and what its start allocated (alloc_space).
func (bn *bench) heapProfile(ctx context.Context, proxy string, n int) (string, error) {
	return bn.profile(ctx, "heap", 0, fmt.Sprintf("bin/bench/heap-%s-%d.pb.gz", proxy, n))
}

// cpuProfile saves a CPU profile of ipvs-proxy's first d of its start (-cpu-profile)
// to bin/bench/cpu-<proxy>-<n>.pb.gz, once its endpoint answers (the
// process's first second or so is not in it).
func (bn *bench) cpuProfile(ctx context.Context, proxy string, n int, d time.Duration) {
	path := fmt.Sprintf("bin/bench/cpu-%s-%d.pb.gz", proxy, n)
	for try := 0; try < 50 && ctx.Err() == nil; try++ {
		_, err := bn.profile(ctx, "profile", d, path)
		if err == nil {
			logf("%s, %d Services: CPU profile of its start: go tool pprof %s", proxy, n, path)
			return
		}
		if !strings.Contains(err.Error(), "connect") && !strings.Contains(err.Error(), "refused") {
			logf("%s, %d Services: no CPU profile: %v", proxy, n, err)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentDebugAddr is where the agent serves /debug/pprof/ with --profiling:
// its --debug-bind-address's default (config.DefaultDebugBindAddress; the
// metrics address 10249 serves no profiles).
const agentDebugAddr = "127.0.0.1:10247"

// profile saves the --profiling endpoint's profile kind (of seconds d,
// if not 0) to path.
func (bn *bench) profile(ctx context.Context, kind string, d time.Duration, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute+d)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return bn.bed.VM.Dial(ctx, addr)
	}}}
	url := "http://" + agentDebugAddr + "/debug/pprof/" + kind
	if d > 0 {
		url += fmt.Sprintf("?seconds=%d", int(d.Seconds()))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("get the %s profile: %w", kind, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read the %s profile: %w", kind, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("get the %s profile: %s: %.200s", kind, resp.Status, body)
	}
	if err := os.MkdirAll("bin/bench", 0o755); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, body, 0o644)
}
