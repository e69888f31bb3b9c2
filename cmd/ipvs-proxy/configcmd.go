package main

import (
	"github.com/spf13/cobra"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the config file of run",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newConfigConvertCommand())
	return cmd
}

func newConfigConvertCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "convert",
		Short: "Print a flat config file (deprecated) as an IPVSProxyConfiguration",
		Long: `Print the config file given as --config, ipvs-proxy's flat options (no
apiVersion and kind, deprecated), as an IPVSProxyConfiguration: the options
it sets, with the same values, in their groups. Comments are not kept.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := config.ConvertFile(file)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&file, "config", "", "The flat config file to convert.")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
