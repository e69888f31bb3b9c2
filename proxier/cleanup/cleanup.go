// Package cleanup removes what ipvs-proxy put in the kernel, and nothing
// else (`ipvs-proxy cleanup`), and what kube-proxy's IPVS mode left behind:
// on request, or as the last step of a takeover (KubeProxyLeftovers).
package cleanup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/nodelock"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/tunnelend"
)

// Options are what `ipvs-proxy cleanup` removes: as given to run.
type Options struct {
	Interface     string
	NodePortRange string
	ExcludeCIDRs  []string
	KubeProxy     bool
	// LockName is the node's agent lock (nodelock); empty: nodelock.Agent.
	LockName string
	// GUEPorts are the GUE ports run opened for direct server return
	// (--gue-port): fou ports carry no owner, so only these are closed.
	GUEPorts []uint16
}

// Run removes, in this order: the iptables rules (so that no rule uses
// a set), the ipsets, the virtual servers, and the interfaces (which takes
// their VIPs along). It goes on after a failure and reports every one. It
// refuses to start while an agent runs on the node (the agent would put
// everything back, and its syncs would fail meanwhile), and holds the
// agent's lock while it runs, so that no agent starts meanwhile.
func Run(ctx context.Context, o *Options, out io.Writer) error {
	if o.Interface == "" || len(o.Interface) > 15 {
		return fmt.Errorf("--interface: %q is not a valid interface name", o.Interface)
	}
	portRange, err := config.ParsePortRange(o.NodePortRange)
	if err != nil {
		return err
	}
	exclude, err := config.ParsePrefixes("exclude-cidrs", o.ExcludeCIDRs)
	if err != nil {
		return err
	}
	lockName := cmp.Or(o.LockName, nodelock.Agent)
	lock, err := nodelock.Acquire(lockName, nodelock.Who("ipvs-proxy cleanup", os.Getenv, os.Getpid(), time.Now()))
	if err != nil {
		return fmt.Errorf("cleanup refused, nothing removed: %w; stop the agent first (it puts everything back)", err)
	}
	defer func() { _ = lock.Release() }()
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	var errs []error

	chains := glue.ChainOwner(glue.Owned)
	sets := ipset.Owner(ipset.Owned)
	if o.KubeProxy {
		chains = func(table, chain string) bool { return glue.Owned(table, chain) || glue.KubeProxyChain(table, chain) }
		sets = func(name string) bool { return ipset.Owned(name) || glue.KubeProxySet(name) }
	}

	errs = append(errs, cleanupTunnelEnds(ctx, o.GUEPorts, say)...)
	errs = append(errs, cleanupNetfilter(ctx, chains, sets, say)...)

	links, err := netlinkutil.NewLinks()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	ifaces := []string{o.Interface}
	if o.KubeProxy && o.Interface != model.KubeProxyInterface {
		ifaces = append(ifaces, model.KubeProxyInterface)
	}
	ipvs, err := netlinkutil.NewIPVS()
	if err != nil {
		say("ipvs: skipped (%v)", err)
		ipvs = nil
	} else {
		defer ipvs.Close()
	}
	own := func(iface string) model.Ownership {
		return agent.Config{Interface: iface, NodePortRange: portRange, ExcludeCIDRs: exclude}.Ownership()
	}
	errs = append(errs, cleanupInterfaces(ipvs, links, ifaces, own, o.KubeProxy, say)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete: %w", err)
	}
	return nil
}

// cleanupInterfaces removes, for each interface in turn, the virtual
// servers the ownership rule gives it (none with a nil ipvs) and then the
// link, which takes its VIPs along. A link that is not ipvs-proxy's (see
// notOurs) is left alone with its virtual servers, and is an error.
func cleanupInterfaces(ipvs netlinkutil.IPVS, links netlinkutil.Links, ifaces []string, own func(iface string) model.Ownership,
	kubeProxy bool, say func(string, ...any)) []error {
	var errs []error
	for _, iface := range ifaces {
		info, exists, err := links.LinkInfo(iface)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if why := notOurs(iface, info, kubeProxy); exists && why != "" {
			say("interface %s: left alone with its virtual servers: %s", iface, why)
			errs = append(errs, fmt.Errorf("interface %s is not ipvs-proxy's: %s", iface, why))
			continue
		}
		if ipvs != nil {
			n, err := cleanupVirtualServers(ipvs, links, own(iface))
			if err != nil {
				errs = append(errs, err)
			}
			what := "virtual servers"
			if n == 1 {
				what = "virtual server"
			}
			say("ipvs: deleted %d %s owned by %s", n, what, iface)
		}
		if !exists {
			say("interface %s: not present", iface)
			continue
		}
		addrs, err := links.ListAddresses(iface)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := links.DeleteLink(iface); err != nil {
			errs = append(errs, err)
			continue
		}
		say("interface %s: deleted with %d addresses", iface, len(addrs))
	}
	return errs
}

