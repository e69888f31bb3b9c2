package glue

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// wantDumpIPv4 is the whole rule dump of IPv4 with a cluster CIDR: every
// rule ipvs-proxy ever writes, whatever the number of Services.
const wantDumpIPv4 = `*nat
:IPVSP-SERVICES - [0:0]
:IPVSP-FIREWALL - [0:0]
:IPVSP-IN-CLUSTER - [0:0]
:IPVSP-MARK-MASQ - [0:0]
:IPVSP-POSTROUTING - [0:0]
:IPVSP-DSR - [0:0]
:IPVSP-DSR-HOST - [0:0]
:IPVSP-DSR-REDIRECT - [0:0]
-I PREROUTING 1 -m comment --comment "ipvs-proxy: Service traffic" -j IPVSP-SERVICES
-I OUTPUT 1 -m comment --comment "ipvs-proxy: Service traffic" -j IPVSP-SERVICES
-I POSTROUTING 1 -m comment --comment "ipvs-proxy: masquerade" -j IPVSP-POSTROUTING
-A IPVSP-SERVICES -m set --match-set IPVSP-LB-FW dst,dst -j IPVSP-FIREWALL
-A IPVSP-SERVICES -m set --match-set IPVSP-DSR dst,dst -j IPVSP-DSR
-A IPVSP-SERVICES -m set --match-set IPVSP-CLUSTER-IP dst,dst -m set ! --match-set IPVSP-CLUSTER-CIDR src -j IPVSP-MARK-MASQ
-A IPVSP-SERVICES -m set --match-set IPVSP-IN-CLUSTER-ONLY dst,dst -j IPVSP-IN-CLUSTER
-A IPVSP-SERVICES -m set --match-set IPVSP-EXTERNAL dst,dst -j IPVSP-MARK-MASQ
-A IPVSP-FIREWALL -m set --match-set IPVSP-LB-SRC dst,dst,src -j RETURN
-A IPVSP-FIREWALL -m set --match-set IPVSP-LB-SRC-IP dst,dst,src -j RETURN
-A IPVSP-FIREWALL -j MARK --set-xmark 0x8000/0x8000
-A IPVSP-IN-CLUSTER -m set --match-set IPVSP-CLUSTER-CIDR src -j RETURN
-A IPVSP-IN-CLUSTER -m addrtype ! --src-type LOCAL -j MARK --set-xmark 0x8000/0x8000
-A IPVSP-IN-CLUSTER -j MARK --set-xmark 0x4000/0x4000
-A IPVSP-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A IPVSP-POSTROUTING -m set --match-set IPVSP-HAIRPIN dst,dst,src -j MASQUERADE
-A IPVSP-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A IPVSP-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A IPVSP-POSTROUTING -j MASQUERADE --random-fully
-A IPVSP-DSR -m set --match-set IPVSP-CLUSTER-CIDR src -j IPVSP-DSR-REDIRECT
-A IPVSP-DSR -m addrtype --src-type LOCAL -j IPVSP-DSR-HOST
-A IPVSP-DSR-HOST -j MARK --set-xmark 0x4000/0x4000
-A IPVSP-DSR-HOST -j IPVSP-DSR-REDIRECT
COMMIT
*filter
:IPVSP-INPUT - [0:0]
:IPVSP-SOURCE-RANGES - [0:0]
:IPVSP-FORWARD - [0:0]
:IPVSP-OUTPUT - [0:0]
-I INPUT 1 -m comment --comment "ipvs-proxy: source ranges, Service ports, VIP protection" -j IPVSP-INPUT
-I FORWARD 1 -m comment --comment "ipvs-proxy: marked and established traffic" -j IPVSP-FORWARD
-I OUTPUT 1 -m comment --comment "ipvs-proxy: source ranges of traffic from the node" -j IPVSP-OUTPUT
-A IPVSP-INPUT -m mark --mark 0x8000/0x8000 -j DROP
-A IPVSP-INPUT -m set --match-set IPVSP-LB-FW dst,dst -j IPVSP-SOURCE-RANGES
-A IPVSP-INPUT -m set --match-set IPVSP-SERVICE dst,dst -j RETURN
-A IPVSP-INPUT -p tcp -m set --match-set IPVSP-HC-NODE-PORT dst -j ACCEPT
-A IPVSP-INPUT -p tcp -m set --match-set IPVSP-VIP dst -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset
-A IPVSP-INPUT -m set --match-set IPVSP-VIP dst -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable
-A IPVSP-INPUT -p tcp -m set --match-set IPVSP-SERVICE-RANGE dst -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset
-A IPVSP-INPUT -m set --match-set IPVSP-SERVICE-RANGE dst -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable
-A IPVSP-SOURCE-RANGES -m set --match-set IPVSP-LB-SRC dst,dst,src -j RETURN
-A IPVSP-SOURCE-RANGES -m set --match-set IPVSP-LB-SRC-IP dst,dst,src -j RETURN
-A IPVSP-SOURCE-RANGES -j DROP
-A IPVSP-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
-A IPVSP-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A IPVSP-OUTPUT -m mark --mark 0x8000/0x8000 -j DROP
COMMIT
`

func TestRulesDumpIPv4(t *testing.T) {
	got := Dump(Rules(RuleConfig{Family: ipset.IPv4, ClusterCIDR: true}))
	if diff := cmp.Diff(wantDumpIPv4, got); diff != "" {
		t.Errorf("rule dump (-want +got):\n%s", diff)
	}
}

