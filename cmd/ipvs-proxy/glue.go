package main

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// newGlue builds the iptables glue: the ipsets over netlink and the
// iptables tools of the detected (or chosen) backend for each served
// family; hook wraps the sets. close releases the netlink socket.
func newGlue(o *options, cfg proxier.Config, links netlinkutil.Links, hook kernelHook, log *zap.Logger) (g *glue.Glue, closeSets func(), err error) {
	gcfg, err := o.glueConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	if len(gcfg.ClusterCIDRs) == 0 && !gcfg.MasqueradeAll {
		log.Warn("neither --cluster-cidr nor --masquerade-all: traffic to clusterIPs keeps its source address, " +
			"so clients outside the cluster must be routable from the pods")
	}
	backend, reason, err := glue.DetectBackend(glue.Exec{}, o.IPTablesBackend)
	if err != nil {
		return nil, nil, err
	}
	log.Info("iptables backend", zap.String("backend", string(backend)), zap.String("reason", reason))
	ipt := map[ipset.Family]*glue.IPTables{}
	for fam, on := range map[ipset.Family]bool{ipset.IPv4: cfg.IPv4, ipset.IPv6: cfg.IPv6} {
		t, err := glue.NewIPTables(glue.Exec{}, backend, fam)
		if err != nil {
			if on {
				return nil, nil, err
			}
			continue // rules of a family not served are removed if the tools exist
		}
		ipt[fam] = t
	}
	sets, err := ipset.NewKernel()
	if err != nil {
		return nil, nil, err
	}
	return glue.New(gcfg, hook.Sets(sets), ipt, links, log.Named("glue")), sets.Close, nil
}

// glueSysctls are the kernel settings of --strict-arp: answer ARP only for
// addresses of the receiving interface (not for the VIPs on the dummy), and
// announce the interface's own address as the sender.
var glueSysctls = []struct{ name, value string }{
	{"net/ipv4/conf/all/arp_ignore", "1"},
	{"net/ipv4/conf/all/arp_announce", "2"},
}

// ensureGlueSysctls sets and logs the glue's sysctls.
func ensureGlueSysctls(log *zap.Logger, strictARP bool) error {
	if !strictARP {
		return nil
	}
	s := netlinkutil.Sysctls{Root: sysctlRoot()} // as ensureSysctls
	for _, sc := range glueSysctls {
		old, err := s.Ensure(sc.name, sc.value)
		if err != nil {
			return fmt.Errorf("--strict-arp: %w", err)
		}
		log.Info("set sysctl", zap.String("name", sc.name), zap.String("value", sc.value), zap.String("was", old))
	}
	return nil
}
