package agent

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// TestDesiredStateIsWhatTheLoopPrograms: what DesiredState (which
// `ipvs-proxy status` compares the kernel with) wants is exactly what the
// sync loop programs: no operation between it and the kernel after a sync,
// the same Services left out, the same conflict lost by the same Service.
func TestDesiredStateIsWhatTheLoopPrograms(t *testing.T) {
	ipvs, links := fake.NewIPVS(), fake.NewLinks(node)
	cfg := Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.9.0/24")},
		IPv4: true, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute}
	p := New(cfg, nil, ipvs, links, nil, nil, zap.NewNop())

	older := testService("older", "10.96.0.11", "rr")
	older.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	older.Spec.ExternalIPs = []string{"192.0.2.7"}
	newer := testService("newer", "10.96.0.12", "sh")
	newer.CreationTimestamp = metav1.NewTime(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC))
	newer.Spec.ExternalIPs = []string{"192.0.2.7", "10.96.9.9"} // one taken by older, one in --exclude-cidrs
	np := testService("np", "10.96.0.13", "wrr")
	np.Spec.Type = corev1.ServiceTypeNodePort
	np.Spec.Ports[0].NodePort = 30080
	headless := testService("headless", corev1.ClusterIPNone, "")
	services := []corev1.Service{*older, *newer, *np, *headless}
	slicesOf := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	for i, svc := range services {
		s := testSlice(svc.Name, netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}).String())
		slicesOf[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = []*discoveryv1.EndpointSlice{s}
		p.tracker.onService(&services[i], false)
		p.tracker.onSlice(s, false)
	}
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}

	all, err := links.NodeAddresses(testIface)
	if err != nil {
		t.Fatal(err)
	}
	nodeInfo := model.NodeInfo{Name: cfg.NodeName, NodePortAddresses: model.FilterNodePortAddresses(all, cfg.NodePortAddresses)}
	want, conflicts, plans := DesiredState(cfg, cfg.Planner(nil), services, slicesOf, nodeInfo)
	if len(plans) != 3 {
		t.Errorf("%d plans, want 3 (the headless Service is left out)", len(plans))
	}
	kernel, _, _, err := reconciler.ReadKernel(ipvs, links, cfg.Ownership(), func(k ktypes.VSKey) bool { _, ok := want.VirtualServers[k]; return ok })
	if err != nil {
		t.Fatal(err)
	}
	rss, err := ipvs.ListAllRealServers()
	if err != nil {
		t.Fatal(err)
	}
	for k := range kernel.VirtualServers {
		kernel.RealServers[k] = rss[k]
	}
	if ops := model.Diff(want, kernel, model.Scope{All: true}); len(ops) != 0 {
		t.Errorf("DesiredState differs from what the loop programmed: %v\nkernel:\n%v", ops, ipvs.Dump())
	}
	// older's clusterIP and externalIP, newer's clusterIP (its externalIP
	// is older's, its other one in --exclude-cidrs, wanted as any other),
	// np's clusterIP and node port.
	if n := len(want.VirtualServers); n != 6 {
		t.Errorf("%d virtual servers wanted, want 6: %v", n, want.VirtualServers)
	}
	var loop, desired []string
	for _, st := range p.ServiceProblems() {
		for _, c := range st.Conflicts {
			loop = append(loop, st.Service.String()+": "+c.String())
		}
	}
	for _, c := range conflicts {
		desired = append(desired, c.Loser.String()+": "+c.String())
	}
	if diff := cmp.Diff(loop, desired); diff != "" || len(desired) != 1 {
		t.Errorf("conflicts: the loop's (-) and DesiredState's (+):\n%s", diff)
	}
}

// TestOnNodeIPv6: a node whose kernel has no IPv6 turns IPv6 off and tells
// the Services; IPv6 alone there is an error; a node with IPv6, or IPv6
// not asked for, changes nothing.
func TestOnNodeIPv6(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		ipv4, ipv6, has      bool
		err                  error
		wantErr              bool
		wantIPv6, wantNoIPv6 bool
	}{
		{name: "dual, node with IPv6", ipv4: true, ipv6: true, has: true, wantIPv6: true},
		{name: "dual, node without IPv6", ipv4: true, ipv6: true, wantNoIPv6: true},
		{name: "IPv4 alone, node without IPv6", ipv4: true},
		{name: "IPv6 alone, node without IPv6", ipv6: true, wantErr: true, wantIPv6: true},
		{name: "cannot tell", ipv4: true, ipv6: true, err: errors.New("permission denied"), wantErr: true, wantIPv6: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{IPv4: tc.ipv4, IPv6: tc.ipv6}
			err := c.OnNodeIPv6(tc.has, tc.err)
			if (err != nil) != tc.wantErr || c.IPv6 != tc.wantIPv6 || c.NodeWithoutIPv6 != tc.wantNoIPv6 || c.IPv4 != tc.ipv4 {
				t.Errorf("OnNodeIPv6 = %v, IPv6 %v, NodeWithoutIPv6 %v; want error %v, %v, %v", err, c.IPv6, c.NodeWithoutIPv6, tc.wantErr, tc.wantIPv6, tc.wantNoIPv6)
			}
		})
	}
}
