package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/cleanup"
)

func newCleanupCommand() *cobra.Command {
	o := cleanup.Options{Interface: "ipvs-proxy0", NodePortRange: "30000-32767"}
	var ports []uint
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything ipvs-proxy put in the kernel, and nothing else",
		Long: `Remove what ipvs-proxy owns: its iptables chains (IPVSP-*) and the jumps to
them, on both backends and both families; its ipsets (IPVSP-*); its IPVS
virtual servers (on the addresses of its interface, or on a node address with
a port in the node-port range); and its dummy interface with the VIPs
(a dummy that run made or used: it carries the alias ipvs-proxy; a link
of that name without it is left alone, with its virtual servers, and
reported). Everything else stays. Running it twice is fine. It refuses
to start while an agent runs on the node (the agent would put everything
back), and no agent starts while it runs.

With --kube-proxy it also removes what kube-proxy's IPVS mode leaves behind
when migrating: kube-ipvs0 and its virtual servers, kube-proxy's KUBE-*
chains and ipsets (not kubelet's chains).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, p := range ports {
				if p == 0 || p > 65535 {
					return fmt.Errorf("--gue-port: %d is not a port", p)
				}
				o.GUEPorts = append(o.GUEPorts, uint16(p))
			}
			return cleanup.Run(cmd.Context(), &o, cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Interface, "interface", o.Interface, "ipvs-proxy's dummy interface (as given to run).")
	fs.StringVar(&o.NodePortRange, "service-node-port-range", o.NodePortRange, "The node-port range (as given to run): node-port virtual servers in it are removed.")
	fs.StringSliceVar(&o.ExcludeCIDRs, "exclude-cidrs", o.ExcludeCIDRs, "CIDRs whose virtual servers are never touched (as given to run).")
	fs.BoolVar(&o.KubeProxy, "kube-proxy", o.KubeProxy, "Also remove kube-proxy's IPVS-mode leftovers (kube-ipvs0, KUBE-* chains and sets).")
	fs.UintSliceVar(&ports, "gue-port", nil, "The GUE ports run opened for direct server return (--gue-port): closed.")
	return cmd
}
