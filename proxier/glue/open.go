package glue

import (
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// Open builds the glue on the node's kernel: the ipsets over netlink and
// the iptables tools of the detected (or chosen: auto, nft or legacy)
// backend for each served family; wrapSets wraps the sets (a test build's
// fault injection; nil leaves them). closeSets releases the netlink socket.
func Open(cfg Config, backendChoice string, links netlinkutil.Links, wrapSets func(ipset.Interface) ipset.Interface,
	log *zap.Logger) (g *Glue, closeSets func(), err error) {
	if len(cfg.ClusterCIDRs) == 0 && cfg.LocalBridge == "" && cfg.LocalInterfacePrefix == "" {
		log.Warn("nothing tells in-cluster traffic (no --cluster-cidr, no other --detect-local-mode): "+
			"traffic to clusterIPs from outside the cluster keeps its source address unless --masquerade-all, so such clients "+
			"must be routable from the pods; pods reaching the LoadBalancer IP, externalIP or node port of an "+
			"externalTrafficPolicy Local Service on a node without a local endpoint are dropped as if from outside "+
			"(only the node's own connections count as in-cluster)", zap.Bool("masqueradeAll", cfg.MasqueradeAll))
	}
	backend, reason, err := DetectBackend(Exec{}, backendChoice)
	if err != nil {
		return nil, nil, err
	}
	log.Info("iptables backend", zap.String("backend", string(backend)), zap.String("reason", reason))
	ipt := map[ipset.Family]*IPTables{}
	for fam, on := range map[ipset.Family]bool{ipset.IPv4: cfg.IPv4, ipset.IPv6: cfg.IPv6} {
		t, err := NewIPTables(Exec{}, backend, fam)
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
	var s ipset.Interface = sets
	if wrapSets != nil {
		s = wrapSets(sets)
	}
	return New(cfg, s, ipt, links, log.Named("glue")), sets.Close, nil
}
