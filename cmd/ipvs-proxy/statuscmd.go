package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/ctwatch"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/opsserver"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/status"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
)

func newStatusCommand() *cobra.Command {
	var of *config.Flags
	var output string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the virtual servers ipvs-proxy owns, by Service, and any drift from what the Services want",
		Long: `Show what the kernel holds for ipvs-proxy: every virtual server it owns (by
the same rule as run), with its Service (namespace/name:port), kind, scheduler
and real servers (weights, active and inactive connections), and the drift
between what the Services want (computed as run computes it, from the API) and
the kernel. Without API access it shows the kernel's view with no names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, cfg, _, err := of.ResolveReport(output)
			if err != nil {
				return err
			}
			if err := cfg.OnNodeIPv6(sysctls.HasIPv6(sysctls.Root())); err != nil { // as run does
				return err
			}
			ipvs, err := netlinkutil.NewIPVS()
			if err != nil {
				return fmt.Errorf("read the kernel: %w", err)
			}
			defer ipvs.Close()
			links, err := netlinkutil.NewLinks()
			if err != nil {
				return fmt.Errorf("read the kernel: %w", err)
			}
			client, apiErr := agent.NewClientIfConfigured(o.Kubeconfig, userAgent())
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if apiErr == nil { // as run wants it (externalIPs on the apiserver's address)
				cfg.APIServer = agent.APIServerAddresses(ctx, o.Kubeconfig, zap.NewNop())
			}
			rep, err := status.Collect(ctx, cfg, ipvs, links, client, apiErr, status.SchedulerMissing())
			if err != nil {
				return err
			}
			rep.Agent = opsserver.ReadAgentStatus(cmd.Context(), o.DebugBindAddress)
			rep.Conntrack = status.ReadConntrack(ctwatch.NewProcReader(sysctls.Root()))
			return status.Write(cmd.OutOrStdout(), rep, output)
		},
	}
	of = config.NewFlags(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "table", "Output format: table or json.")
	cmd.Flags().DurationVar(&timeout, "api-timeout", 30*time.Second, "Time allowed for reading Services and EndpointSlices from the API.")
	return cmd
}
