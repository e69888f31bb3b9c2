package main

// The data path (-datapath): what a packet pays through each proxy, with
// the shape's Services programmed. One NodePort Service of its own, with
// two real backends ("pods" in namespaces on the node), is programmed by
// every proxy beside the shape's; a client pod (a namespace in the
// cluster CIDR) and the outside client (the bed's client namespace,
// outside the cluster CIDR, routed to the node) open short connections
// through it with vmagent connrate, and the pod downloads one long
// stream through its clusterIP.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// dataPathNamespace holds the data path's Service, apart from the
// shape's (expected lists namespace bench only).
const dataPathNamespace = "datapath"

// dataPath is where the data path is measured.
type dataPath struct {
	clusterIP string // clusterIP:port
	nodePort  string // the node's address:node port
	pod       string // the client pod's namespace
}

// connRate is vmagent connrate's answer.
type connRate struct {
	Answered   int      `json:"answered"`
	Failed     int      `json:"failed"`
	PerSecond  float64  `json:"perSecond"`
	ConnectP50 float64  `json:"connectP50"`
	ConnectP99 float64  `json:"connectP99"`
	Errors     []string `json:"errors"`
}

// dataPathResult is one proxy's data path at one shape.
type dataPathResult struct {
	cluster, nodePort connRate
	streamMiBps       float64
	// proxyCPU: the proxy's CPU (with its children's) while the data path
	// was measured: a proxy busy then takes the emulated CPUs from the
	// packets.
	proxyCPU float64
	measured bool
}

// setupDataPath starts two backends and a client pod on the node and
// creates the NodePort Service in front of the backends, with its
// EndpointSlice. No proxy runs yet: each programs it at its cold start.
func setupDataPath(ctx context.Context, b *bed.Bed) (*dataPath, error) {
	if _, err := b.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dataPathNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("data path: namespace: %w", err)
	}
	var bes []bed.Backend
	for range 3 { // two endpoints, then the client pod
		be, err := b.AddBackend(ctx, bed.NodeName)
		if err != nil {
			return nil, fmt.Errorf("data path: %w", err)
		}
		bes = append(bes, be)
	}
	svc, err := b.Client.CoreV1().Services(dataPathNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dp"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{bed.Port("http", corev1.ProtocolTCP, 80)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("data path: service: %w", err)
	}
	if err := b.SetEndpoints(ctx, svc, discoveryv1.AddressTypeIPv4, bes[:2]); err != nil {
		return nil, fmt.Errorf("data path: %w", err)
	}
	dp := &dataPath{clusterIP: svc.Spec.ClusterIP + ":80", pod: bes[2].Name,
		nodePort: bed.NodeAddr + ":" + strconv.Itoa(int(svc.Spec.Ports[0].NodePort))}
	logf("data path: Service %s/dp at %s and node port %s, endpoints %s and %s, client pod %s (%s), outside client %s (%s)",
		dataPathNamespace, dp.clusterIP, dp.nodePort, bes[0].Addr, bes[1].Addr, bes[2].Name, bes[2].Addr, bed.ClientNetns, bed.ClientAddr)
	return dp, nil
}

