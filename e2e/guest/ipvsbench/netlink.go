package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// netlinkFigures times the same table written and read one request at a
// time and batched. Each way runs in a network namespace of its own: IPVS
// keeps deleted destinations in a per-namespace trash for minutes, and
// searches it linearly on every add, so a table created right after one was
// deleted is slower to create (measured too).
func netlinkFigures(n int) error {
	var adds, dels []netlinkutil.Write
	var keys []ktypes.VSKey
	for i := range n {
		v := ktypes.VirtualServer{VSKey: ktypes.VSKey{Address: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: ktypes.TCP, Port: 80}, Scheduler: "rr"}
		keys = append(keys, v.VSKey)
		adds = append(adds, netlinkutil.Write{Kind: ktypes.OpAddVirtualServer, VirtualServer: v})
		for k := range 2 {
			r := ktypes.RealServer{RSKey: ktypes.RSKey{Address: netip.AddrFrom4([4]byte{10, 1 + byte(k), byte(i >> 8), byte(i)}), Port: 8080}, Weight: 1}
			adds = append(adds, netlinkutil.Write{Kind: ktypes.OpAddRealServer, VirtualServer: v, RealServer: r})
		}
		dels = append(dels, netlinkutil.Write{Kind: ktypes.OpDeleteVirtualServer, VirtualServer: v})
	}
	out := map[string]float64{}
	timed := func(name string, fn func() error) error {
		start := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[name] = time.Since(start).Seconds()
		fmt.Fprintf(os.Stderr, "%-44s %v\n", name, time.Since(start).Round(time.Millisecond))
		return nil
	}
	oneByOne := func(h netlinkutil.IPVS, ws []netlinkutil.Write) error {
		for _, w := range ws {
			var err error
			switch w.Kind {
			case ktypes.OpAddVirtualServer:
				err = h.AddVirtualServer(w.VirtualServer)
			case ktypes.OpAddRealServer:
				err = h.AddRealServer(w.VirtualServer.VSKey, w.RealServer)
			case ktypes.OpDeleteVirtualServer:
				err = h.DeleteVirtualServer(w.VirtualServer.VSKey)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	batched := func(h netlinkutil.IPVS, ws []netlinkutil.Write) error {
		for i, err := range h.Apply(ws) {
			if err != nil {
				return fmt.Errorf("write %d: %w", i, err)
			}
		}
		return nil
	}
	// Reads of every destination: one dump per virtual server; the same
	// over four sockets in parallel; the bulk read.
	perVS := func(h netlinkutil.IPVS, keys []ktypes.VSKey) error {
		for _, k := range keys {
			if _, err := h.ListRealServers(k); err != nil {
				return err
			}
		}
		return nil
	}
	parallel := func() error {
		const socks = 4
		var wg sync.WaitGroup
		errs := make([]error, socks)
		for s := range socks {
			hs, err := netlinkutil.NewIPVS() // on the namespace's thread
			if err != nil {
				return err
			}
			defer hs.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[s] = perVS(hs, keys[s*len(keys)/socks:(s+1)*len(keys)/socks])
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	bulk := func(h netlinkutil.IPVS) error {
		all, err := h.ListAllRealServers()
		if err == nil && len(all) != n {
			err = fmt.Errorf("bulk read: %d virtual servers, want %d", len(all), n)
		}
		return err
	}
	type step struct {
		name string
		fn   func(h netlinkutil.IPVS) error
	}
	for _, way := range [][]step{
		{
			{"create one at a time", func(h netlinkutil.IPVS) error { return oneByOne(h, adds) }},
			{"read one dump per VS", func(h netlinkutil.IPVS) error { return perVS(h, keys) }},
			{"read one dump per VS, 4 sockets in parallel", func(netlinkutil.IPVS) error { return parallel() }},
			{"read bulk", bulk},
			{"delete one at a time", func(h netlinkutil.IPVS) error { return oneByOne(h, dels) }},
			{"create one at a time after a delete", func(h netlinkutil.IPVS) error { return oneByOne(h, adds) }},
		},
		{
			{"create batched", func(h netlinkutil.IPVS) error { return batched(h, adds) }},
			{"delete batched", func(h netlinkutil.IPVS) error { return batched(h, dels) }},
			{"create batched after a delete", func(h netlinkutil.IPVS) error { return batched(h, adds) }},
		},
	} {
		err := inFreshNetns(func() error {
			h, err := netlinkutil.NewIPVS()
			if err != nil {
				return err
			}
			defer h.Close()
			for _, st := range way {
				if err := timed(st.name, func() error { return st.fn(h) }); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := ipsetFigures(2*n, timed); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// inFreshNetns runs fn on a locked thread in a new network namespace with a
// route to 10.0.0.0/8 (IPVS refuses a NAT real server without a route), and
// comes back. Failing to come back is an error, and leaves the thread
// locked, so that the runtime ends it with the goroutine instead of running
// other goroutines in the fresh namespace.
func inFreshNetns(fn func() error) (err error) {
	runtime.LockOSThread()
	restored := true
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		return fmt.Errorf("new netns: %w", err)
	}
	defer ns.Close()
	defer func() {
		if serr := netns.Set(orig); serr != nil {
			restored = false
			err = errors.Join(err, fmt.Errorf("back to the original netns: %w", serr))
		}
	}()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "nlbench0"
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
		return fmt.Errorf("add nlbench0: %w", err)
	}
	link, err := netlink.LinkByName(attrs.Name)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	return fn()
}

// ipsetFigures adds n hash:ip,port,ip entries (the shape of the glue's
// hairpin set) one message at a time, then in bulk, to fresh sets.
func ipsetFigures(n int, timed func(string, func() error) error) error {
	k, err := ipset.NewKernel()
	if err != nil {
		return err
	}
	defer k.Close()
	var entries []ipset.Entry
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		entries = append(entries, ipset.Entry{Addr: a, Proto: ktypes.TCP, Port: 8080, Addr2: a})
	}
	for _, mode := range []struct {
		name, set string
		add       func(name string) error
	}{
		{"ipset one at a time", "IPVSP-BENCH-1", func(name string) error {
			for _, e := range entries {
				if err := k.Add(name, e); err != nil {
					return err
				}
			}
			return nil
		}},
		{"ipset bulk", "IPVSP-BENCH-N", func(name string) error { return k.Add(name, entries...) }},
	} {
		if err := k.Create(ipset.Spec{Name: mode.set, Type: ipset.HashIPPortIP, Family: ipset.IPv4}); err != nil {
			return err
		}
		err := timed(fmt.Sprintf("%s (%d entries)", mode.name, n), func() error { return mode.add(mode.set) })
		if derr := k.Destroy(mode.set); err == nil {
			err = derr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
