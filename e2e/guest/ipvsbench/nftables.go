package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftTable is kube-proxy's nftables table (family ip).
const nftTable = "kube-proxy"

// nftView reads kube-proxy's nftables mode. Its map service-ips sends a
// clusterIP . protocol . port to the Service port's chain, whose rule
// DNATs new connections to one of its endpoints (`dnat ip addr . port to
// numgen random mod N map { 0 : IP . PORT, ... }`, kube-proxy v1.36
// without session affinity).
//
// The polls (missing, endpoints, reader) ask the kernel over netlink for
// exactly what they need: one dump of service-ips, then one Service's
// chain and its anonymous map. The nft command is not used for them: to
// list one chain, nft first reads every set's elements in the table (one
// request per set, and kube-proxy makes an anonymous map per Service), so
// at 10,000 Services one `nft list chain` took 17-31 s in the VM and the
// bench measured its own reads, not kube-proxy. check, run once the
// proxy is idle, reads the whole table with nft: an independent reading
// of the same state.
type nftView struct {
	conn  *nftables.Conn
	table *nftables.Table
	// chains caches each virtual IP:port's chain (its name is a hash of
	// the Service port's name: it does not change with the endpoints).
	chains map[netip.AddrPort]string
}

func openNFT() (*nftView, error) {
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables netlink connection: %w", err)
	}
	return &nftView{
		conn:   conn,
		table:  &nftables.Table{Name: nftTable, Family: nftables.TableFamilyIPv4},
		chains: map[netip.AddrPort]string{},
	}, nil
}

func (v *nftView) Close() { _ = v.conn.CloseLasting() }

// absent tells a netlink error that means "no such table, chain or set".
// The library formats the kernel's error into its own with %v, so the
// errno is matched by its text as well.
func absent(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || strings.HasSuffix(err.Error(), unix.ENOENT.Error()))
}

// serviceIPs dumps service-ips: each TCP virtual IP:port's chain. A
// missing table or map is an empty map.
func (v *nftView) serviceIPs() (map[netip.AddrPort]string, error) {
	elems, err := v.conn.GetSetElements(&nftables.Set{Table: v.table, Name: "service-ips"})
	if absent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: dump service-ips: %w", err)
	}
	out := make(map[netip.AddrPort]string, len(elems))
	for _, e := range elems {
		vs, ok := serviceIPsKey(e.Key)
		if !ok {
			continue
		}
		chain, err := gotoChain(e.Val)
		if err != nil {
			return nil, fmt.Errorf("nftables: service-ips element %s: %w", vs, err)
		}
		out[vs] = chain
	}
	return out, nil
}

// serviceIPsKey decodes a key of type ipv4_addr . inet_proto . inet_service
// (each field padded to 4 bytes); ok is false for other protocols than TCP.
func serviceIPsKey(k []byte) (vs netip.AddrPort, ok bool) {
	if len(k) != 12 || k[4] != unix.IPPROTO_TCP {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(k[:4])), binary.BigEndian.Uint16(k[8:10])), true
}

// gotoChain decodes a verdict map's data (NFTA_DATA_VERDICT's attributes):
// the chain of a goto or jump.
func gotoChain(b []byte) (string, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", err
	}
	ad.ByteOrder = binary.BigEndian
	var chain string
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			chain = ad.String()
		}
	}
	if err := ad.Err(); err != nil {
		return "", err
	}
	if chain == "" {
		return "", errors.New("verdict names no chain")
	}
	return chain, nil
}

// missing dumps service-ips once.
func (v *nftView) missing(ss []Service) ([]Service, error) {
	have, err := v.serviceIPs()
	if err != nil {
		return nil, err
	}
	var left []Service
	for _, s := range ss {
		a, err := netip.ParseAddr(s.VIP)
		if err != nil {
			return nil, fmt.Errorf("service VIP %q: %w", s.VIP, err)
		}
		if _, ok := have[netip.AddrPortFrom(a, s.Port)]; !ok {
			left = append(left, s)
		}
	}
	return left, nil
}

// serviceChain is the chain that service-ips sends vs to ("" if none). A
// virtual server not cached yet costs one dump of service-ips, which
// caches them all.
func (v *nftView) serviceChain(vs netip.AddrPort) (string, error) {
	if c, ok := v.chains[vs]; ok {
		return c, nil
	}
	all, err := v.serviceIPs()
	if err != nil {
		return "", err
	}
	for k, c := range all {
		v.chains[k] = c
	}
	return v.chains[vs], nil
}

// endpoints reads the endpoints of vs's chain.
func (v *nftView) endpoints(vs netip.AddrPort) ([]netip.Addr, error) {
	c, err := v.serviceChain(vs)
	if err != nil || c == "" {
		return nil, err
	}
	return v.chainEndpoints(c)
}

// chainEndpoints reads chain c (one rule dump filtered by the kernel to
// that chain) and the anonymous map of its DNAT rule.
func (v *nftView) chainEndpoints(c string) ([]netip.Addr, error) {
	rules, err := v.conn.GetRules(v.table, &nftables.Chain{Name: c})
	if absent(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: rules of %s: %w", c, err)
	}
	var addrs []netip.Addr
	for _, r := range rules {
		m := dnatMap(r.Exprs)
		if m == "" {
			continue
		}
		elems, err := v.conn.GetSetElements(&nftables.Set{Table: v.table, Name: m})
		if absent(err) { // replaced between the two reads: the caller polls again
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("nftables: map %s of %s: %w", m, c, err)
		}
		for _, e := range elems {
			// ipv4_addr . inet_service: the address, then the
			// port padded to 4 bytes.
			if len(e.Val) != 8 {
				return nil, fmt.Errorf("nftables: map %s of %s: element data of %d bytes, want 8 (address . port)", m, c, len(e.Val))
			}
			addrs = append(addrs, netip.AddrFrom4([4]byte(e.Val[:4])))
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs, nil
}

// dnatMap is the map a DNAT rule looks its address and port up in ("" if
// the rule is not one).
func dnatMap(exprs []expr.Any) string {
	var m string
	nat := false
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Lookup:
			if e.IsDestRegSet {
				m = e.SetName
			}
		case *expr.NAT:
			nat = e.Type == expr.NATTypeDestNAT
		}
	}
	if !nat {
		return ""
	}
	return m
}

// reader dumps service-ips once; each virtual server then costs a read of
// its chain and its map (one not in that dump has none: no dump again).
func (v *nftView) reader() (func(netip.AddrPort) ([]netip.Addr, error), error) {
	chains, err := v.serviceIPs()
	if err != nil {
		return nil, err
	}
	return func(vs netip.AddrPort) ([]netip.Addr, error) {
		c, ok := chains[vs]
		if !ok {
			return nil, nil
		}
		return v.chainEndpoints(c)
	}, nil
}

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
	// nftServiceElem is one element of service-ips in nft's listing.
	nftServiceElem = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. (\d+) : goto "?([^\s,}"]+)`)
	// nftEndpoint is one endpoint in a DNAT rule's map in nft's listing.
	nftEndpoint = regexp.MustCompile(`: (\d+\.\d+\.\d+\.\d+) \. (\d+)`)
)

// dnatEndpoints reads the endpoints of the DNAT rules among a chain's
// lines in nft's listing.
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
