package main

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/moby/ipvs"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// dataplane is where a proxy's Services show in the kernel: IPVS (with
// the proxy's interface, ipset and nat rule) or kube-proxy's nftables
// table.
type dataplane interface {
	// missing returns those of ss whose virtual IP and port are not
	// programmed yet (their endpoints aside), for settle's first figure,
	// as cheaply as the kernel allows: IPVS is asked about the last one
	// until one is missing (one GET each; one dump for the rest once many
	// in a row are there), nftables's service-ips is dumped once.
	missing(ss []Service) ([]Service, error)
	// check tells the first thing in want that the kernel lacks.
	check(want []Service) error
	// endpoints lists the addresses that new connections to vs go to.
	endpoints(vs netip.AddrPort) ([]netip.Addr, error)
	// reader answers endpoints for many virtual servers: after one dump
	// of service-ips (nftables), or with one read each (IPVS).
	reader() (func(netip.AddrPort) ([]netip.Addr, error), error)
	Close()
}

// dataplaneFlags select and configure the dataplane.
type dataplaneFlags struct {
	kind, iface, set string
}

func (d *dataplaneFlags) register(fs interface {
	StringVar(p *string, name, value, usage string)
}, withChecks bool) {
	d.kind = "ipvs"
	fs.StringVar(&d.kind, "dataplane", "ipvs", "where the proxy programs Services: ipvs or nftables (kube-proxy's table "+nftTable+")")
	if withChecks {
		fs.StringVar(&d.iface, "iface", "", "ipvs: the proxy's dummy interface, which must hold every VIP")
		fs.StringVar(&d.set, "set", "", "ipvs: the proxy's ipset of clusterIP,proto:port entries; the nat table must match it")
	}
}

func (d dataplaneFlags) open() (dataplane, error) {
	switch d.kind {
	case "ipvs":
		return openIPVS(d.iface, d.set)
	case "nftables":
		return openNFT()
	}
	return nil, fmt.Errorf("-dataplane %q: want ipvs or nftables", d.kind)
}

// ipvsView is IPVS with the proxy's interface and ipset.
type ipvsView struct {
	h          *ipvs.Handle
	k          netlinkutil.IPVS
	links      netlinkutil.Links
	iface, set string
}

func openIPVS(iface, set string) (*ipvsView, error) {
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("ipvs handle: %w", err)
	}
	k, err := netlinkutil.NewIPVS()
	if err != nil {
		h.Close()
		return nil, err
	}
	links, err := netlinkutil.NewLinks()
	if err != nil {
		h.Close()
		k.Close()
		return nil, err
	}
	return &ipvsView{h: h, k: k, links: links, iface: iface, set: set}, nil
}

func (v *ipvsView) Close() { v.h.Close(); v.k.Close() }

// missing asks about the last of ss, one GET each, until one is missing
// (cheap while the proxy writes: in a random order, a run of present ones
// is short until nearly all are there). After dumpAfter present ones in
// a row, the rest are read with one dump of the virtual servers instead:
// a GET each took seconds under emulation at 10,000 Services once the
// proxy had written them all, and that lag was counted as the proxy's.
// Dumping at every poll instead slowed the proxy's own writes.
func (v *ipvsView) missing(ss []Service) ([]Service, error) {
	for n := 0; len(ss) > 0; n++ {
		if n == dumpAfter {
			return v.notListed(ss)
		}
		if _, err := v.h.GetService(ipvsService(ss[len(ss)-1])); err != nil {
			break
		}
		ss = ss[:len(ss)-1]
	}
	return ss, nil
}

// dumpAfter is how many present virtual servers in a row make missing
// read the rest with one dump.
const dumpAfter = 64

// notListed returns those of ss that one dump of the virtual servers
// lacks.
func (v *ipvsView) notListed(ss []Service) ([]Service, error) {
	vss, err := v.k.ListVirtualServers()
	if err != nil {
		return nil, err
	}
	have := make(map[ktypes.VSKey]bool, len(vss))
	for _, vs := range vss {
		have[vs.VSKey] = true
	}
	var left []Service
	for _, s := range ss {
		if !have[vsKey(s)] {
			left = append(left, s)
		}
	}
	return left, nil
}

func (v *ipvsView) reader() (func(netip.AddrPort) ([]netip.Addr, error), error) {
	return v.endpoints, nil
}

func (v *ipvsView) endpoints(vs netip.AddrPort) ([]netip.Addr, error) {
	rss, err := v.k.ListRealServers(vsKey(Service{VIP: vs.Addr().String(), Port: vs.Port()}))
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, r := range rss {
		out = append(out, r.Address)
	}
	return out, nil
}

func (v *ipvsView) check(want []Service) error {
	if v.iface == "" || v.set == "" {
		return errors.New("ipvs: -iface and -set are required")
	}
	return check(v.k, v.links, want, v.iface, v.set)
}
