package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// kubeProxyInterface is the dummy interface of kube-proxy's IPVS mode.
const kubeProxyInterface = "kube-ipvs0"

type cleanupOptions struct {
	Interface     string
	NodePortRange string
	ExcludeCIDRs  []string
	KubeProxy     bool
}

func newCleanupCommand() *cobra.Command {
	o := cleanupOptions{Interface: "ipvs-proxy0", NodePortRange: "30000-32767"}
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything ipvs-proxy put in the kernel, and nothing else",
		Long: `Remove what ipvs-proxy owns: its iptables chains (IPVSP-*) and the jumps to
them, on both backends and both families; its ipsets (IPVSP-*); its IPVS
virtual servers (on the addresses of its interface, or on a node address with
a port in the node-port range); and its dummy interface with the VIPs.
Everything else stays. Running it twice is fine. Stop the agent first.

With --kube-proxy it also removes what kube-proxy's IPVS mode leaves behind
when migrating: kube-ipvs0 and its virtual servers, kube-proxy's KUBE-*
chains and ipsets (not kubelet's chains).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cleanup(cmd.Context(), &o, cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Interface, "interface", o.Interface, "ipvs-proxy's dummy interface (as given to run).")
	fs.StringVar(&o.NodePortRange, "service-node-port-range", o.NodePortRange, "The node-port range (as given to run): node-port virtual servers in it are removed.")
	fs.StringSliceVar(&o.ExcludeCIDRs, "exclude-cidrs", o.ExcludeCIDRs, "CIDRs whose virtual servers are never touched (as given to run).")
	fs.BoolVar(&o.KubeProxy, "kube-proxy", o.KubeProxy, "Also remove kube-proxy's IPVS-mode leftovers (kube-ipvs0, KUBE-* chains and sets).")
	return cmd
}

// cleanup removes, in this order: the iptables rules (so that no rule uses
// a set), the ipsets, the virtual servers, and the interfaces (which takes
// their VIPs along). It goes on after a failure and reports every one.
func cleanup(ctx context.Context, o *cleanupOptions, out io.Writer) error {
	if o.Interface == "" || len(o.Interface) > 15 {
		return fmt.Errorf("--interface: %q is not a valid interface name", o.Interface)
	}
	portRange, err := parsePortRange(o.NodePortRange)
	if err != nil {
		return err
	}
	exclude, err := parsePrefixes("exclude-cidrs", o.ExcludeCIDRs)
	if err != nil {
		return err
	}
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	var errs []error

	chains := glue.ChainOwner(glue.Owned)
	sets := ipset.Owner(ipset.Owned)
	if o.KubeProxy {
		chains = func(table, chain string) bool { return glue.Owned(table, chain) || glue.KubeProxyChain(table, chain) }
		sets = func(name string) bool { return ipset.Owned(name) || glue.KubeProxySet(name) }
	}

	errs = append(errs, cleanupNetfilter(ctx, chains, sets, say)...)

	links, err := netlinkutil.NewLinks()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	ifaces := []string{o.Interface}
	if o.KubeProxy {
		ifaces = append(ifaces, kubeProxyInterface)
	}
	if ipvs, err := netlinkutil.NewIPVS(); err != nil {
		say("ipvs: skipped (%v)", err)
	} else {
		for _, iface := range ifaces {
			own := model.Ownership{Interface: iface, NodePortRange: portRange, ExcludeCIDRs: exclude}
			n, err := cleanupVirtualServers(ipvs, links, own)
			if err != nil {
				errs = append(errs, err)
			}
			what := "virtual servers"
			if n == 1 {
				what = "virtual server"
			}
			say("ipvs: deleted %d %s owned by %s", n, what, iface)
		}
		ipvs.Close()
	}
	for _, iface := range ifaces {
		addrs, err := links.ListAddresses(iface)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if addrs == nil {
			say("interface %s: not present", iface)
			continue
		}
		if err := links.DeleteLink(iface); err != nil {
			errs = append(errs, err)
			continue
		}
		say("interface %s: deleted with %d addresses", iface, len(addrs))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete: %w", err)
	}
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
	k, _, _, err := proxier.ReadKernel(ipvs, links, own, func(model.VSKey) bool { return false })
	if err != nil {
		return 0, err
	}
	keys := slices.SortedFunc(maps.Keys(k.VirtualServers), model.VSKey.Compare)
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
