// Command ipvs-proxy replaces kube-proxy: it programs the kernel's IPVS from
// Kubernetes Services and EndpointSlices.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(execute()) }

// execute runs the command line and returns the exit code; its deferred
// calls run before main exits.
func execute() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "ipvs-proxy",
		Short:         "A kube-proxy replacement that programs IPVS over netlink",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCommand(), newPreflightCommand(), newStatusCommand(), newCleanupCommand(), newConfigCommand(), newVersionCommand())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ipvs-proxy:", err)
		return 1
	}
	return 0
}

// userAgent names this build to the apiserver.
func userAgent() string { return "ipvs-proxy/" + version }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version) },
	}
}
