// Package faults fails a chosen fraction of the kernel writes of a running
// agent, for reliability tests: it wraps the real IPVS, links and ipset
// handles with the fakes' error injection (fake.WrapIPVS, fake.WrapLinks,
// ipsetfake.Wrap) and decides, with a seeded pseudo-random generator,
// which writes fail. Reads always pass. Only a test build of ipvs-proxy
// links it (cmd/ipvs-proxy, build tag faultinject); the released binary
// has no such option.
package faults

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	ipsetfake "github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
)

// ErrInjected is wrapped by every injected failure.
var ErrInjected = errors.New("injected write failure")

// Kind is a kind of kernel write.
type Kind string

// The kinds of writes that can fail.
const (
	IPVS    Kind = "ipvs"    // virtual and real server adds, updates and deletes
	Address Kind = "address" // addresses bound to and unbound from the dummy interface
	IPSet   Kind = "ipset"   // set creates, destroys, swaps, flushes, and each entry added or deleted
)

// Kinds are every kind, in order.
var Kinds = []Kind{IPVS, Address, IPSet}

// kindOf is the kind of a rendered write (as the fakes render them), and
// whether it may fail at all. The writes of the agent's start-up (IPVS
// timeouts, the dummy interface), whose failure stops the agent, never
// fail; neither does a link's removal (only a takeover from kube-proxy
// makes one).
func kindOf(call string, sets bool) (Kind, bool) {
	verb, _, _ := strings.Cut(call, " ")
	if sets {
		return IPSet, true
	}
	switch verb {
	case "AddVirtualServer", "UpdateVirtualServer", "DeleteVirtualServer", "AddRealServer", "UpdateRealServer", "DeleteRealServer":
		return IPVS, true
	case "AddAddress", "DeleteAddress":
		return Address, true
	}
	return "", false
}

// Count is what the injector saw of one kind of write.
type Count struct {
	Writes int // writes asked about
	Failed int // of them, failed
}

// Injector fails a fraction of writes. It is safe for concurrent use.
type Injector struct {
	rate float64

	mu sync.Mutex
	// rng is a generator per kind: the iptables glue writes its sets
	// while the reconciler writes IPVS, so the kinds' writes interleave
	// differently from run to run, and each kind's draws must not depend
	// on the others'.
	rng    map[Kind]*rand.Rand
	counts map[Kind]*Count

	writes, failed *prometheus.CounterVec
}

// New returns an injector that fails each write with probability rate
// (0 to 1), drawn from a generator per kind seeded with seed: the same
// seed and the same writes of a kind in the same order fail the same
// writes.
func New(rate float64, seed uint64) (*Injector, error) {
	if !(rate >= 0 && rate <= 1) {
		return nil, fmt.Errorf("fault rate %v is not between 0 and 1", rate)
	}
	in := &Injector{
		rate:   rate,
		rng:    map[Kind]*rand.Rand{},
		counts: map[Kind]*Count{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ipvs_proxy_fault_injection_writes_total", Help: "Kernel writes seen by the fault injector (a test build's --inject-write-failures), by kind.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ipvs_proxy_fault_injection_failures_total", Help: "Kernel writes the fault injector failed, by kind.",
		}, []string{"kind"}),
	}
	for i, k := range Kinds {
		in.rng[k] = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15^uint64(i)))
		in.counts[k] = &Count{}
		in.writes.WithLabelValues(string(k))
		in.failed.WithLabelValues(string(k))
	}
	return in, nil
}

// Rate is the fraction of writes that fail.
func (in *Injector) Rate() float64 { return in.rate }

// Register registers the injector's counters with reg.
func (in *Injector) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{in.writes, in.failed} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register fault injection metrics: %w", err)
		}
	}
	return nil
}

// decide counts a write and says whether it fails.
func (in *Injector) decide(call string, sets bool) error {
	kind, ok := kindOf(call, sets)
	if !ok {
		return nil
	}
	in.mu.Lock()
	c := in.counts[kind]
	c.Writes++
	fail := in.rng[kind].Float64() < in.rate
	if fail {
		c.Failed++
	}
	in.mu.Unlock()
	in.writes.WithLabelValues(string(kind)).Inc()
	if !fail {
		return nil
	}
	in.failed.WithLabelValues(string(kind)).Inc()
	return ErrInjected
}

// Errors is the fakes' ErrorFunc of the injector, for IPVS and links.
func (in *Injector) Errors(call fake.Call) error { return in.decide(string(call), false) }

// SetErrors is the ipset fake's ErrorFunc of the injector.
func (in *Injector) SetErrors(call ipsetfake.Call) error { return in.decide(string(call), true) }

// Counts returns the counts by kind.
func (in *Injector) Counts() map[Kind]Count {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[Kind]Count, len(in.counts))
	for k, c := range in.counts {
		out[k] = *c
	}
	return out
}

// String summarises the counts, e.g. "ipvs 12/130 address 3/25 ipset 8/90".
func (in *Injector) String() string {
	counts := in.Counts()
	parts := make([]string, 0, len(Kinds))
	for _, k := range Kinds {
		parts = append(parts, fmt.Sprintf("%s %d/%d", k, counts[k].Failed, counts[k].Writes))
	}
	return strings.Join(parts, " ")
}

// WrapIPVS returns ipvs with the injector's failures on its writes.
func (in *Injector) WrapIPVS(ipvs netlinkutil.IPVS) netlinkutil.IPVS {
	return fake.WrapIPVS(ipvs, in.Errors)
}

// WrapLinks returns links with the injector's failures on its address
// writes.
func (in *Injector) WrapLinks(links netlinkutil.Links) netlinkutil.Links {
	return fake.WrapLinks(links, in.Errors)
}

// WrapSets returns sets with the injector's failures on its writes.
func (in *Injector) WrapSets(sets ipset.Interface) ipset.Interface {
	return ipsetfake.Wrap(sets, in.SetErrors)
}
