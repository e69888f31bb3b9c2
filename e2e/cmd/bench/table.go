package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// sizeResult is one size's figures.
type sizeResult struct {
	shape
	proxies []proxyResult
	floor   floorResult
}

// row is one line of a size's table: a label and a figure per proxy, and
// the numbers the ratio is made of (kube-proxy's over ipvs-proxy's).
type row struct {
	label string
	value func(proxyResult) string
	ratio func(proxyResult) []float64
}

// secs prints seconds; zero or less is "-": not measured.
func secs(v float64) string {
	d := time.Duration(v * float64(time.Second))
	switch {
	case d <= 0:
		return "-"
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// quantile is the q quantile of sorted v (nearest rank below).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[int(q*float64(len(v)-1))]
}

func maxOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return slices.Max(v)
}

var rows = []row{
	{"cold: every Service's VIP:port in the kernel",
		func(r proxyResult) string { return orBound(r, secs(r.cold.VirtualServers)) },
		func(r proxyResult) []float64 { return []float64{r.cold.VirtualServers} }},
	{"cold: everything programmed, CPU idle",
		func(r proxyResult) string { return orBound(r, secs(r.cold.Idle)) },
		func(r proxyResult) []float64 { return []float64{r.cold.Idle} }},
	{"cold: CPU, proxy + processes it runs",
		func(r proxyResult) string {
			if r.cold.Idle <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.1fs + %.1fs", r.cold.CPUSelf, r.cold.CPUChildren)
		},
		func(r proxyResult) []float64 { return []float64{r.cold.CPUSelf + r.cold.CPUChildren} }},
	{"one change, p50 / max",
		func(r proxyResult) string {
			if r.changeOver {
				return "> " + r.bound.String()
			}
			if len(r.change) == 0 {
				return "-"
			}
			return secs(median(r.change)) + " / " + secs(maxOf(r.change))
		},
		func(r proxyResult) []float64 { return []float64{median(r.change), maxOf(r.change)} }},
	{"burst of changes, until the last",
		func(r proxyResult) string {
			if r.burstOver {
				return "> " + r.bound.String()
			}
			return secs(r.burst)
		},
		func(r proxyResult) []float64 { return []float64{r.burst} }},
	{"burst: of which the apiserver taking the updates",
		func(r proxyResult) string { return secs(r.burstIssued) },
		nil},
	{"one change during a full sync, p50 / max",
		func(r proxyResult) string {
			if len(r.resync) == 0 {
				if r.resyncTries > 0 {
					return fmt.Sprintf("- (%d tries)", r.resyncTries)
				}
				return "-"
			}
			s := secs(median(r.resync)) + " / " + secs(maxOf(r.resync))
			if r.resyncTries > len(r.resync) {
				s += fmt.Sprintf(" (%d tries)", r.resyncTries)
			}
			return s
		},
		func(r proxyResult) []float64 { return []float64{median(r.resync), maxOf(r.resync)} }},
	{"one change while a resync and a glue check run, p50 / p90 / max",
		func(r proxyResult) string {
			if len(r.busy) == 0 {
				return "-"
			}
			return fmt.Sprintf("%s / %s / %s (%d over %s)", secs(median(r.busy)), secs(quantile(r.busy, 0.9)), secs(maxOf(r.busy)),
				len(r.busy), secs(r.busyWindow))
		}, nil},
	{"one change while busy / idle, p50 / max",
		func(r proxyResult) string {
			if len(r.busy) == 0 || len(r.change) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f / %.1f", median(r.busy)/median(r.change), maxOf(r.busy)/maxOf(r.change))
		}, nil},
	{"peak RSS",
		func(r proxyResult) string {
			if r.rssKiB == 0 {
				return "-"
			}
			return fmt.Sprintf("%d MiB", r.rssKiB/1024)
		},
		func(r proxyResult) []float64 { return []float64{float64(r.rssKiB)} }},
	{"restart, nothing changed: programmed, idle",
		func(r proxyResult) string {
			if r.restartOver {
				return "> " + r.bound.String()
			}
			return secs(r.restart.Idle)
		},
		func(r proxyResult) []float64 { return []float64{r.restart.Idle} }},
	{"restart: kernel lines changed (IPVS/VIPs/ipset/iptables/nftables)",
		func(r proxyResult) string {
			d := r.restartDiff
			if d == nil {
				return "-"
			}
			return fmt.Sprintf("%d/%d/%d/%d/%d", d["IPVS"], d["VIPs"], d["ipset"], d["iptables"], d["nftables"])
		}, nil},
	{"restart: kernel writes it counted",
		func(r proxyResult) string {
			if r.restartWrites < 0 {
				return "-"
			}
			return fmt.Sprint(r.restartWrites)
		}, nil},
}