// TestRulesDumpVariants: the other families and masquerade settings change
// only the set names, the reject type and the clusterIP masquerade rule.
func TestRulesDumpVariants(t *testing.T) {
	clusterIPRule := "-A IPVSP-SERVICES -m set --match-set IPVSP-CLUSTER-IP dst,dst -m set ! --match-set IPVSP-CLUSTER-CIDR src -j IPVSP-MARK-MASQ\n"
	podsRule := "-A IPVSP-IN-CLUSTER -m set --match-set IPVSP-CLUSTER-CIDR src -j RETURN\n"
	dsrPodsRule := "-A IPVSP-DSR -m set --match-set IPVSP-CLUSTER-CIDR src -j IPVSP-DSR-REDIRECT\n"
	for _, tc := range []struct {
		name string
		cfg  RuleConfig
		want string
	}{
		{"masquerade all", RuleConfig{Family: ipset.IPv4, MasqueradeAll: true, ClusterCIDR: true},
			strings.NewReplacer(clusterIPRule, "-A IPVSP-SERVICES -m set --match-set IPVSP-CLUSTER-IP dst,dst -j IPVSP-MARK-MASQ\n",
				dsrPodsRule, "-A IPVSP-DSR -m set --match-set IPVSP-CLUSTER-CIDR src -j IPVSP-DSR-HOST\n").Replace(wantDumpIPv4)},
		{"no cluster CIDR", RuleConfig{Family: ipset.IPv4},
			strings.NewReplacer(clusterIPRule, "-A IPVSP-SERVICES -m set --match-set IPVSP-CLUSTER-IP dst,dst -m set --match-set IPVSP-VIP src -j IPVSP-MARK-MASQ\n",
				podsRule, "", dsrPodsRule, "").Replace(wantDumpIPv4)},
		{"pods on a bridge", RuleConfig{Family: ipset.IPv4, BridgeInterface: "cbr0"},
			strings.NewReplacer(clusterIPRule, "-A IPVSP-SERVICES ! -i cbr0 -m set --match-set IPVSP-CLUSTER-IP dst,dst -j IPVSP-MARK-MASQ\n",
				podsRule, "-A IPVSP-IN-CLUSTER -i cbr0 -j RETURN\n",
				dsrPodsRule, "-A IPVSP-DSR -i cbr0 -j IPVSP-DSR-REDIRECT\n").Replace(wantDumpIPv4)},
		{"pods on interfaces named so", RuleConfig{Family: ipset.IPv4, InterfacePrefix: "veth"},
			strings.NewReplacer(clusterIPRule, "-A IPVSP-SERVICES ! -i veth+ -m set --match-set IPVSP-CLUSTER-IP dst,dst -j IPVSP-MARK-MASQ\n",
				podsRule, "-A IPVSP-IN-CLUSTER -i veth+ -j RETURN\n",
				dsrPodsRule, "-A IPVSP-DSR -i veth+ -j IPVSP-DSR-REDIRECT\n").Replace(wantDumpIPv4)},
		{"Service traffic accepted ahead of the host's firewall", RuleConfig{Family: ipset.IPv4, ClusterCIDR: true, AcceptServices: true},
			strings.Replace(wantDumpIPv4, "IPVSP-SERVICE dst,dst -j RETURN", "IPVSP-SERVICE dst,dst -j ACCEPT", 1)},
		{"direct server return", RuleConfig{Family: ipset.IPv4, ClusterCIDR: true, Redirects: []Redirect{
			{VIP: netip.MustParseAddr("198.51.100.10"), Protocol: ktypes.TCP, Port: 80, To: netip.MustParseAddrPort("10.96.0.10:80")},
			{VIP: netip.MustParseAddr("198.51.100.53"), Protocol: ktypes.UDP, Port: 53, To: netip.MustParseAddrPort("10.96.0.53:53")},
		}}, strings.Replace(wantDumpIPv4, "-A IPVSP-DSR-HOST -j IPVSP-DSR-REDIRECT\n", "-A IPVSP-DSR-HOST -j IPVSP-DSR-REDIRECT\n"+
			"-A IPVSP-DSR-REDIRECT -d 198.51.100.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.10:80\n"+
			"-A IPVSP-DSR-REDIRECT -d 198.51.100.53/32 -p udp -m udp --dport 53 -j DNAT --to-destination 10.96.0.53:53\n", 1)},
		{"IPv6", RuleConfig{Family: ipset.IPv6, ClusterCIDR: true},
			strings.NewReplacer("--match-set IPVSP-", "--match-set IPVSP-6-",
				"icmp-port-unreachable", "icmp6-port-unreachable").Replace(wantDumpIPv4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := strings.ReplaceAll(tc.want, "IPVSP-6-HC-NODE-PORT", "IPVSP-HC-NODE-PORT") // one set for both families
			if diff := cmp.Diff(want, Dump(Rules(tc.cfg))); diff != "" {
				t.Errorf("rule dump (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRulesUseOnlyOwnNames: every chain and set the rules name is ours.
func TestRulesUseOnlyOwnNames(t *testing.T) {
	for _, fam := range []ipset.Family{ipset.IPv4, ipset.IPv6} {
		for _, tab := range Rules(RuleConfig{Family: fam, ClusterCIDR: true}) {
			for _, r := range tab.Rules {
				f := strings.Fields(r)
				if !Owned(tab.Name, f[1]) {
					t.Errorf("rule in a foreign chain: %s", r)
				}
				for i, w := range f {
					if (w == "--match-set" || w == "-j") && i+1 < len(f) && strings.Contains(f[i+1], "-") && !strings.HasPrefix(f[i+1], "IPVSP-") {
						t.Errorf("rule names a foreign object: %s", r)
					}
				}
			}
		}
	}
}
