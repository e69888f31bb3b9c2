package glue

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

var (
	tcp  = ktypes.TCP
	udp  = ktypes.UDP
	addr = netip.MustParseAddr
	pfx  = netip.MustParsePrefix
)

func vs(kind model.AddressKind, a string, proto ktypes.Protocol, port uint16, rss ...string) model.VSPlan {
	p := model.VSPlan{VirtualServer: ktypes.VirtualServer{
		VSKey: ktypes.VSKey{Address: addr(a), Protocol: proto, Port: port}, Scheduler: "rr"}, Kind: kind}
	p.RealServers = ktypestest.RSs(rss...)
	return p
}

// render turns entries into "SET: e1 e2" lines, sorted, for comparison.
func (h held) render() []string {
	by := map[setID][]ipset.Entry{}
	for _, se := range h {
		by[se.set.id()] = append(by[se.set.id()], se.k.Entry())
	}
	var out []string
	for id, es := range by {
		s := slices.SortedFunc(slices.Values(es), ipset.Entry.Compare)
		line := id.name() + ":"
		for _, en := range s {
			line += " " + en.String()
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

func TestServiceEntries(t *testing.T) {
	lb := vs(model.KindLoadBalancer, "10.251.0.11", tcp, 80, "10.100.1.2:8080")
	lb.SourceRanges = []netip.Prefix{pfx("10.250.0.0/24"), pfx("192.0.2.0/24"), pfx("fd00::/8")}
	ext := vs(model.KindExternalIP, "10.251.0.10", tcp, 80, "10.100.1.2:8080")
	ext.Local = true
	np := vs(model.KindNodePort, "10.0.2.15", tcp, 30080, "10.100.1.2:8080")
	cip6 := vs(model.KindClusterIP, "fd00:96::a", udp, 53, "[fd00:101::2]:5353")
	cip6.Local = true // internalTrafficPolicy Local: clusterIPs are masqueraded the same
	plan := &model.ServicePlan{
		Service: types.NamespacedName{Namespace: "ns", Name: "web"},
		VirtualServers: []model.VSPlan{
			vs(model.KindClusterIP, "10.96.0.10", tcp, 80, "10.100.1.2:8080", "10.100.2.2:8080"),
			np, ext, lb, cip6,
		},
		HealthCheckNodePort: 31000,
		// 10.100.2.2 is on another node: it is never balanced to itself
		// here, so it has no hairpin entry (kube-proxy's KUBE-LOOP-BACK
		// holds this node's endpoints only, too).
		NodeEndpoints: []netip.Addr{addr("10.100.1.2"), addr("fd00:101::2")},
	}
	entries := serviceEntries(plan, []netip.Addr{addr("10.0.2.15")})
	if bound := model.SetEntriesBound(plan); len(entries) > bound {
		t.Errorf("%d entries, more than model.SetEntriesBound's %d (the limit would not hold)", len(entries), bound)
	}
	got := entries.render()
	want := []string{
		"IPVSP-6-CLUSTER-IP: fd00:96::a,udp:53",
		"IPVSP-6-HAIRPIN: fd00:101::2,udp:5353,fd00:101::2",
		"IPVSP-6-SERVICE: fd00:96::a,udp:53",
		"IPVSP-6-VIP: fd00:96::a",
		"IPVSP-CLUSTER-IP: 10.96.0.10,tcp:80",
		// The node port and the LoadBalancer IP (Cluster) are masqueraded,
		// the Local externalIP is not.
		"IPVSP-EXTERNAL: 10.0.2.15,tcp:30080 10.251.0.11,tcp:80",
		"IPVSP-HAIRPIN: 10.100.1.2,tcp:8080,10.100.1.2",
		"IPVSP-HC-NODE-PORT: 31000",
		"IPVSP-LB-FW: 10.251.0.11,tcp:80",
		// Ranges of the other family are left out.
		"IPVSP-LB-SRC: 10.251.0.11,tcp:80,10.250.0.0/24 10.251.0.11,tcp:80,192.0.2.0/24",
		"IPVSP-SERVICE: 10.0.2.15,tcp:30080 10.96.0.10,tcp:80 10.251.0.10,tcp:80 10.251.0.11,tcp:80",
		"IPVSP-VIP: 10.96.0.10 10.251.0.10 10.251.0.11",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

// TestServiceEntriesSourceRanges: when the node may reach a firewalled
// LoadBalancer IP, and the corner cases of ranges.
func TestServiceEntriesSourceRanges(t *testing.T) {
	node := []netip.Addr{addr("10.0.2.15")}
	for _, tc := range []struct {
		name   string
		ranges []string
		want   []string
	}{
		{"range holds the node", []string{"10.0.2.0/24"}, []string{
			"IPVSP-LB-FW: 10.251.0.11,tcp:80",
			"IPVSP-LB-SRC-IP: 10.251.0.11,tcp:80,10.251.0.11",
			"IPVSP-LB-SRC: 10.251.0.11,tcp:80,10.0.2.0/24",
		}},
		{"range without the node", []string{"10.250.0.0/24"}, []string{
			"IPVSP-LB-FW: 10.251.0.11,tcp:80",
			"IPVSP-LB-SRC: 10.251.0.11,tcp:80,10.250.0.0/24",
		}},
		{"only ranges of the other family: everyone is dropped", []string{"fd00::/8"}, []string{
			"IPVSP-LB-FW: 10.251.0.11,tcp:80",
		}},
		{"a /0 range: no firewall", []string{"10.250.0.0/24", "0.0.0.0/0"}, nil},
		{"no ranges", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := vs(model.KindLoadBalancer, "10.251.0.11", tcp, 80)
			for _, r := range tc.ranges {
				v.SourceRanges = append(v.SourceRanges, pfx(r))
			}
			var got []string
			for _, l := range serviceEntries(&model.ServicePlan{VirtualServers: []model.VSPlan{v}}, node).render() {
				if set, _, _ := strings.Cut(l, ":"); slices.Contains([]string{"IPVSP-LB-FW", "IPVSP-LB-SRC", "IPVSP-LB-SRC-IP"}, set) {
					got = append(got, l)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("firewall entries (-want +got):\n%s", diff)
			}
		})
	}
}

// TestServiceEntriesNodeAddress: an externalIP or LoadBalancer IP that is
// one of the node's addresses is a Service virtual server (accepted,
// masqueraded) but not in the VIP set: the VIP protection must not refuse
// the node's other ports on it.
func TestServiceEntriesNodeAddress(t *testing.T) {
	ext := vs(model.KindExternalIP, "10.0.2.15", tcp, 80, "10.100.1.2:8080")
	ext.NodeAddress = true
	lb := vs(model.KindLoadBalancer, "10.0.3.15", tcp, 80, "10.100.1.2:8080")
	lb.NodeAddress = true
	plan := &model.ServicePlan{Service: types.NamespacedName{Namespace: "ns", Name: "a"}, VirtualServers: []model.VSPlan{ext, lb},
		NodeEndpoints: []netip.Addr{addr("10.100.1.2")}}
	want := []string{
		"IPVSP-EXTERNAL: 10.0.2.15,tcp:80 10.0.3.15,tcp:80",
		"IPVSP-HAIRPIN: 10.100.1.2,tcp:8080,10.100.1.2",
		"IPVSP-SERVICE: 10.0.2.15,tcp:80 10.0.3.15,tcp:80",
	}
	if diff := cmp.Diff(want, serviceEntries(plan, nil).render()); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}
