package tunnelend

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of Config.
const (
	// DefaultMarkMask is bits 20-27: clear of Kubernetes' 0x4000 and
	// 0x8000, of Cilium's 0xf00 and of Istio's 0x539; Calico's default
	// iptablesMarkMask (0xffff0000) overlaps it, so set MarkMask there.
	DefaultMarkMask uint32 = 0x0ff00000
	// DefaultTable and DefaultRulePriority name the policy rule and its
	// routing table: the agent owns exactly that table and that rule.
	DefaultTable        = 4300
	DefaultRulePriority = 4300
	// DefaultGrace is IPVS's TCP established timeout: how long another
	// node may still tunnel a connection to an endpoint whose Service
	// stopped tunnelling (DSR.md step 6(c)).
	DefaultGrace = 900 * time.Second
	// DefaultMaxEnds bounds the ends programmed on one node.
	DefaultMaxEnds = 4096
	// DefaultMTU is the MTU of the path between nodes.
	DefaultMTU = 1500
)

// Device is ipip's fallback device, which decapsulates any IPIP packet
// whose outer destination is local (and what fou hands GUE's inner IPIP).
const Device = "tunl0"

// kubernetesMarks are kube-proxy's masquerade bit and kubelet's drop bit
// (the glue uses the same): never part of MarkMask.
const kubernetesMarks uint32 = 0xc000

// Config is the node-wide configuration of tunnel ends.
type Config struct {
	// MarkMask is the packet mark bits reserved for tunnel ends:
	// contiguous, at least 2 bits. Its highest bit says "outer packet to
	// end here" (the policy rule's match); the others number endpoints.
	MarkMask uint32
	// Table is the routing table of the local route; RulePriority the
	// policy rule's priority.
	Table, RulePriority int
	// Grace is how long an end that left its Service is kept while its
	// endpoint is still on the node.
	Grace time.Duration
	// MaxEnds bounds the ends on the node; MTU is the path MTU between
	// nodes, from which the SYN-ACK's MSS is clamped.
	MaxEnds, MTU int
	// Clock tells time for the grace; nil is the real clock.
	Clock clock.PassiveClock
}

func (c Config) withDefaults() Config {
	c.MarkMask = cmp.Or(c.MarkMask, DefaultMarkMask)
	c.Table = cmp.Or(c.Table, DefaultTable)
	c.RulePriority = cmp.Or(c.RulePriority, DefaultRulePriority)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.MaxEnds = cmp.Or(c.MaxEnds, DefaultMaxEnds)
	c.MTU = cmp.Or(c.MTU, DefaultMTU)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	shifted := c.MarkMask >> bits.TrailingZeros32(c.MarkMask)
	if shifted&(shifted+1) != 0 || bits.OnesCount32(c.MarkMask) < 2 {
		errs = append(errs, fmt.Errorf("mark mask %#x: want at least 2 contiguous bits", c.MarkMask))
	}
	if c.MarkMask&kubernetesMarks != 0 {
		errs = append(errs, fmt.Errorf("mark mask %#x overlaps Kubernetes' masquerade and drop bits %#x", c.MarkMask, kubernetesMarks))
	}
	if c.Table < 1 || c.Table >= 1<<31 || (c.Table >= 253 && c.Table <= 255) {
		errs = append(errs, fmt.Errorf("routing table %d: want 1 to 2^31-1, not local (255), main (254) or default (253)", c.Table))
	}
	if c.RulePriority < 1 || c.RulePriority > 32765 {
		errs = append(errs, fmt.Errorf("rule priority %d: want 1 to 32765 (before the main table's rule)", c.RulePriority))
	}
	if c.Grace < 0 || c.MaxEnds < 0 {
		errs = append(errs, errors.New("grace and max ends must not be negative"))
	}
	if c.MTU < 576 || c.MTU > 65535 {
		errs = append(errs, fmt.Errorf("MTU %d: want 576 to 65535", c.MTU))
	}
	return errors.Join(errs...)
}

// marks splits MarkMask into the flag bit and the endpoint number bits.
type marks struct {
	mask, flag, ids uint32
	shift           int
	max             int // the highest endpoint number
}

func newMarks(mask uint32) marks {
	flag := uint32(1) << (31 - bits.LeadingZeros32(mask))
	shift := bits.TrailingZeros32(mask)
	ids := mask &^ flag
	return marks{mask: mask, flag: flag, ids: ids, shift: shift, max: int(ids >> shift)}
}

// outer is the mark of an outer packet to endpoint number id.
func (m marks) outer(id int) uint32 { return m.flag | uint32(id)<<m.shift }

// inner is the mark the decapsulated packet keeps (the flag cleared).
func (m marks) inner(id int) uint32 { return uint32(id) << m.shift }
