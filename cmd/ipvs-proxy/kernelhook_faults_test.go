//go:build faultinject

package main

import (
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// TestFaultBuildFlags: the test build's run command has the flags, wraps
// the handles, registers the injector's metrics and refuses a bad rate.
func TestFaultBuildFlags(t *testing.T) {
	fs := newRunCommand().Flags()
	if fs.Lookup("inject-write-failures") == nil || fs.Lookup("inject-seed") == nil {
		t.Fatal("the faultinject build has no --inject-write-failures or --inject-seed")
	}
	f := &faultFlags{rate: 1, seed: 3}
	reg := prometheus.NewRegistry()
	h, err := f.hook(zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	inner := fake.NewIPVS()
	if err := h.IPVS(inner).DeleteVirtualServer(ktypes.VSKey{Address: netip.MustParseAddr("10.96.0.1"), Protocol: ktypes.TCP, Port: 80}); err == nil {
		t.Error("a write at rate 1 did not fail")
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 2 {
		t.Errorf("registered metrics: %d, %v", len(mfs), err)
	}
	if _, err := (&faultFlags{rate: 2}).hook(zap.NewNop(), prometheus.NewRegistry()); err == nil {
		t.Error("rate 2 accepted")
	}
}
