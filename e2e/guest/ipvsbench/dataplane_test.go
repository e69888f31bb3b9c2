package main

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// nftSample is `nft list table ip kube-proxy` as kube-proxy v1.36's
// nftables mode leaves it for two Services (cut down: the stock chains
// and sets that do not name Services are left out).
const nftSample = `table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.0.10, 10.96.0.11 }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-bench/svc-00000/tcp/,
			     10.96.0.11 . tcp . 80 : goto service-42NFTM6N-bench/svc-00001/tcp/ }
	}

	chain service-ULMVA6XW-bench/svc-00000/tcp/ {
		ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.176.0.1 . 8080, 1 : 10.176.0.17 . 8080 }
	}

	chain service-42NFTM6N-bench/svc-00001/tcp/ {
		ip daddr 10.96.0.11 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.176.0.2 . 8080, 1 : 10.176.0.18 . 8080 }
	}
}
`

func TestCheckNFTTable(t *testing.T) {
	both := []Service{
		{VIP: "10.96.0.10", Port: 80, RS: []string{"10.176.0.17:8080", "10.176.0.1:8080"}},
		{VIP: "10.96.0.11", Port: 80, RS: []string{"10.176.0.2:8080", "10.176.0.18:8080"}},
	}
	if err := checkNFTTable(nftSample, both); err != nil {
		t.Errorf("the sample holds both Services: %v", err)
	}
	for _, tc := range []struct {
		name string
		want []Service
		err  string
	}{
		{"missing Service", []Service{{VIP: "10.96.0.12", Port: 80, RS: []string{"10.176.0.3:8080"}}}, "10.96.0.12:80 is not in service-ips"},
		{"other port", []Service{{VIP: "10.96.0.10", Port: 81, RS: []string{"10.176.0.1:8080"}}}, "10.96.0.10:81 is not in service-ips"},
		{"moved endpoint", []Service{{VIP: "10.96.0.11", Port: 80, RS: []string{"10.176.0.3:8080", "10.176.0.18:8080"}}},
			"10.96.0.11:80 (chain service-42NFTM6N-bench/svc-00001/tcp/) goes to [10.176.0.18:8080 10.176.0.2:8080]"},
	} {
		err := checkNFTTable(nftSample, tc.want)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.err)
		}
	}
}

func TestDNATEndpoints(t *testing.T) {
	// `nft list chain` of one Service's chain.
	chain := `table ip kube-proxy {
	chain service-ULMVA6XW-bench/svc-00000/tcp/ {
		ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.176.0.1 . 8080, 1 : 10.176.0.17 . 8080 }
	}
}`
	got := strings.Join(dnatEndpoints(strings.Split(chain, "\n")), " ")
	if want := "10.176.0.1:8080 10.176.0.17:8080"; got != want {
		t.Errorf("dnatEndpoints = %q, want %q", got, want)
	}
	m := nftServiceElem.FindStringSubmatch(`elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-bench/svc-00000/tcp/ }`)
	if m == nil || m[3] != "service-ULMVA6XW-bench/svc-00000/tcp/" {
		t.Errorf("service-ips element: got %q", m)
	}
}

// TestNFTViewOnKernel programs a table like kube-proxy's nftables mode in
// a fresh network namespace with the nft command and reads it back through
// nftView's netlink reads (and its check through nft). It needs root and
// nft: in the VM both are there (TestKernelPackagesInVM runs it), elsewhere
// it skips.
func TestNFTViewOnKernel(t *testing.T) {
	nltest.InFreshNetns(t)
	_, err := exec.LookPath("nft")
	nltest.Require(t, "the nft command", err)
	v, err := openNFT()
	nltest.Require(t, "nf_tables over netlink", err)
	defer v.Close()
	// No table yet: nothing is programmed, and that is not an error.
	if left, err := v.missing([]Service{{VIP: "10.96.0.10", Port: 80}}); err != nil || len(left) != 1 {
		t.Errorf("missing without a table = %v, %v; want the one Service", left, err)
	}
	if eps, err := v.endpoints(netip.MustParseAddrPort("10.96.0.10:80")); err != nil || eps != nil {
		t.Errorf("endpoints without a table = %v, %v; want none", eps, err)
	}
	chain := "service-ULMVA6XW-bench/svc-00000/tcp/http"
	script := `add table ip kube-proxy
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add chain ip kube-proxy ` + chain + `
add rule ip kube-proxy ` + chain + ` ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.100.0.0/14 counter
add rule ip kube-proxy ` + chain + ` meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.176.0.16 . 8080 , 1 : 10.176.0.32 . 8080 }
add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto ` + chain + ` }
add element ip kube-proxy service-ips { 10.96.0.11 . udp . 80 : goto ` + chain + ` }
`
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		nltest.Require(t, "nf_tables", fmt.Errorf("%w: %s", err, out))
	}
	left, err := v.missing([]Service{{VIP: "10.96.0.10", Port: 80}, {VIP: "10.96.0.11", Port: 80}})
	if err != nil || len(left) != 1 || left[0].VIP != "10.96.0.11" {
		t.Errorf("missing = %v, %v; want only 10.96.0.11:80", left, err)
	}
	look, err := v.reader()
	if err != nil {
		t.Fatal(err)
	}
	if eps, err := look(netip.MustParseAddrPort("10.96.0.10:80")); err != nil || fmt.Sprint(eps) != "[10.176.0.16 10.176.0.32]" {
		t.Errorf("reader's endpoints = %v, %v", eps, err)
	}
	if eps, err := look(netip.MustParseAddrPort("10.96.0.11:80")); err != nil || eps != nil {
		t.Errorf("reader's endpoints of a virtual server not in service-ips (TCP) = %v, %v; want none", eps, err)
	}
	eps, err := v.endpoints(netip.MustParseAddrPort("10.96.0.10:80"))
	if err != nil || fmt.Sprint(eps) != "[10.176.0.16 10.176.0.32]" {
		t.Errorf("endpoints = %v, %v", eps, err)
	}
	want := []Service{{VIP: "10.96.0.10", Port: 80, RS: []string{"10.176.0.16:8080", "10.176.0.32:8080"}}}
	if err := v.check(want); err != nil {
		t.Errorf("check: %v", err)
	}
	want[0].RS[1] = "10.176.0.33:8080"
	if err := v.check(want); err == nil {
		t.Errorf("check passed with an endpoint the table does not have")
	}
}