// orBound is v, or "> bound" for a proxy that did not settle within it.
func orBound(r proxyResult, v string) string {
	if r.overBound {
		return "> " + r.bound.String()
	}
	return v
}

// printSize prints one size's table in Markdown: a column per proxy, and
// each other proxy's ratio to ipvs-proxy when both ran; then ipvs-proxy's
// cold sync against the floor.
func printSize(w io.Writer, sr sizeResult) {
	printFigures(w, figuresOf(sr))
	var ip *proxyResult
	for i := range sr.proxies {
		if sr.proxies[i].proxy == ipvsProxy {
			ip = &sr.proxies[i]
		}
	}
	if ip != nil && sr.floor.calls > 0 && len(ip.coldSync) > 0 {
		c := ip.coldSync[0]
		fmt.Fprintln(w, "| ipvs-proxy, cold | IPVS sync | floor | ratio | whole first sync | writes | writes on the floor's kernel |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		fmt.Fprintf(w, "| %d Services | %s | %s | %.2f | %s | %d | %d |\n\n", sr.services, secs(c.ipvs.Seconds()),
			secs(sr.floor.floor.Seconds()), c.ipvs.Seconds()/sr.floor.floor.Seconds(), secs(c.took.Seconds()),
			c.writes, sr.floor.adoptWrites)
	}
}

func ratio(r row, kp, ip proxyResult) string {
	if r.ratio == nil {
		return ""
	}
	if strings.HasPrefix(r.value(kp), "> ") && !ip.overBound && r.ratio(ip)[0] > 0 {
		// At least the bound over ipvs-proxy's figure.
		return fmt.Sprintf("> %.1f", kp.bound.Seconds()/r.ratio(ip)[0])
	}
	a, b := r.ratio(kp), r.ratio(ip)
	var parts []string
	for i := range a {
		if b[i] <= 0 || a[i] <= 0 {
			parts = append(parts, "-")
			continue
		}
		parts = append(parts, fmt.Sprintf("%.1f", a[i]/b[i]))
	}
	return strings.Join(parts, " / ")
}

func printNotes(w io.Writer, c config) {
	fmt.Fprintf(w, `The proxies in turn in one VM (software emulation), on a clean kernel, against the same apiserver and objects;
a change is synced 100 ms after the last, a periodic sync every 30 s. Times from the proxy's start (its process start
time in the VM), or from the change's update through the apiserver, until the kernel shows it, timed in the VM.
- cold: every VIP:port: polled every 100 ms (IPVS: a GET of each until one is missing, one dump for the rest after 64
  in a row; nftables: one dump of the map service-ips); everything programmed (IPVS: virtual and real servers, VIPs
  on the proxy's interface, clusterIPs in its ipset and its nat rule on that set; nftables: each VIP:port's element
  in service-ips and its chain's DNAT to exactly its endpoints), checked when the CPU of the proxy and of the processes it runs
  (iptables-restore, ipset, nft: live ones and waited-for ones) grew by less than 50 ms in %v; the time is the start
  of that quiet period, the CPU is up to then. "> %v": not done within the bound; nothing else measured.
- one change: an endpoint of one EndpointSlice moved, %d rounds, until new connections go to the new endpoint and not
  the old (IPVS: the real servers; nftables: the Service chain's DNAT map); burst: %d EndpointSlices changed at once
  (every update in flight together), until the kernel has the last; during a full sync: the change made once the
  proxy's CPU starts again after 1 s of quiet (its periodic sync), %d rounds (for ipvs-proxy, only those its log shows
  inside a full sync; kube-proxy's IPVS mode syncs everything every time; its nftables mode is not timed so: its
  periodic sync is partial, its full sync comes once an hour; tries: all that were made); while a resync and a glue
  check run (ipvs-proxy, -busy-rounds %d): round i made i/N of the span its last resync and glue check took (from the
  resync's read to the check's repair, by its log) after its periodic sync began, so that the rounds meet every part.
- restart: the proxy stopped and started again with nothing changed; the kernel's lines compared before and after
  (ipvsadm -Sn, the interface's addresses, ipset save, iptables-save and ip6tables-save without counters, nft list
  table ip kube-proxy with one line per set element) count what changed, not what was rewritten unchanged;
  ipvs-proxy also counts its own writes.
- floor: the same virtual servers, real servers and VIPs created with bare netlink calls, one at a time.
`, c.quiet, c.bound, c.rounds, c.burst, c.resyncRounds, c.busyRounds)
	if c.datapathConns > 0 {
		fmt.Fprintf(w, `- data path: right after the cold start, through one NodePort Service of its own (two backends in namespaces on the
  node) programmed beside the shape's: %d short connections (connect, one request, its answer, close), %d at a time,
  from a pod (a namespace in the cluster CIDR) to the clusterIP, then from outside (the client namespace, outside the
  cluster CIDR, routed to the node) to the node port; connect latency from SYN to established; then one stream of %d MiB
  from the pod through the clusterIP. The proxy's CPU meanwhile: a busy proxy takes the emulated CPUs from the packets.
  Ratios to ipvs-proxy: above 1 for connections/s or MiB/s, the other proxy carries more; for a latency, it waits
  longer. The last table divides each proxy's figures at the largest shape by its own at the smallest.
`, c.datapathConns, c.datapathWorkers, c.datapathStreamMiB)
	}
}