// notOurs says why cleanup must not remove the link name, "" when it may:
// a dummy link that run made or kept carries netlinkutil.OwnerAlias;
// kube-proxy's kube-ipvs0 (a dummy) goes only with --kube-proxy.
func notOurs(name string, info netlinkutil.LinkInfo, kubeProxy bool) string {
	switch {
	case info.Owned():
		return ""
	case name == model.KubeProxyInterface && !kubeProxy:
		return "it is kube-proxy's: removed only with --kube-proxy"
	case name == model.KubeProxyInterface && info.Type == "dummy":
		return ""
	case info.Type != "dummy":
		return fmt.Sprintf("a %s link, not ipvs-proxy's dummy", info.Type)
	default:
		return fmt.Sprintf("a dummy without ipvs-proxy's mark (alias %q): run never used it; remove it by hand (ip link del %s) if it is ipvs-proxy's", netlinkutil.OwnerAlias, name)
	}
}

// cleanupTunnelEnds removes what direct server return's tunnel ends own
// (proxier/tunnelend: IPVSD-* chains and their jumps, the policy rule and
// routing table, the GUE ports named), on the iptables backend the node
// uses; a node where run never ended a tunnel has none of it.
func cleanupTunnelEnds(ctx context.Context, guePorts []uint16, say func(string, ...any)) []error {
	backend, _, err := glue.DetectBackend(glue.Exec{}, "auto")
	if err != nil {
		say("tunnel ends: skipped (%v)", err)
		return nil
	}
	k, err := tunnelend.NodeKernel(backend, sysctls.Root())
	if err != nil {
		say("tunnel ends: skipped (%v)", err)
		return nil
	}
	if err := tunnelend.Cleanup(ctx, tunnelend.Config{}, k, guePorts, zap.NewNop()); err != nil {
		return []error{fmt.Errorf("tunnel ends: %w", err)}
	}
	say("tunnel ends: removed (chains %s*, rule and table %d, GUE ports %v)", tunnelend.ChainPrefix, tunnelend.DefaultTable, guePorts)
	return nil
}

// cleanupNetfilter removes the chains (and the jumps to them) and then the
// ipsets that the owners accept, saying what it removed.
func cleanupNetfilter(ctx context.Context, chains glue.ChainOwner, sets ipset.Owner, say func(string, ...any)) []error {
	var errs []error
	var rep glue.CleanupReport
	if err := glue.CleanupRules(ctx, glue.Exec{}, chains, &rep); err != nil {
		errs = append(errs, err)
	}
	for _, l := range rep.Rules {
		say("%s", l)
	}
	if len(rep.Rules) == 0 {
		say("iptables: nothing to remove")
	}
	k, err := ipset.NewKernel(ipset.WithOwner(sets))
	if err != nil {
		say("ipsets: skipped (%v)", err)
		return errs
	}
	defer k.Close()
	if err := glue.CleanupSets(k, &rep); err != nil {
		errs = append(errs, err)
	}
	if len(rep.Sets) == 0 {
		say("ipsets: nothing to remove")
	} else {
		say("ipsets: destroyed %s", strings.Join(rep.Sets, ", "))
	}
	return errs
}

// cleanupVirtualServers deletes the virtual servers that the Ownership rule
// gives to own's interface: the reconciler's rule, read the same way.
func cleanupVirtualServers(ipvs netlinkutil.IPVS, links netlinkutil.Links, own model.Ownership) (int, error) {
	k, _, _, err := reconciler.ReadKernel(ipvs, links, own, func(ktypes.VSKey) bool { return false })
	if err != nil {
		return 0, err
	}
	keys := slices.SortedFunc(maps.Keys(k.VirtualServers), ktypes.VSKey.Compare)
	var errs []error
	n := 0
	for _, key := range keys {
		if err := ipvs.DeleteVirtualServer(key); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", key, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// KubeProxyLeftovers is the last step of a takeover from kube-proxy's
// IPVS mode, run once the node is fully programmed: the virtual servers on
// kube-ipvs0's addresses were adopted (kept when wanted, deleted when not),
// ipvs-proxy0 holds every wanted address and the glue's rules come first
// in every hook. It removes kube-proxy's chains with the jumps to them,
// then its sets, then kube-ipvs0: ipvs-proxy0 already holds the same
// addresses (bound, or in a Service range routed through it), so no VIP
// is ever without a local route.
func KubeProxyLeftovers(links netlinkutil.Links, log *zap.Logger) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var removed []string
		say := func(format string, args ...any) { removed = append(removed, fmt.Sprintf(format, args...)) }
		errs := cleanupNetfilter(ctx, glue.KubeProxyChain, glue.KubeProxySet, say)
		addrs, err := links.ListAddresses(model.KubeProxyInterface)
		switch {
		case err != nil:
			errs = append(errs, err)
		case addrs != nil:
			if err := links.DeleteLink(model.KubeProxyInterface); err != nil {
				errs = append(errs, err)
			} else {
				say("interface %s: deleted (its %d addresses are on ipvs-proxy's interface or unwanted)", model.KubeProxyInterface, len(addrs))
			}
		}
		log.Info("took over from kube-proxy", zap.Strings("removed", removed), zap.Errors("errors", errs))
		return errors.Join(errs...)
	}
}
