package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/moby/ipvs"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// settleResult is what settle prints, in seconds since the proxy started.
type settleResult struct {
	PID int `json:"pid"`
	// VirtualServers: every expected virtual server was in the kernel.
	VirtualServers float64 `json:"virtualServers"`
	// Idle: the proxy's last burst of CPU before a quiet period at whose
	// end everything expected was in the kernel.
	Idle float64 `json:"idle"`
	// CPUSelf and CPUChildren: the proxy's CPU time up to Idle, and that
	// of the processes it ran.
	CPUSelf     float64 `json:"cpuSelf"`
	CPUChildren float64 `json:"cpuChildren"`
	// Checks: full checks of the kernel made (one per quiet period).
	Checks int `json:"checks"`
}

// settle follows a proxy from its start until everything expected is in
// the kernel and its CPU is idle.
func settle(args []string) error {
	fs := flag.NewFlagSet("settle", flag.ContinueOnError)
	comm := fs.String("comm", "", "the proxy's process name")
	expectFile := fs.String("expect", "", "JSON file of the expected virtual servers and real servers")
	var dp dataplaneFlags
	dp.register(fs, true)
	quiet := fs.Duration("quiet", 5*time.Second, "how long the proxy's CPU must not grow to be idle")
	slack := fs.Duration("slack", 50*time.Millisecond, "CPU time a quiet period may still use")
	interval := fs.Duration("interval", 100*time.Millisecond, "sampling interval")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *comm == "" || *expectFile == "" {
		return errors.New("settle: -comm and -expect are required")
	}
	want, err := readServices(*expectFile)
	if err != nil {
		return err
	}
	pid, st, err := findProc(*comm, time.Minute)
	if err != nil {
		return err
	}
	d, err := dp.open()
	if err != nil {
		return err
	}
	defer d.Close()
	res := settleResult{PID: pid, VirtualServers: -1}
	since := func(at time.Duration) float64 { return (at - st.startTime).Seconds() }
	missing := slices.Clone(want)
	rand.Shuffle(len(missing), func(i, j int) { missing[i], missing[j] = missing[j], missing[i] })
	log := cpuLog{pid: pid}
	var checked time.Duration = -1 // the quiet period last checked
	var problem error
	for start := time.Now(); ; time.Sleep(*interval) {
		if time.Since(start) > *timeout {
			if problem == nil {
				return fmt.Errorf("settle: %w after %v (virtual servers: %d missing; not checked yet)", errNotSettled, *timeout, len(missing))
			}
			return fmt.Errorf("settle: %w after %v (virtual servers: %d missing; last check: %w)", errNotSettled, *timeout, len(missing), problem)
		}
		if _, err := log.sample(); err != nil {
			return err
		}
		if res.VirtualServers < 0 {
			// The virtual servers not seen yet, looked at as
			// cheaply as the dataplane allows (dataplane.missing).
			if missing, err = d.missing(missing); err != nil {
				return err
			}
			if len(missing) > 0 {
				continue
			}
			res.VirtualServers = since(uptime())
		}
		idle, ok := log.idleSince(*quiet, *slack)
		if !ok || idle.at == checked {
			continue
		}
		checked = idle.at
		res.Checks++
		if problem = d.check(want); problem != nil {
			continue
		}
		res.Idle, res.CPUSelf, res.CPUChildren = since(idle.at), idle.self.Seconds(), idle.children.Seconds()
		return json.NewEncoder(os.Stdout).Encode(res)
	}
}

// errNotSettled: the proxy did not settle within settle's -timeout (its
// message is how the bench tells "> bound" from a failure).
var errNotSettled = errors.New("not settled")

func readServices(file string) ([]Service, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var svcs []Service
	if err := json.Unmarshal(data, &svcs); err != nil {
		return nil, fmt.Errorf("parse %s: %w", file, err)
	}
	return svcs, nil
}

func vsKey(s Service) ktypes.VSKey {
	return ktypes.VSKey{Address: netip.MustParseAddr(s.VIP), Protocol: ktypes.TCP, Port: s.Port}
}

func ipvsService(s Service) *ipvs.Service {
	return &ipvs.Service{Address: netip.MustParseAddr(s.VIP).AsSlice(), Protocol: 6, Port: s.Port, AddressFamily: 2}
}

// check tells the first thing expected that the kernel does not have:
// each virtual server with exactly its real servers, each VIP on iface,
// each clusterIP in set, and a nat rule that matches set.
func check(k netlinkutil.IPVS, links netlinkutil.Links, want []Service, iface, set string) error {
	for _, s := range want {
		rss, err := k.ListRealServers(vsKey(s))
		if err != nil {
			return fmt.Errorf("virtual server %s:%d: %w", s.VIP, s.Port, err)
		}
		var got []string
		for _, r := range rss {
			got = append(got, netip.AddrPortFrom(r.Address, r.Port).String())
		}
		slices.Sort(got)
		if w := slices.Sorted(slices.Values(s.RS)); !slices.Equal(got, w) {
			return fmt.Errorf("virtual server %s:%d has real servers %v, want %v", s.VIP, s.Port, got, w)
		}
	}
	if err := held(links, iface, want); err != nil {
		return err
	}
	out, err := exec.Command("ipset", "list", set).Output()
	if err != nil {
		return fmt.Errorf("ipset list %s: %w", set, err)
	}
	members := map[string]bool{}
	_, list, _ := strings.Cut(string(out), "Members:\n")
	for _, l := range strings.Split(list, "\n") {
		members[strings.Fields(l + " x")[0]] = true
	}
	for _, s := range want {
		if e := fmt.Sprintf("%s,tcp:%d", s.VIP, s.Port); !members[e] {
			return fmt.Errorf("%s is not in the set %s", e, set)
		}
	}
	out, err = exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		return fmt.Errorf("iptables-save: %w", err)
	}
	if !strings.Contains(string(out), "--match-set "+set+" dst,dst") {
		return fmt.Errorf("no nat rule matches the set %s", set)
	}
	return nil
}

// held checks that every VIP is the node's own through iface: bound to
// it, or in a range routed as local through it (ipvs-proxy's
// --route-service-cidrs: one route for the whole Service range, no
// address per clusterIP).
func held(links netlinkutil.Links, iface string, want []Service) error {
	addrs, err := links.ListAddresses(iface)
	if err != nil {
		return err
	}
	routes, err := links.ListLocalRoutes(iface)
	if err != nil {
		return err
	}
	bound := map[netip.Addr]bool{}
	for _, a := range addrs {
		bound[a] = true
	}
	for _, s := range want {
		a, err := netip.ParseAddr(s.VIP)
		if err != nil {
			return fmt.Errorf("VIP %q: %w", s.VIP, err)
		}
		if !bound[a] && !slices.ContainsFunc(routes, func(r netlinkutil.LocalRoute) bool { return r.Prefix.Contains(a) }) {
			return fmt.Errorf("%s is neither on %s nor in a range routed through it", s.VIP, iface)
		}
	}
	return nil
}
