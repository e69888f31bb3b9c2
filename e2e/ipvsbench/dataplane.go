package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/moby/ipvs"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// dataplane is where a proxy's Services show in the kernel: IPVS (with
// the proxy's interface, ipset and nat rule) or kube-proxy's nftables
// table.
type dataplane interface {
	// missing returns those of ss whose virtual IP and port are not
	// programmed yet (their endpoints aside), for settle's first figure,
	// as cheaply as the kernel allows: IPVS is asked about the last one
	// until one is missing (one GET each), nftables's service-ips is read
	// once (a run of nft costs 0.4 s and more under emulation).
	missing(ss []Service) ([]Service, error)
	// check tells the first thing in want that the kernel lacks.
	check(want []Service) error
	// endpoints lists the addresses that new connections to vs go to.
	endpoints(vs netip.AddrPort) ([]netip.Addr, error)
	// reader answers endpoints for many virtual servers: from one read of
	// the kernel (nftables), or one read each (IPVS).
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
		return &nftView{chains: map[netip.AddrPort]string{}}, nil
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

// missing asks about the last of ss, one GET each, until one is missing.
func (v *ipvsView) missing(ss []Service) ([]Service, error) {
	for len(ss) > 0 {
		if _, err := v.h.GetService(ipvsService(ss[len(ss)-1])); err != nil {
			break
		}
		ss = ss[:len(ss)-1]
	}
	return ss, nil
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

// nftTable is kube-proxy's nftables table (family ip).
const nftTable = "kube-proxy"

// nftView reads kube-proxy's nftables mode with the nft command: its map
// service-ips sends a clusterIP . protocol . port to the Service port's
// chain, whose rule DNATs new connections to one of its endpoints
// (`dnat ip addr . port to numgen random mod N map { 0 : IP . PORT, ... }`,
// kube-proxy v1.36 without session affinity).
type nftView struct {
	// chains caches each virtual IP:port's chain (its name is a hash of
	// the Service port's name: it does not change with the endpoints).
	chains map[netip.AddrPort]string
}

func (v *nftView) Close() {}

// nft runs nft; absent reports an error that means "not there" (nft's
// exit status 1: no such table, chain or element).
func nft(args ...string) (out string, absent bool, err error) {
	b, err := exec.Command("nft", args...).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "", ee.ExitCode() == 1, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
	}
	if err != nil {
		return "", false, fmt.Errorf("nft %s: %w", strings.Join(args, " "), err)
	}
	return string(b), false, nil
}

var (
	// nftServiceElem is one element of service-ips.
	nftServiceElem = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. (\d+) : goto "?([^\s,}"]+)`)
	// nftEndpoint is one endpoint in a DNAT rule's map.
	nftEndpoint = regexp.MustCompile(`: (\d+\.\d+\.\d+\.\d+) \. (\d+)`)
)

// serviceChain is the chain that service-ips sends vs to ("" if none).
func (v *nftView) serviceChain(vs netip.AddrPort) (string, error) {
	if c, ok := v.chains[vs]; ok {
		return c, nil
	}
	out, absent, err := nft("get", "element", "ip", nftTable, "service-ips",
		fmt.Sprintf("{ %s . tcp . %d }", vs.Addr(), vs.Port()))
	if absent {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	m := nftServiceElem.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("nft: no chain for %s in %q", vs, out)
	}
	v.chains[vs] = m[3]
	return m[3], nil
}

// missing reads service-ips once.
func (v *nftView) missing(ss []Service) ([]Service, error) {
	out, absent, err := nft("list", "map", "ip", nftTable, "service-ips")
	if absent {
		return ss, nil
	}
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, m := range nftServiceElem.FindAllStringSubmatch(out, -1) {
		have[m[1]+":"+m[2]] = true
	}
	var left []Service
	for _, s := range ss {
		if !have[fmt.Sprintf("%s:%d", s.VIP, s.Port)] {
			left = append(left, s)
		}
	}
	return left, nil
}

// reader reads the whole table once.
func (v *nftView) reader() (func(netip.AddrPort) ([]netip.Addr, error), error) {
	out, absent, err := nft("list", "table", "ip", nftTable)
	if err != nil && !absent {
		return nil, err
	}
	chains, elems := parseNFTTable(out)
	return func(vs netip.AddrPort) ([]netip.Addr, error) {
		var addrs []netip.Addr
		for _, e := range dnatEndpoints(chains[elems[vs.String()]]) {
			ap, err := netip.ParseAddrPort(e)
			if err != nil {
				return nil, err
			}
			addrs = append(addrs, ap.Addr())
		}
		return addrs, nil
	}, nil
}

// dnatEndpoints reads the endpoints of the DNAT rules among a chain's
// lines.
func dnatEndpoints(lines []string) []string {
	var out []string
	for _, l := range lines {
		_, m, ok := strings.Cut(l, " map {")
		if !ok || !strings.Contains(l, "dnat ") {
			continue
		}
		for _, e := range nftEndpoint.FindAllStringSubmatch(m, -1) {
			out = append(out, e[1]+":"+e[2])
		}
	}
	return out
}

func (v *nftView) endpoints(vs netip.AddrPort) ([]netip.Addr, error) {
	c, err := v.serviceChain(vs)
	if err != nil || c == "" {
		return nil, err
	}
	out, absent, err := nft("list", "chain", "ip", nftTable, c)
	if absent {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, e := range dnatEndpoints(strings.Split(out, "\n")) {
		ap, err := netip.ParseAddrPort(e)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, ap.Addr())
	}
	return addrs, nil
}

// check reads the whole table once: each wanted Service's element of
// service-ips, and its chain's DNAT endpoints.
func (v *nftView) check(want []Service) error {
	out, absent, err := nft("list", "table", "ip", nftTable)
	if absent {
		return fmt.Errorf("no table ip %s", nftTable)
	}
	if err != nil {
		return err
	}
	return checkNFTTable(out, want)
}

// checkNFTTable checks `nft list table ip kube-proxy` output against want.
func checkNFTTable(out string, want []Service) error {
	chains, elems := parseNFTTable(out)
	for _, s := range want {
		key := fmt.Sprintf("%s:%d", s.VIP, s.Port)
		c, ok := elems[key]
		if !ok {
			return fmt.Errorf("%s is not in service-ips", key)
		}
		got := slices.Sorted(slices.Values(dnatEndpoints(chains[c])))
		if w := slices.Sorted(slices.Values(s.RS)); !slices.Equal(got, w) {
			return fmt.Errorf("%s (chain %s) goes to %v, want %v", key, c, got, w)
		}
	}
	return nil
}

// parseNFTTable splits `nft list table` output into each chain's lines
// and service-ips's elements (VIP:PORT -> chain).
func parseNFTTable(out string) (chains map[string][]string, elems map[string]string) {
	chains, elems = map[string][]string{}, map[string]string{}
	var chain string
	inMap := false
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "chain ") && strings.HasSuffix(t, "{"):
			chain = strings.Trim(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(t, "chain "), "{")), `"`)
			chains[chain] = nil
		case strings.HasPrefix(t, "map service-ips ") || t == "map service-ips {":
			inMap = true
		case t == "}":
			chain, inMap = "", false
		case inMap:
			for _, m := range nftServiceElem.FindAllStringSubmatch(t, -1) {
				elems[m[1]+":"+m[2]] = m[3]
			}
		case chain != "":
			chains[chain] = append(chains[chain], t)
		}
	}
	return chains, elems
}