// sizeFigures is one size's table as data (framework/results): each row's
// cell per proxy and its ratios, as printed.
type sizeFigures struct {
	Shape   string      `json:"shape"`
	Proxies []string    `json:"proxies"`
	Rows    []rowFigure `json:"rows"`
	// Floor: ipvs-proxy's cold IPVS sync and the one-at-a-time floor,
	// in seconds (0: not measured).
	ColdIPVSSync float64 `json:"cold_ipvs_sync_seconds,omitempty"`
	Floor        float64 `json:"floor_seconds,omitempty"`
}

type rowFigure struct {
	Label string `json:"label"`
	// Values are the cells, in the order of Proxies; Ratios each other
	// proxy's figure over ipvs-proxy's, keyed by proxy.
	Values []string          `json:"values"`
	Ratios map[string]string `json:"ratios,omitempty"`
}

func figuresOf(sr sizeResult) sizeFigures {
	f := sizeFigures{Shape: sr.shape.String()}
	var ip *proxyResult
	for i := range sr.proxies {
		f.Proxies = append(f.Proxies, sr.proxies[i].proxy)
		if sr.proxies[i].proxy == ipvsProxy {
			ip = &sr.proxies[i]
		}
	}
	for _, r := range rowsOf(sr) {
		rf := rowFigure{Label: r.label}
		for _, p := range sr.proxies {
			rf.Values = append(rf.Values, r.value(p))
			if ip != nil && p.proxy != ipvsProxy {
				if v := ratio(r, p, *ip); v != "" {
					if rf.Ratios == nil {
						rf.Ratios = map[string]string{}
					}
					rf.Ratios[p.proxy] = v
				}
			}
		}
		if slices.ContainsFunc(rf.Values, func(v string) bool { return v != "-" }) {
			f.Rows = append(f.Rows, rf) // a row no proxy has a figure of is left out
		}
	}
	if ip != nil && sr.floor.calls > 0 && len(ip.coldSync) > 0 {
		f.ColdIPVSSync, f.Floor = ip.coldSync[0].ipvs.Seconds(), sr.floor.floor.Seconds()
	}
	return f
}

// printFigures prints a table kept as figures (the data path's scale):
// the cells, then each other proxy's ratio column when ipvs-proxy is in.
func printFigures(w io.Writer, f sizeFigures) {
	head, sep := "| "+f.Shape+" |", "|---|"
	var others []string
	for _, p := range f.Proxies {
		head += " " + p + " |"
		sep += "---|"
		if p != ipvsProxy && slices.Contains(f.Proxies, ipvsProxy) {
			others = append(others, p)
		}
	}
	for _, p := range others {
		head += " " + p + " / ipvs-proxy |"
		sep += "---|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, r := range f.Rows {
		line := "| " + r.Label + " |"
		for _, v := range r.Values {
			line += " " + v + " |"
		}
		for _, p := range others {
			line += " " + r.Ratios[p] + " |"
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
}
