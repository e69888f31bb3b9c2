//go:build !faultinject

package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// releaseHooks is the released binary's: no flag, the kernel as it is.
type releaseHooks struct{}

func addKernelHookFlags(*pflag.FlagSet) kernelHookFactory { return releaseHooks{} }

func (releaseHooks) hook(*zap.Logger, prometheus.Registerer) (kernelHook, error) {
	return noKernelHook{}, nil
}