// measureDataPath measures p's data path once it answers on both paths:
// short connections from the pod to the clusterIP, from outside to the
// node port, then one stream from the pod through the clusterIP.
func (bn *bench) measureDataPath(ctx context.Context, p proxyKind, n int) (dataPathResult, error) {
	var r dataPathResult
	dp := bn.dp
	for _, path := range [][2]string{{dp.pod, dp.clusterIP}, {bed.ClientNetns, dp.nodePort}} {
		if err := bn.waitAnswer(ctx, path[0], path[1]); err != nil {
			return r, fmt.Errorf("%s: data path: %w", p.name, err)
		}
	}
	cpu0, err := bn.procCPU(ctx, p.comm)
	if err != nil {
		return r, err
	}
	conns := []string{"-n", strconv.Itoa(bn.cfg.datapathConns), "-workers", strconv.Itoa(bn.cfg.datapathWorkers), "-limit", "3m"}
	if err := bn.guestJSON(ctx, &r.cluster, inNetns(dp.pod, append([]string{"connrate", "-addr", dp.clusterIP}, conns...))); err != nil {
		return r, err
	}
	if err := bn.guestJSON(ctx, &r.nodePort, inNetns(bed.ClientNetns, append([]string{"connrate", "-addr", dp.nodePort}, conns...))); err != nil {
		return r, err
	}
	var dl struct {
		MiBps float64 `json:"mibps"`
	}
	if err := bn.guestJSON(ctx, &dl, []string{"vmagent", "download", "--netns", dp.pod, "--addr", dp.clusterIP,
		"--size", strconv.FormatInt(bn.cfg.datapathStreamMiB<<20, 10), "--timeout", "3m"}); err != nil {
		return r, err
	}
	r.streamMiBps = dl.MiBps
	cpu1, err := bn.procCPU(ctx, p.comm)
	if err != nil {
		return r, err
	}
	r.proxyCPU, r.measured = cpu1-cpu0, true
	logf("%s, %d Services, data path: clusterIP from a pod %.0f conn/s, connect p50 %s p99 %s (%d failed); node port from outside %.0f conn/s, connect p50 %s p99 %s (%d failed); one stream %.0f MiB/s; the proxy's CPU meanwhile %.2fs",
		p.name, n, r.cluster.PerSecond, secs(r.cluster.ConnectP50), secs(r.cluster.ConnectP99), r.cluster.Failed,
		r.nodePort.PerSecond, secs(r.nodePort.ConnectP50), secs(r.nodePort.ConnectP99), r.nodePort.Failed, r.streamMiBps, r.proxyCPU)
	for _, c := range []connRate{r.cluster, r.nodePort} {
		if len(c.Errors) > 0 {
			logf("%s, %d Services, data path: failures, the first: %q", p.name, n, c.Errors)
		}
	}
	return r, nil
}

// inNetns is argv of vmagent run in the named namespace (every socket of
// the process there).
func inNetns(ns string, vmagentArgs []string) []string {
	return append([]string{"vmagent", "netns", "exec", ns, "--", "vmagent"}, vmagentArgs...)
}

// waitAnswer waits up to a minute for a connection from namespace ns to
// addr to be answered: the proxy has programmed the path.
func (bn *bench) waitAnswer(ctx context.Context, ns, addr string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		hit, err := bn.bed.VM.Hit(ctx, nettest.HitConfig{Netns: ns, Proto: "tcp", Addr: addr, N: 1, Timeout: 2 * time.Second})
		if err != nil {
			return err
		}
		if hit.Total() == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer from %s to %s within a minute: %q", ns, addr, hit.Errors)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// procCPU is the CPU seconds of the process named comm and of its waited
// children, from /proc/PID/stat (utime, stime, cutime, cstime in 1/100 s).
func (bn *bench) procCPU(ctx context.Context, comm string) (float64, error) {
	out, err := bn.bed.VM.RunOK(ctx, "sh", "-c", "cat /proc/$(pidof "+comm+")/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu of %s: %w", comm, err)
	}
	return statCPU(out)
}

// statCPU reads utime+stime+cutime+cstime of a /proc/PID/stat line, in
// seconds (USER_HZ 100).
func statCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("stat %q: too short", stat)
	}
	ticks := 0
	for _, s := range f[11:15] { // fields 14-17, after pid and comm
		t, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", stat, err)
		}
		ticks += t
	}
	return float64(ticks) / 100, nil
}

// guestJSON runs argv in the VM and decodes its JSON answer into out.
func (bn *bench) guestJSON(ctx context.Context, out any, argv []string) error {
	r, err := bn.bed.VM.Exec(ctx, vm.Command{Argv: argv, Timeout: helperTimeout})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("%s: exit status %d: %s", strings.Join(argv, " "), r.ExitCode, strings.TrimSpace(r.Stderr))
	}
	if err := json.Unmarshal([]byte(r.Stdout), out); err != nil {
		return fmt.Errorf("%s: answer %q: %w", strings.Join(argv, " "), r.Stdout, err)
	}
	return nil
}

// dataRows are the data path's rows of a shape's table, shown when some
// proxy's data path was measured there. Ratios to ipvs-proxy: above 1
// for a rate or a stream, the other proxy carries more; for a latency,
// its connections wait longer.
var dataRows = append(append(connRows("clusterIP from a pod", func(d dataPathResult) connRate { return d.cluster }),
	connRows("node port from outside", func(d dataPathResult) connRate { return d.nodePort })...),
	row{"data path: one stream through a clusterIP, from a pod",
		func(r proxyResult) string { return ifMeasured(r, fmt.Sprintf("%.0f MiB/s", r.data.streamMiBps)) },
		func(r proxyResult) []float64 { return []float64{r.data.streamMiBps} }},
	row{"data path: the proxy's CPU meanwhile",
		func(r proxyResult) string { return ifMeasured(r, fmt.Sprintf("%.2fs", r.data.proxyCPU)) }, nil})

