// Command ipvsbench runs inside the test VM for the benchmark (e2e/bench):
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
//	ipvsbench latency KUBECONFIG NAMESPACE SLICE VIP:PORT ROUNDS
//	    replaces the first endpoint of an EndpointSlice through the apiserver
//	    and polls the kernel (one destination dump of that virtual server at a
//	    time) until the change has landed; prints each round's latency as JSON.
//	    Both ends are timed on this VM's clock.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Interface is the dummy interface the floor binds VIPs to: ipvs-proxy's
// default, so that an agent started afterwards adopts what the floor made.
const Interface = "ipvs-proxy0"

func main() {
	var err error
	switch {
	case len(os.Args) == 3 && os.Args[1] == "floor":
		err = floor(os.Args[2])
	case len(os.Args) == 7 && os.Args[1] == "latency":
		err = latency(os.Args[2:])
	case len(os.Args) == 3 && os.Args[1] == "netlink":
		var n int
		if n, err = strconv.Atoi(os.Args[2]); err == nil {
			err = netlinkFigures(n)
		}
	default:
		err = fmt.Errorf("usage: ipvsbench floor FILE | netlink N | latency KUBECONFIG NAMESPACE SLICE VIP:PORT ROUNDS")
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
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read %s: %w", file, err)
	}
	var svcs []Service
	if err := json.Unmarshal(data, &svcs); err != nil {
		return fmt.Errorf("parse %s: %w", file, err)
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
		vs := model.VirtualServer{VSKey: model.VSKey{Address: vips[i], Protocol: model.TCP, Port: s.Port}, Scheduler: "rr"}
		if err := ipvs.AddVirtualServer(vs); err != nil {
			return err
		}
		calls++
		for _, r := range s.RS {
			ap, err := netip.ParseAddrPort(r)
			if err != nil {
				return fmt.Errorf("real server %q: %w", r, err)
			}
			if err := ipvs.AddRealServer(vs.VSKey, model.RealServer{RSKey: model.RSKey{Address: ap.Addr(), Port: ap.Port()}, Weight: 1}); err != nil {
				return err
			}
			calls++
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"seconds": time.Since(start).Seconds(), "calls": calls,
		"addressSeconds": addrTime.Seconds()})
}

func latency(args []string) error {
	kubeconfig, ns, sliceName, vsArg := args[0], args[1], args[2], args[3]
	rounds, err := strconv.Atoi(args[4])
	if err != nil {
		return fmt.Errorf("rounds %q: %w", args[4], err)
	}
	ap, err := netip.ParseAddrPort(vsArg)
	if err != nil {
		return fmt.Errorf("virtual server %q: %w", vsArg, err)
	}
	key := model.VSKey{Address: ap.Addr(), Protocol: model.TCP, Port: ap.Port()}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ipvs, err := netlinkutil.NewIPVS()
	if err != nil {
		return err
	}
	defer ipvs.Close()
	ctx := context.Background()
	var out []float64
	for i := 0; i < rounds; i++ {
		eps, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, sliceName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get slice: %w", err)
		}
		if len(eps.Endpoints) == 0 || len(eps.Endpoints[0].Addresses) == 0 {
			return fmt.Errorf("slice %s/%s has no endpoint to change", ns, sliceName)
		}
		old, err := netip.ParseAddr(eps.Endpoints[0].Addresses[0])
		if err != nil {
			return err
		}
		// Move the endpoint to the next address (same subnet, routable).
		next := old.Next()
		eps.Endpoints[0].Addresses[0] = next.String()
		start := time.Now()
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, eps, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update slice: %w", err)
		}
		for {
			rss, err := ipvs.ListRealServers(key)
			if err != nil {
				return err
			}
			hasNew, hasOld := false, false
			for _, r := range rss {
				hasNew = hasNew || r.Address == next
				hasOld = hasOld || r.Address == old
			}
			if hasNew && !hasOld {
				break
			}
			if time.Since(start) > time.Minute {
				return fmt.Errorf("round %d: the change did not reach the kernel in a minute", i)
			}
			time.Sleep(time.Millisecond)
		}
		out = append(out, time.Since(start).Seconds())
		time.Sleep(300 * time.Millisecond) // let the agent settle between rounds
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"seconds": out})
}
