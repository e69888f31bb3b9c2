package main

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kfake "k8s.io/client-go/kubernetes/fake"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestCleanupVirtualServers: cleanup deletes the virtual servers the
// reconciler's ownership rule gives ipvs-proxy, and no other.
func TestCleanupVirtualServers(t *testing.T) {
	ipvs := fake.NewIPVS()
	links := fake.NewLinks(netip.MustParseAddr("10.0.2.15"))
	if err := links.EnsureDummy("ipvs-proxy0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.96.0.10", "10.96.7.7"} {
		if err := links.AddAddress("ipvs-proxy0", netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	key := func(ap string) model.VSKey {
		x := netip.MustParseAddrPort(ap)
		return model.VSKey{Address: x.Addr(), Protocol: model.TCP, Port: x.Port()}
	}
	for _, ap := range []string{
		"10.96.0.10:80",    // on the interface: ours
		"10.96.7.7:53",     // on the interface, excluded: not ours
		"10.0.2.15:30080",  // node address, node-port range: ours
		"10.0.2.15:8080",   // node address, other port: not ours
		"192.0.2.50:30080", // nobody's address: not ours
	} {
		if err := ipvs.AddVirtualServer(model.VirtualServer{VSKey: key(ap), Scheduler: "rr"}); err != nil {
			t.Fatal(err)
		}
	}
	own := model.Ownership{Interface: "ipvs-proxy0", NodePortRange: model.PortRange{Min: 30000, Max: 32767},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.7.0/24")}}
	n, err := cleanupVirtualServers(ipvs, links, own)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2", n, err)
	}
	var left []string
	for _, l := range ipvs.Dump() {
		left = append(left, strings.Fields(l)[0])
	}
	slices.Sort(left)
	if diff := cmp.Diff([]string{"10.0.2.15:8080/TCP", "10.96.7.7:53/TCP", "192.0.2.50:30080/TCP"}, left); diff != "" {
		t.Errorf("virtual servers left (-want +got):\n%s", diff)
	}
	if n, err := cleanupVirtualServers(ipvs, links, own); err != nil || n != 0 {
		t.Errorf("second run deleted %d, %v; want 0", n, err)
	}
}

func TestGlueConfigValidation(t *testing.T) {
	cfg := proxier.Config{Interface: "ipvs-proxy0", IPv4: true}
	o := defaultOptions()
	o.ClusterCIDRs = []string{"10.100.0.0/14", " fd00:100::/24"}
	g, err := o.glueConfig(cfg)
	if err != nil || len(g.ClusterCIDRs) != 2 || !g.IPv4 || g.IPv6 {
		t.Errorf("glueConfig = %+v, %v", g, err)
	}
	o.ClusterCIDRs = []string{"10.100.0.0"}
	if _, err := o.glueConfig(cfg); err == nil || !strings.Contains(err.Error(), "--cluster-cidr") {
		t.Errorf("a bad --cluster-cidr: %v", err)
	}
	o.ClusterCIDRs = nil
	o.IPTablesBackend = "xtables"
	if _, err := o.glueConfig(cfg); err == nil || !strings.Contains(err.Error(), "--iptables-backend") {
		t.Errorf("a bad --iptables-backend: %v", err)
	}
}

// TestGlueConfigDetectLocalMode: each of kube-proxy's detectLocalMode
// values tells the glue how to tell pods' traffic; the interface modes need
// their interface, and an unknown mode is refused.
func TestGlueConfigDetectLocalMode(t *testing.T) {
	cfg := proxier.Config{Interface: "ipvs-proxy0", IPv4: true}
	for _, tc := range []struct {
		mode, bridge, prefix string
		wantCIDRs            int
		wantBridge, wantPfx  string
		wantErr              string
	}{
		{mode: "", wantCIDRs: 1},
		{mode: "ClusterCIDR", wantCIDRs: 1},
		{mode: "NodeCIDR"}, // the Node's podCIDRs, read at start
		{mode: "BridgeInterface", bridge: "cbr0", wantBridge: "cbr0"},
		{mode: "BridgeInterface", wantErr: "--pod-bridge-interface"},
		{mode: "InterfaceNamePrefix", prefix: "veth", wantPfx: "veth"},
		{mode: "InterfaceNamePrefix", wantErr: "--pod-interface-name-prefix"},
		{mode: "Pods", wantErr: "--detect-local-mode"},
	} {
		o := defaultOptions()
		o.ClusterCIDRs = []string{"10.100.0.0/14"}
		o.DetectLocalMode, o.PodBridgeInterface, o.PodInterfaceNamePrefix = tc.mode, tc.bridge, tc.prefix
		g, err := o.glueConfig(cfg)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("mode %q: error %v, want one naming %s", tc.mode, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(g.ClusterCIDRs) != tc.wantCIDRs || g.LocalBridge != tc.wantBridge || g.LocalInterfacePrefix != tc.wantPfx {
			t.Errorf("mode %q: cluster CIDRs %v, bridge %q, prefix %q, %v; want %d CIDRs, %q, %q",
				tc.mode, g.ClusterCIDRs, g.LocalBridge, g.LocalInterfacePrefix, err, tc.wantCIDRs, tc.wantBridge, tc.wantPfx)
		}
	}
}

// TestNodePodCIDRs: --detect-local-mode NodeCIDR reads the Node's
// podCIDRs (both families); a Node without them is waited for, and the
// wait's end is an error naming the mode and the Node.
func TestNodePodCIDRs(t *testing.T) {
	client := kfake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}})
	got, err := nodePodCIDRs(context.Background(), client, "node-1", zap.NewNop())
	want := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("node-1: %v, %v; want %v", got, err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := nodePodCIDRs(ctx, client, "node-2", zap.NewNop()); err == nil || !strings.Contains(err.Error(), "NodeCIDR") || !strings.Contains(err.Error(), "node-2") {
		t.Errorf("node-2 without podCIDRs: %v; want an error naming the mode and the Node", err)
	}
}
