package glue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
)

// kubeProxyChains are the chains kube-proxy's IPVS (and iptables) mode
// creates, by table. Kubelet's chains (filter KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-MARK-DROP) are not among them.
var kubeProxyChains = map[string][]string{
	"nat": {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ",
		"KUBE-FIREWALL", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY"},
	"filter": {"KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL",
		"KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER", "KUBE-EXTERNAL-SERVICES", "KUBE-SERVICES", "KUBE-NODEPORTS",
		"KUBE-PROXY-CANARY"},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// kubeProxyChainPrefixes are the per-Service chains of kube-proxy's
// iptables mode (in nat).
var kubeProxyChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-", "KUBE-XLB-"}

// KubeProxyChain reports whether a chain of a table is kube-proxy's.
func KubeProxyChain(table, chain string) bool {
	if slices.Contains(kubeProxyChains[table], chain) {
		return true
	}
	if table != "nat" {
		return false
	}
	for _, p := range kubeProxyChainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// kubeProxySets are the sets of kube-proxy's IPVS mode (IPv6 ones are
// named KUBE-6-*, cut to ipset's 31 characters).
var kubeProxySets = []string{"LOOP-BACK", "CLUSTER-IP", "EXTERNAL-IP", "EXTERNAL-IP-LOCAL", "LOAD-BALANCER",
	"LOAD-BALANCER-LOCAL", "LOAD-BALANCER-FW", "LOAD-BALANCER-SOURCE-IP", "LOAD-BALANCER-SOURCE-CIDR",
	"NODE-PORT-TCP", "NODE-PORT-LOCAL-TCP", "NODE-PORT-UDP", "NODE-PORT-LOCAL-UDP", "NODE-PORT-SCTP-HASH",
	"NODE-PORT-LOCAL-SCTP-HASH", "HEALTH-CHECK-NODE-PORT", "IPVS-IPS"}

// KubeProxySet reports whether a set is kube-proxy's.
func KubeProxySet(name string) bool {
	for _, s := range kubeProxySets {
		if v6 := "KUBE-6-" + s; name == "KUBE-"+s || name == v6[:min(len(v6), kubeProxySetNameMax)] {
			return true
		}
	}
	return false
}

// kubeProxySetNameMax is the length to which kube-proxy cuts set names.
const kubeProxySetNameMax = 31

// CleanupReport lists what a cleanup removed.
type CleanupReport struct {
	// Rules has one line per iptables tool that had something removed.
	Rules []string
	// Sets are the destroyed sets.
	Sets []string
}

// CleanupRules removes the owned chains, and the jumps to them, from every
// table of both families on both backends (whichever tools exist): one
// iptables-restore per tool. Missing tools are skipped.
func CleanupRules(ctx context.Context, r Runner, owns ChainOwner, rep *CleanupReport) error {
	var errs []error
	for _, b := range []Backend{NFT, Legacy} {
		for _, fam := range []ipset.Family{ipset.IPv4, ipset.IPv6} {
			ipt, err := NewIPTables(r, b, fam)
			if err != nil {
				continue // no such tools on this node
			}
			saved, err := ipt.Save(ctx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			input := RestoreInput(nil, saved, owns)
			if input == "" {
				continue
			}
			if err := ipt.Restore(ctx, input); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.Rules = append(rep.Rules, fmt.Sprintf("%s: %s", ipt, summarize(input)))
		}
	}
	return errors.Join(errs...)
}

// summarize describes a cleanup's restore input: "removed chains A, B; 3
// jumps".
func summarize(input string) string {
	var chains []string
	jumps := 0
	for _, l := range strings.Split(input, "\n") {
		switch {
		case strings.HasPrefix(l, "-X "):
			chains = append(chains, strings.TrimPrefix(l, "-X "))
		case strings.HasPrefix(l, "-D "):
			jumps++
		}
	}
	return fmt.Sprintf("removed %s (%s) and %s", plural(len(chains), "chain"), strings.Join(chains, ", "), plural(jumps, "jump"))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// CleanupSets destroys every set the Interface owns. Call it after
// CleanupRules: a set still used by a rule cannot be destroyed.
func CleanupSets(sets ipset.Interface, rep *CleanupReport) error {
	names, err := sets.ListNames()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if !sets.Owns(n) {
			continue
		}
		if err := sets.Destroy(n); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Sets = append(rep.Sets, n)
	}
	return errors.Join(errs...)
}