// connRows are one path's rows: new connections a second, and connect
// latency p50 / p99.
func connRows(path string, get func(dataPathResult) connRate) []row {
	return []row{
		{"data path: " + path + ", new connections/s",
			func(r proxyResult) string {
				c := get(r.data)
				s := fmt.Sprintf("%.0f/s", c.PerSecond)
				if c.Failed > 0 {
					s += fmt.Sprintf(" (%d failed)", c.Failed)
				}
				return ifMeasured(r, s)
			},
			func(r proxyResult) []float64 { return []float64{get(r.data).PerSecond} }},
		{"data path: " + path + ", connect p50 / p99",
			func(r proxyResult) string {
				c := get(r.data)
				return ifMeasured(r, fineSecs(c.ConnectP50)+" / "+fineSecs(c.ConnectP99))
			},
			func(r proxyResult) []float64 { c := get(r.data); return []float64{c.ConnectP50, c.ConnectP99} }},
	}
}

// ifMeasured is v, or "-" where the proxy's data path was not measured.
func ifMeasured(r proxyResult, v string) string {
	if !r.data.measured {
		return "-"
	}
	return v
}

// fineSecs prints a short latency to 10 µs.
func fineSecs(v float64) string {
	if v <= 0 {
		return "-"
	}
	return time.Duration(v * float64(time.Second)).Round(10 * time.Microsecond).String()
}

// rowsOf are a shape's rows: the data path's too where it was measured.
func rowsOf(sr sizeResult) []row {
	for _, p := range sr.proxies {
		if p.data.measured {
			return append(slices.Clone(rows), dataRows...)
		}
	}
	return rows
}

// scaleOf is the cost of scale of each proxy's data path: its figures at
// the largest shape over its own at the smallest, for the proxies
// measured at both; each other proxy's column over ipvs-proxy's. False
// when fewer than two shapes have data path figures.
func scaleOf(tables []sizeResult) (sizeFigures, bool) {
	var small, large *sizeResult
	for i := range tables {
		t := &tables[i]
		if !slices.ContainsFunc(t.proxies, func(p proxyResult) bool { return p.data.measured }) {
			continue
		}
		if small == nil || t.services < small.services {
			small = t
		}
		if large == nil || t.services > large.services {
			large = t
		}
	}
	if small == nil || small.services == large.services {
		return sizeFigures{}, false
	}
	f := sizeFigures{Shape: fmt.Sprintf("data path at %d Services / at %d, each proxy against itself", large.services, small.services)}
	scale := map[string][]float64{} // by row and proxy
	for _, r := range dataRows {
		if r.ratio == nil {
			continue
		}
		rf := rowFigure{Label: r.label}
		for _, lp := range large.proxies {
			sp, ok := findProxy(small.proxies, lp.proxy)
			if !ok || !lp.data.measured || !sp.data.measured {
				continue
			}
			if len(f.Rows) == 0 {
				f.Proxies = append(f.Proxies, lp.proxy)
			}
			q := quotients(r.ratio(lp), r.ratio(sp))
			scale[lp.proxy] = q
			rf.Values = append(rf.Values, joinRatios(q))
		}
		ip, ok := scale[ipvsProxy]
		for p, q := range scale {
			if ok && p != ipvsProxy {
				if rf.Ratios == nil {
					rf.Ratios = map[string]string{}
				}
				rf.Ratios[p] = joinRatios(quotients(q, ip))
			}
		}
		clear(scale)
		f.Rows = append(f.Rows, rf)
	}
	return f, true
}

func findProxy(ps []proxyResult, name string) (proxyResult, bool) {
	i := slices.IndexFunc(ps, func(p proxyResult) bool { return p.proxy == name })
	if i < 0 {
		return proxyResult{}, false
	}
	return ps[i], true
}

// quotients is a[i]/b[i], 0 where either is not positive.
func quotients(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		if i < len(b) && a[i] > 0 && b[i] > 0 {
			out[i] = a[i] / b[i]
		}
	}
	return out
}

func joinRatios(q []float64) string {
	var parts []string
	for _, v := range q {
		if v <= 0 {
			parts = append(parts, "-")
			continue
		}
		parts = append(parts, fmt.Sprintf("%.2f", v))
	}
	return strings.Join(parts, " / ")
}
