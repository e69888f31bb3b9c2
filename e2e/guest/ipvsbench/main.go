// Command ipvsbench runs inside the test VM for the benchmark (e2e/cmd/bench):
//
//	ipvsbench floor FILE
//	    creates the objects listed in FILE (JSON: [{"vip":"10.96.0.10","port":80,
//	    "rs":["10.176.0.1:8080",...]}, ...]) with bare netlink calls, one at a
//	    time, as ipvs-proxy's cold sync would: the dummy interface, one address
//	    per VIP, one virtual server per VIP, its real servers. It prints the
//	    elapsed time as JSON: the floor a cold sync is compared with.
//	ipvsbench netlink N
//	    times, at N virtual servers with two real servers each, the kernel
//	    writes and reads of a cold sync and a full resync both ways: one
//	    netlink request at a time and batched (netlinkutil's IPVS.Apply,
//	    ListAllRealServers; ipset entries in bulk). Prints JSON.
//	ipvsbench settle -comm NAME -expect FILE [-dataplane ipvs -iface IF -set SET | -dataplane nftables] [-quiet 5s]
//	    follows the proxy NAME from its start (its process start time) until
//	    every VIP:port in FILE (same form) is in the kernel, and until
//	    everything is (IPVS: real servers, VIPs on IF, clusterIPs in SET, a
//	    nat rule on SET; nftables: kube-proxy's map service-ips and each
//	    Service chain's DNAT) and its CPU, with that of the processes it runs,
//	    is idle.
//	ipvsbench latency -kubeconfig K -namespace NS -slice NAME -vs VIP:PORT [-dataplane D] [-rounds 5] [-during-sync-of NAME]
//	    moves the first endpoint of an EndpointSlice through the apiserver
//	    and polls the kernel (destination dumps of that virtual server, or
//	    its nftables chain) until the change has landed; prints each round's
//	    latency as JSON. With -during-sync-of, each change is made once that
//	    process has begun a sync of its own (CPU after a quiet period).
//	ipvsbench burst -kubeconfig K -namespace NS -changes FILE [-dataplane D]
//	    makes the changes in FILE ([{"slice":NAME,"vs":VIP:PORT},...]) at
//	    once and times them until the kernel has the last one.
//
// Everything is timed on this VM's clock.
package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// Interface is the dummy interface the floor binds VIPs to: ipvs-proxy's
// default, so that an agent started afterwards adopts what the floor made.
const Interface = "ipvs-proxy0"

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "floor":
		err = floor(os.Args[2])
	case len(os.Args) > 1 && os.Args[1] == "settle":
		err = settle(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "latency":
		err = latency(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "burst":
		err = burst(os.Args[2:])
	case len(os.Args) == 3 && os.Args[1] == "netlink":
		var n int
		if n, err = strconv.Atoi(os.Args[2]); err == nil {
			err = netlinkFigures(n)
		}
	default:
		err = fmt.Errorf("usage: ipvsbench floor FILE | netlink N | settle ... | latency ... | burst ... (see the package's doc)")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ipvsbench:", err)
		os.Exit(1)
	}
}

// Service is one virtual server of the floor.
type Service struct {
	VIP  string   `json:"vip"`
	Port uint16   `json:"port"`
	RS   []string `json:"rs"`
}

func floor(file string) error {
	svcs, err := readServices(file)
	if err != nil {
		return err
	}
	ipvs, err := netlinkutil.NewIPVS()
	if err != nil {
		return err
	}
	defer ipvs.Close()
	links, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := links.EnsureDummy(Interface); err != nil {
		return err
	}
	// In ipvs-proxy's order: every address, then the virtual servers with
	// their real servers. (Interleaving them is slower in this kernel.)
	calls := 1
	vips := make([]netip.Addr, len(svcs))
	for i, s := range svcs {
		if vips[i], err = netip.ParseAddr(s.VIP); err != nil {
			return fmt.Errorf("vip %q: %w", s.VIP, err)
		}
		if err := links.AddAddress(Interface, vips[i]); err != nil {
			return err
		}
		calls++
	}
	addrTime := time.Since(start)
	for i, s := range svcs {
		vs := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: vips[i], Protocol: ktypes.TCP, Port: s.Port}, Scheduler: "rr"}
		if err := ipvs.AddVirtualServer(vs); err != nil {
			return err
		}
		calls++
		for _, r := range s.RS {
			ap, err := netip.ParseAddrPort(r)
			if err != nil {
				return fmt.Errorf("real server %q: %w", r, err)
			}
			if err := ipvs.AddRealServer(vs.VSKey, ktypes.RealServer{RSKey: ktypes.RSKey{Address: ap.Addr(), Port: ap.Port()}, Weight: 1}); err != nil {
				return err
			}
			calls++
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"seconds": time.Since(start).Seconds(), "calls": calls,
		"addressSeconds": addrTime.Seconds()})
}
