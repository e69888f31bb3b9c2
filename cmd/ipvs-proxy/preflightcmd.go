package main

import (
	"github.com/spf13/cobra"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/preflight"
)

func newPreflightCommand() *cobra.Command {
	var of *config.Flags
	var output string
	var all, load bool
	cmd := &cobra.Command{
		Use:   "preflight",
		Short: "Check that this node has what ipvs-proxy needs (exit status 1 if not)",
		Long: `Check that this node has what ipvs-proxy needs: the IPVS core, the modules of
the schedulers in use (the default and those named by Services' annotations,
when the API is reachable; every one with --all-schedulers), nf_conntrack, the
ipset types and the dummy interface type (by trying them in a temporary network
namespace), an iptables backend, the sysctls run sets, and the capabilities.
It prints a table (or JSON) with a remedy per failure, and exits with status 1
when a requirement is missing. With --load-modules it loads missing modules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, cfg, warn, err := of.ResolveReport(output)
			if err != nil {
				return err
			}
			log, err := config.NewLogger(o.LogLevel, o.LogFormat)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			// Once, before any client: klog's logger is klog's process global.
			config.BridgeKlog(log)
			sys, err := preflight.NewSystem(func() (kube.Client, error) {
				return agent.NewClientIfConfigured(o.Kubeconfig, userAgent())
			}, log)
			if err != nil {
				return err
			}
			pc := preflight.Config{Scheduler: cfg.Scheduler.Name, IPv4: cfg.IPv4, IPv6: cfg.IPv6, StrictARP: o.StrictARP,
				IPTablesBackend: o.IPTablesBackend, AllSchedulers: all, LoadModules: load, ConfigWarning: warn,
				DirectServerReturn: o.DirectServerReturn, SloppyTCP: o.SloppyTCP}
			rep := preflight.Run(cmd.Context(), sys, pc, log)
			if err := preflight.Write(cmd.OutOrStdout(), rep, output); err != nil {
				return err
			}
			return rep.Err()
		},
	}
	of = config.NewFlags(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "table", "Output format: table or json.")
	cmd.Flags().BoolVar(&all, "all-schedulers", false, "Check the module of every IPVS scheduler, not only those in use.")
	cmd.Flags().BoolVar(&load, "load-modules", false, "Load missing modules with modprobe (needs CAP_SYS_MODULE).")
	return cmd
}
