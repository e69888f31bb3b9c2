// Command ipvs-proxy replaces kube-proxy: it programs the kernel's IPVS from
// Kubernetes Services and EndpointSlices.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

// version and revision are set at build time with -ldflags
// "-X main.version=... -X main.revision=..." (make build sets both); an
// unset revision is the one Go stamped the build with, if any.
var (
	version  = "dev"
	revision = ""
)

func main() { os.Exit(execute()) }

// execute runs the command line and returns the exit code; its deferred
// calls run before main exits.
func execute() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ipvs-proxy:", err)
		return 1
	}
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "ipvs-proxy",
		Short:         "A kube-proxy replacement that programs IPVS over netlink",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(fmt.Sprintf("ipvs-proxy %s (revision %s, %s)\n", version, buildRevision(debug.ReadBuildInfo), runtime.Version()))
	root.AddCommand(newRunCommand(), newPreflightCommand(), newStatusCommand(), newCleanupCommand(), newConfigCommand(), newVersionCommand())
	return root
}

// buildRevision is revision, or else the VCS revision Go stamped the build
// with ("-dirty" when the tree had changes), or else "unknown".
func buildRevision(readBuildInfo func() (*debug.BuildInfo, bool)) string {
	if revision != "" {
		return revision
	}
	info, ok := readBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		return "unknown"
	case dirty:
		return rev + "-dirty"
	}
	return rev
}

// userAgent names this build to the apiserver.
func userAgent() string { return "ipvs-proxy/" + version }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version (--version prints its revision and Go release too)",
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version) },
	}
}
