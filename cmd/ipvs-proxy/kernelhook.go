package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// kernelHook wraps the kernel handles that `run` programs through. The
// released binary's leaves them as they are (kernelhook_release.go); a test
// build (build tag faultinject, kernelhook_faults.go) can make a fraction
// of their writes fail.
type kernelHook interface {
	IPVS(netlinkutil.IPVS) netlinkutil.IPVS
	Links(netlinkutil.Links) netlinkutil.Links
	Sets(ipset.Interface) ipset.Interface
}

// noKernelHook leaves the handles as they are.
type noKernelHook struct{}

func (noKernelHook) IPVS(i netlinkutil.IPVS) netlinkutil.IPVS    { return i }
func (noKernelHook) Links(l netlinkutil.Links) netlinkutil.Links { return l }
func (noKernelHook) Sets(s ipset.Interface) ipset.Interface      { return s }

// kernelHookFactory makes the hook of a run once its flags are parsed.
type kernelHookFactory interface {
	hook(log *zap.Logger, reg prometheus.Registerer) (kernelHook, error)
}
