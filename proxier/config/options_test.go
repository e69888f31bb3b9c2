package config

import (
	"strings"
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier"
)

func TestGlueConfigValidation(t *testing.T) {
	cfg := proxier.Config{Interface: "ipvs-proxy0", IPv4: true}
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
