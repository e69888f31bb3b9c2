package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDiffCount(t *testing.T) {
	for _, c := range []struct {
		a, b []string
		want int
	}{
		{nil, nil, 0},
		{[]string{"x", "y"}, []string{"y", "x"}, 0},
		{[]string{"x", "x"}, []string{"x"}, 1},
		{[]string{"x"}, []string{"y"}, 2},
	} {
		if got := diffCount(c.a, c.b); got != c.want {
			t.Errorf("diffCount(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestInFullSync reads ipvs-proxy's log lines (end time and duration of
// each sync) and counts only times inside a full one.
func TestInFullSync(t *testing.T) {
	log := `{"level":"info","ts":100.5,"caller":"proxier/proxier.go:675","msg":"synced","kind":"full","services":3,"failed":0,"writes":0,"reads":9,"ipvs":0.2,"took":10.5}
{"level":"debug","ts":120,"caller":"proxier/proxier.go:675","msg":"synced","kind":"partial","services":1,"failed":0,"writes":2,"reads":1,"ipvs":0.01,"took":5}
`
	if got := inFullSync(log, []float64{89, 90.5, 95, 100.5, 101, 117}); got != 3 {
		t.Errorf("inFullSync = %d, want 3 (90.5, 95, 100.5)", got)
	}
}

// TestFullSyncLines keeps the lines of full syncs, of the glue's whole
// syncs and checks and of resyncs' ends, and drops partial syncs.
func TestFullSyncLines(t *testing.T) {
	log := `{"level":"info","ts":1,"msg":"synced","kind":"full","services":3,"ipvs":0.2,"read":0.1,"consumers":0.01,"took":0.3}
{"level":"debug","ts":2,"msg":"synced","kind":"partial","services":1,"ipvs":0.01,"took":0.02}
{"level":"info","ts":3,"msg":"iptables glue synced","full":true,"setRead":1,"took":2}
{"level":"debug","ts":4,"msg":"iptables glue synced","full":false,"took":0.001}
{"level":"info","ts":5,"msg":"iptables glue checked","setRead":1,"readTook":2,"took":0.1}
{"level":"info","ts":6,"msg":"full resync complete","took":0.5}
`
	got := fullSyncLines(log)
	if len(got) != 4 || !strings.Contains(got[0], `"kind":"full"`) || !strings.Contains(got[1], `"full":true`) ||
		!strings.Contains(got[2], "checked") || !strings.Contains(got[3], "resync complete") {
		t.Errorf("fullSyncLines = %q", got)
	}
}

// TestNFTLines: the same table listed with its elements in another order
// (a set made again draws a new hash seed) gives the same lines.
func TestNFTLines(t *testing.T) {
	a := `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto service-A-bench/svc-00000/tcp/,
			     10.96.0.11 . tcp . 80 : goto service-B-bench/svc-00001/tcp/ }
	}
	set cluster-ips {
		type ipv4_addr
		elements = { 10.96.0.10, 10.96.0.11 }
	}
	chain service-A-bench/svc-00000/tcp/ {
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.176.0.1 . 8080, 1 : 10.176.0.17 . 8080 }
		counter packets 3 bytes 180 drop
	}
}`
	b := strings.NewReplacer(
		"10.96.0.10 . tcp . 80 : goto service-A-bench/svc-00000/tcp/,\n\t\t\t     10.96.0.11 . tcp . 80 : goto service-B-bench/svc-00001/tcp/",
		"10.96.0.11 . tcp . 80 : goto service-B-bench/svc-00001/tcp/,\n\t\t\t     10.96.0.10 . tcp . 80 : goto service-A-bench/svc-00000/tcp/",
		"10.96.0.10, 10.96.0.11", "10.96.0.11, 10.96.0.10",
		"counter packets 3 bytes 180", "counter packets 9 bytes 540").Replace(a)
	if a == b {
		t.Fatal("the reordering changed nothing")
	}
	if n := diffCount(nftLines(a), nftLines(b)); n != 0 {
		t.Errorf("reordered elements and other counters: %d lines differ, want 0\n%q\n%q", n, nftLines(a), nftLines(b))
	}
	c := strings.Replace(a, "10.176.0.17 . 8080", "10.176.0.16 . 8080", 1)
	if n := diffCount(nftLines(a), nftLines(c)); n != 2 {
		t.Errorf("one endpoint changed: %d lines differ, want 2", n)
	}
}

func TestParseShapes(t *testing.T) {
	got, err := parseShapes("1000, 10000x2,2000x50,5000x50")
	want := []shape{{1000, 2}, {10000, 2}, {2000, 50}, {5000, 50}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("parseShapes = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "x2", "1000x0", "1000,1000", "2000x50,1000x50", "5000x1001", "1000000x50", "10x2y"} {
		if got, err := parseShapes(bad); err == nil {
			t.Errorf("parseShapes(%q) = %v, want an error", bad, got)
		}
	}
}

func TestStartTimeline(t *testing.T) {
	log := `I1127 klog line without JSON
{"level":"info","ts":100.0,"msg":"starting","node":"n1"}
{"level":"info","ts":100.5,"msg":"waiting for the initial list of Services, EndpointSlices and the Node"}
{"level":"info","ts":108.25,"msg":"initial list received","services":10000}
{"level":"info","ts":115.75,"msg":"synced","kind":"full"}
{"level":"info","ts":145.0,"msg":"synced","kind":"full"}
`
	if got, want := startTimeline(log), "watching 0.50s, lists received 8.25s, first sync done 15.75s"; got != want {
		t.Errorf("startTimeline = %q, want %q", got, want)
	}
	if got := startTimeline(strings.Split(log, "\n{\"level\":\"info\",\"ts\":115.75")[0]); got != "" {
		t.Errorf("startTimeline without a first sync = %q, want empty", got)
	}
}

// TestPastBoundRows: a proxy whose restart or change did not end within
// the bound shows "> bound" in that row and a ratio of at least the bound
// over ipvs-proxy's figure; the rows measured before keep their figures,
// and a helper's other errors are not taken for the bound.
func TestPastBoundRows(t *testing.T) {
	bound := 30 * time.Minute
	ip := proxyResult{proxy: ipvsProxy, bound: bound, restartWrites: 0,
		cold: settled{VirtualServers: 10, Idle: 12}, change: []float64{0.1, 0.2}, burst: 1, restart: settled{Idle: 15}}
	nft := proxyResult{proxy: kubeProxyNFTables, bound: bound, restartWrites: -1,
		cold: settled{VirtualServers: 600, Idle: 900}, change: []float64{60, 90}, burst: 120}
	nft.restartOver = pastBound(proxyKinds[kubeProxyNFTables], 5000, "restart",
		errors.New("settle: not settled after 30m0s: 4 of 5000 Services"), notSettled)
	if !nft.restartOver {
		t.Fatal("pastBound did not take the settle helper's timeout for the bound")
	}
	if pastBound(proxyKinds[kubeProxyNFTables], 5000, "burst", errors.New("ssh: connection reset"), notLanded) {
		t.Error("pastBound took another error for the bound")
	}
	var b strings.Builder
	printSize(&b, sizeResult{shape: shape{5000, 50}, proxies: []proxyResult{ip, nft}})
	for _, want := range []string{
		"| cold: everything programmed, CPU idle | 12s | 15m0s | 75.0 |",
		"| one change, p50 / max | 200ms / 200ms | 1m30s / 1m30s | 450.0 / 450.0 |",
		"| restart, nothing changed: programmed, idle | 15s | > 30m0s | > 120.0 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestFiguresAsPrinted: the data a run keeps (figuresOf) has the printed
// table's cells and ratios.
func TestFiguresAsPrinted(t *testing.T) {
	ip := proxyResult{proxy: ipvsProxy, cold: settled{VirtualServers: 10, Idle: 12}, change: []float64{0.1, 0.2}}
	nft := proxyResult{proxy: kubeProxyNFTables, cold: settled{VirtualServers: 600, Idle: 900}, change: []float64{60, 90}}
	f := figuresOf(sizeResult{shape: shape{5000, 50}, proxies: []proxyResult{ip, nft}})
	// The rows with a figure: the cold start's three, one change, the
	// restart's writes (0 for both); the rest is left out.
	if f.Shape != "5000 Services × 50 endpoints" || len(f.Proxies) != 2 || len(f.Rows) != 5 {
		t.Fatalf("figures %+v", f)
	}
	r := f.Rows[1]
	if r.Label != "cold: everything programmed, CPU idle" || r.Values[0] != "12s" || r.Values[1] != "15m0s" || r.Ratios[kubeProxyNFTables] != "75.0" {
		t.Errorf("row %+v; want 12s, 15m0s and the ratio 75.0", r)
	}
}

// TestBusyWindow: from the start of the last periodic resync's read off
// the loop (its adoption's time less the sync and the read) to the end of
// the glue check after it; a whole full sync (no read off the loop) is no
// start.
func TestBusyWindow(t *testing.T) {
	log := `{"level":"info","ts":10,"msg":"synced","kind":"full","services":9,"readOffLoop":0,"consumers":1,"took":9}
{"level":"info","ts":50,"msg":"synced","kind":"full","services":500,"readOffLoop":1.5,"consumers":0.1,"took":0.5}
{"level":"info","ts":55,"msg":"iptables glue checked","setRead":3,"readTook":4,"took":0.1}
{"level":"info","ts":80,"msg":"synced","kind":"full","services":500,"readOffLoop":2,"consumers":0.1,"took":1}
{"level":"info","ts":86,"msg":"iptables glue checked","setRead":3,"readTook":4,"took":0.1}
`
	if got, want := busyWindow(log), 9*time.Second; got != want {
		t.Errorf("busyWindow = %v, want %v (86 - (80 - 1 - 2))", got, want)
	}
	if got := busyWindow(`{"level":"info","ts":10,"msg":"synced","kind":"full","readOffLoop":0,"took":9}`); got != 0 {
		t.Errorf("busyWindow of a log without a resync and a check = %v, want 0", got)
	}
}

// TestMetSyncs: a busy change is listed with the syncs that ran while it
// waited (one in flight when it was made, the one that wrote it), and not
// with those before or after.
func TestMetSyncs(t *testing.T) {
	log := `{"level":"debug","ts":100.0,"msg":"synced","kind":"partial","services":1,"resyncLeft":0,"took":0.05}
{"level":"info","ts":101.3,"msg":"synced","kind":"full","services":500,"resyncLeft":9500,"readOffLoop":1.2,"ipvs":0.39,"consumers":0.1,"took":0.4}
{"level":"debug","ts":101.35,"msg":"iptables glue synced","full":false,"sets":1,"took":0.03}
{"level":"debug","ts":101.4,"msg":"synced","kind":"partial","services":1,"resyncLeft":9500,"readOffLoop":0,"ipvs":0.09,"consumers":0.01,"took":0.1}
{"level":"info","ts":103,"msg":"iptables glue checked","readTook":2,"took":0.01}
`
	entries := syncEntries(log)
	if len(entries) != 5 {
		t.Fatalf("entries %+v, want 5", entries)
	}
	got := metSyncs(entries, 101.0, 0.45)
	want := []string{
		"-100 ms: full sync of 500 Services (resyncLeft 9500, ipvs 0.39s, consumers 0.1s), adopting a read of 1.2s off the loop, 400 ms",
		"+320 ms: glue sync (full false, sets 1), 30 ms",
		"+300 ms: partial sync of 1 Services (resyncLeft 9500, ipvs 0.09s, consumers 0.01s), 100 ms",
	}
	if !slices.Equal(got, want) {
		t.Errorf("metSyncs =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestStatCPU adds utime, stime, cutime and cstime of a stat line whose
// command name holds a space and a parenthesis.
func TestStatCPU(t *testing.T) {
	stat := "1234 (kube (proxy)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 12 0 100 1000 200\n"
	got, err := statCPU(stat)
	if err != nil || got != 3.1 {
		t.Errorf("statCPU = %v, %v; want 3.1 s (310 ticks)", got, err)
	}
	if _, err := statCPU("1234 (x) S 1 2"); err == nil {
		t.Error("statCPU of a short line: no error")
	}
}

// TestScaleOf divides each proxy's data path at the largest shape by its
// own at the smallest, and the other proxy's quotient by ipvs-proxy's;
// a proxy measured at one shape only is left out.
func TestScaleOf(t *testing.T) {
	dp := func(name string, rate, p50, p99, mibps float64) proxyResult {
		c := connRate{PerSecond: rate, ConnectP50: p50, ConnectP99: p99}
		return proxyResult{proxy: name, data: dataPathResult{cluster: c, nodePort: c, streamMiBps: mibps, measured: true}}
	}
	tables := []sizeResult{
		{shape: shape{10, 2}, proxies: []proxyResult{dp(ipvsProxy, 100, 0.001, 0.002, 200), dp(kubeProxyNFTables, 100, 0.001, 0.002, 200)}},
		{shape: shape{10000, 2}, proxies: []proxyResult{dp(ipvsProxy, 100, 0.001, 0.004, 200), dp(kubeProxyNFTables, 50, 0.002, 0.004, 100),
			dp(kubeProxyIPVS, 10, 1, 1, 1)}},
	}
	f, ok := scaleOf(tables)
	if !ok {
		t.Fatal("scaleOf: no table from two shapes")
	}
	if !slices.Equal(f.Proxies, []string{ipvsProxy, kubeProxyNFTables}) {
		t.Errorf("proxies %q, want ipvs-proxy and kube-proxy-nftables (kube-proxy-ipvs ran at 10000 only)", f.Proxies)
	}
	want := map[string][2]string{ // label: ipvs-proxy's cell, nftables' ratio
		"data path: clusterIP from a pod, new connections/s":    {"1.00", "0.50"},
		"data path: clusterIP from a pod, connect p50 / p99":    {"1.00 / 2.00", "2.00 / 1.00"},
		"data path: one stream through a clusterIP, from a pod": {"1.00", "0.50"},
	}
	seen := 0
	for _, r := range f.Rows {
		w, ok := want[r.Label]
		if !ok {
			continue
		}
		seen++
		if r.Values[0] != w[0] || r.Ratios[kubeProxyNFTables] != w[1] {
			t.Errorf("%s: ipvs-proxy %q, nftables / ipvs-proxy %q; want %q and %q", r.Label, r.Values[0], r.Ratios[kubeProxyNFTables], w[0], w[1])
		}
	}
	if seen != len(want) {
		t.Errorf("rows %v: want the %d above among them", f.Rows, len(want))
	}
	if _, ok := scaleOf(tables[:1]); ok {
		t.Error("scaleOf of one shape: a table")
	}
}

// TestRowsOfDataPath: the data path's rows only where it was measured.
func TestRowsOfDataPath(t *testing.T) {
	sr := sizeResult{shape: shape{10, 2}, proxies: []proxyResult{{proxy: ipvsProxy}}}
	if len(rowsOf(sr)) != len(rows) {
		t.Error("data path rows without a data path measured")
	}
	sr.proxies[0].data.measured = true
	if len(rowsOf(sr)) != len(rows)+len(dataRows) {
		t.Error("no data path rows with a data path measured")
	}
}

// TestFiguresLeaveOutUnmeasuredRows: with the data path only, the rows
// of the measures not made (changes, burst, restart) are not in the
// table; the cold start's and the data path's are.
func TestFiguresLeaveOutUnmeasuredRows(t *testing.T) {
	r := proxyResult{proxy: ipvsProxy, restartWrites: -1, cold: settled{VirtualServers: 1, Idle: 2, CPUSelf: 1},
		data: dataPathResult{measured: true, cluster: connRate{PerSecond: 40, ConnectP50: 0.02, ConnectP99: 0.1}}}
	f := figuresOf(sizeResult{shape: shape{10, 2}, proxies: []proxyResult{r}})
	var labels []string
	for _, row := range f.Rows {
		labels = append(labels, row.Label)
	}
	for _, want := range []string{"cold: everything programmed, CPU idle", "data path: clusterIP from a pod, new connections/s"} {
		if !slices.Contains(labels, want) {
			t.Errorf("rows %q: want %q among them", labels, want)
		}
	}
	for _, gone := range []string{"one change, p50 / max", "restart: kernel writes it counted", "peak RSS"} {
		if slices.Contains(labels, gone) {
			t.Errorf("rows %q: %q has no figure and should be left out", labels, gone)
		}
	}
}

// TestControlPlaneAt: the data path's small baseline shape runs in the
// same bench as 10,000 Services with the default burst of 100: it is
// measured for its data path only, the large shape for everything.
func TestControlPlaneAt(t *testing.T) {
	c := config{burst: 100}
	for n, want := range map[int]bool{10: false, 199: false, 200: true, 10000: true} {
		if got := c.controlPlaneAt(n); got != want {
			t.Errorf("burst 100, %d Services: control plane measured %v, want %v", n, got, want)
		}
	}
	c.datapathOnly = true
	if c.controlPlaneAt(10000) {
		t.Error("-datapath-only, 10,000 Services: control plane measured, want only the data path")
	}
}
