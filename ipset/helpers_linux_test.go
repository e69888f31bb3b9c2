package ipset

import (
	"testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// newKernel runs the rest of the test in a fresh network namespace and
// opens a Kernel there. It skips without root or without ip_set, unless
// the kernel must have every feature (the test VM).
func newKernel(t *testing.T, opts ...Option) *Kernel {
	t.Helper()
	nltest.InFreshNetns(t)
	k, err := NewKernel(opts...)
	nltest.Require(t, "ip_set", err)
	t.Cleanup(k.Close)
	return k
}
