package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
)

func TestGlueConfigValidation(t *testing.T) {
	cfg := agent.Config{Interface: "ipvs-proxy0", IPv4: true}
	o := DefaultOptions()
	o.ClusterCIDRs = []string{"10.100.0.0/14", " fd00:100::/24"}
	g, err := o.GlueConfig(cfg)
	if err != nil || len(g.ClusterCIDRs) != 2 || !g.IPv4 || g.IPv6 {
		t.Errorf("glueConfig = %+v, %v", g, err)
	}
	o.ClusterCIDRs = []string{"10.100.0.0"}
	if _, err := o.GlueConfig(cfg); err == nil || !strings.Contains(err.Error(), "--cluster-cidr") {
		t.Errorf("a bad --cluster-cidr: %v", err)
	}
	o.ClusterCIDRs = nil
	o.IPTablesBackend = "xtables"
	if _, err := o.GlueConfig(cfg); err == nil || !strings.Contains(err.Error(), "--iptables-backend") {
		t.Errorf("a bad --iptables-backend: %v", err)
	}
}

// TestGlueConfigDetectLocalMode: each of kube-proxy's detectLocalMode
// values tells the glue how to tell pods' traffic; the interface modes need
// their interface, and an unknown mode is refused.
func TestGlueConfigDetectLocalMode(t *testing.T) {
	cfg := agent.Config{Interface: "ipvs-proxy0", IPv4: true}
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
		o := DefaultOptions()
		o.ClusterCIDRs = []string{"10.100.0.0/14"}
		o.DetectLocalMode, o.PodBridgeInterface, o.PodInterfaceNamePrefix = tc.mode, tc.bridge, tc.prefix
		g, err := o.GlueConfig(cfg)
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

// TestProxierConfigExternalIPCIDRs: externalIPCIDRs reach the proxier's
// configuration as prefixes, in both families; by default there are none
// (every externalIP allowed, as in kube-proxy).
func TestProxierConfigExternalIPCIDRs(t *testing.T) {
	o := DefaultOptions()
	o.HostnameOverride = "node-a"
	cfg, _, err := o.ProxierConfig()
	if err != nil || cfg.ExternalIPCIDRs != nil {
		t.Errorf("default: %v, %v; want none", cfg.ExternalIPCIDRs, err)
	}
	o.ExternalIPCIDRs = []string{"198.51.100.0/24", "2001:db8::/64"}
	cfg, _, err = o.ProxierConfig()
	want := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/64")}
	if err != nil || !slices.Equal(cfg.ExternalIPCIDRs, want) {
		t.Errorf("set: %v, %v; want %v", cfg.ExternalIPCIDRs, err, want)
	}
}
