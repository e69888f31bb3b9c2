//go:build faultinject

package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy/faults"
	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// faultFlags are the test build's fault injection flags.
type faultFlags struct {
	rate float64
	seed uint64
}

func addKernelHookFlags(fs *pflag.FlagSet) kernelHookFactory {
	f := &faultFlags{}
	fs.Float64Var(&f.rate, "inject-write-failures", 0, "TEST BUILD ONLY: fail this fraction (0 to 1) of the IPVS, address and ipset writes, chosen at random (reads pass).")
	fs.Uint64Var(&f.seed, "inject-seed", 1, "TEST BUILD ONLY: seed of --inject-write-failures' random choice.")
	return f
}

func (f *faultFlags) hook(log *zap.Logger, reg prometheus.Registerer) (kernelHook, error) {
	in, err := faults.New(f.rate, f.seed)
	if err != nil {
		return nil, err
	}
	if err := in.Register(reg); err != nil {
		return nil, err
	}
	log.Warn("test build: injecting kernel write failures", zap.Float64("rate", f.rate), zap.Uint64("seed", f.seed))
	return faultHook{in}, nil
}

// faultHook wraps the handles with the injector.
type faultHook struct{ in *faults.Injector }

func (h faultHook) IPVS(i netlinkutil.IPVS) netlinkutil.IPVS    { return h.in.WrapIPVS(i) }
func (h faultHook) Links(l netlinkutil.Links) netlinkutil.Links { return h.in.WrapLinks(l) }
func (h faultHook) Sets(s ipset.Interface) ipset.Interface      { return h.in.WrapSets(s) }
