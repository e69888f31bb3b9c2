package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// TestDSRConfig: direct server return is on only with the flag and a way
// to tell pods' IPv4 traffic (it is IPv4 only: a dual-stack node with an
// IPv4 cluster CIDR alone has it); off, the reason names what is missing.
// --sloppy-tcp needs the flag.
func TestDSRConfig(t *testing.T) {
	v4 := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	for _, tc := range []struct {
		name    string
		on      bool
		mode    string
		g       glue.Config
		wantOff string // "" when on
	}{
		{name: "flag off", g: glue.Config{IPv4: true, ClusterCIDRs: v4}, wantOff: "--direct-server-return"},
		{name: "dual-stack node, IPv4 cluster CIDR", on: true, g: glue.Config{IPv4: true, IPv6: true, ClusterCIDRs: v4}},
		{name: "no cluster CIDR", on: true, g: glue.Config{IPv4: true, IPv6: true}, wantOff: "IPv4 --cluster-cidr"},
		{name: "IPv6 cluster CIDR only", on: true, g: glue.Config{IPv4: true, IPv6: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56")}}, wantOff: "IPv4 --cluster-cidr"},
		{name: "pods on a bridge", on: true, g: glue.Config{IPv4: true, LocalBridge: "cni0"}},
		{name: "the Node's podCIDRs", on: true, mode: DetectNodeCIDR, g: glue.Config{IPv4: true}},
		{name: "IPv6 only", on: true, g: glue.Config{IPv6: true}, wantOff: "IPv4 only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.DirectServerReturn = tc.on
			if tc.mode != "" {
				o.DetectLocalMode = tc.mode
			}
			c, err := o.DSRConfig(tc.g)
			if err != nil {
				t.Fatal(err)
			}
			if c.GUEPort != DefaultGUEPort {
				t.Errorf("GUE port %d, want %d", c.GUEPort, DefaultGUEPort)
			}
			if (tc.wantOff == "") != (c.Off == "") || !strings.Contains(c.Off, tc.wantOff) {
				t.Errorf("off %q, want %q", c.Off, tc.wantOff)
			}
		})
	}
	o := DefaultOptions()
	o.SloppyTCP = true
	if _, err := o.DSRConfig(glue.Config{IPv4: true, ClusterCIDRs: v4}); err == nil || !strings.Contains(err.Error(), "--sloppy-tcp needs --direct-server-return") {
		t.Errorf("--sloppy-tcp alone: error %v, want one naming --direct-server-return", err)
	}
	o.DirectServerReturn = true
	if c, err := o.DSRConfig(glue.Config{IPv4: true, ClusterCIDRs: v4}); err != nil || c.Off != "" {
		t.Errorf("--sloppy-tcp with --direct-server-return: %+v %v, want on", c, err)
	}
	o = DefaultOptions()
	o.GUEPort = 70000
	if _, err := o.DSRConfig(glue.Config{IPv4: true}); err == nil {
		t.Error("--gue-port 70000: no error")
	}
}
