package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// newGlue builds the iptables glue: the ipsets over netlink and the
// iptables tools of the detected (or chosen) backend for each served
// family; hook wraps the sets. close releases the netlink socket.
func newGlue(ctx context.Context, o *options, cfg proxier.Config, client kubernetes.Interface, links netlinkutil.Links, hook kernelHook, log *zap.Logger) (g *glue.Glue, closeSets func(), err error) {
	gcfg, err := o.glueConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	if o.DetectLocalMode == detectNodeCIDR {
		if gcfg.ClusterCIDRs, err = nodePodCIDRs(ctx, client, cfg.NodeName, log); err != nil {
			return nil, nil, err
		}
	}
	if len(gcfg.ClusterCIDRs) == 0 && gcfg.LocalBridge == "" && gcfg.LocalInterfacePrefix == "" {
		log.Warn("nothing tells in-cluster traffic (no --cluster-cidr, no other --detect-local-mode): "+
			"traffic to clusterIPs from outside the cluster keeps its source address unless --masquerade-all, so such clients "+
			"must be routable from the pods; pods reaching the LoadBalancer IP, externalIP or node port of an "+
			"externalTrafficPolicy Local Service on a node without a local endpoint are dropped as if from outside "+
			"(only the node's own connections count as in-cluster)", zap.Bool("masqueradeAll", gcfg.MasqueradeAll))
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

// nodePodCIDRs reads the node's podCIDRs (--detect-local-mode NodeCIDR),
// waiting for them as kube-proxy does: the node controller may not have
// allocated them yet. A change later needs a restart, as in kube-proxy.
func nodePodCIDRs(ctx context.Context, client kubernetes.Interface, node string, log *zap.Logger) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			log.Info("waiting for the Node's podCIDRs (--detect-local-mode NodeCIDR)", zap.Error(err))
			return false, nil
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		if len(cidrs) == 0 {
			log.Info("waiting for the Node's podCIDRs (--detect-local-mode NodeCIDR)")
			return false, nil
		}
		if out, err = parsePrefixes("detect-local-mode NodeCIDR: Node "+node+" spec.podCIDRs", cidrs); err != nil {
			return false, err
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("--detect-local-mode NodeCIDR: read the podCIDRs of Node %s: %w", node, err)
	}
	log.Info("pods' traffic told by the Node's podCIDRs", zap.Stringers("podCIDRs", out))
	return out, nil
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
