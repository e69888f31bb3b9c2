package agent

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// DefaultTunnelSettle is how long a virtual server newly asked to tunnel
// to a real server stays NAT first (Config.TunnelSettle).
const DefaultTunnelSettle = 5 * time.Second

// tunnelSettle holds back a tunnel to a real server on another node until
// that node has had time to end it. Every node reads the same Service and
// EndpointSlices, and the endpoint's node sets up the tunnel's end when it
// does (proxier/tunnelend); but the nodes' syncs do not run in step, and a
// packet tunnelled to a pod before its node ends tunnels to it is answered
// with an ICMP error, which IPVS relays to the client as a refusal. So a
// virtual server whose plan asks for a new tunnel is written as NAT and
// gets its tunnels once the plan has asked for them for wait: the
// connections made meanwhile keep NAT. The tunnels of the first build
// after the agent starts are taken as settled: the other nodes' ends
// outlive an agent restart (a Service made while the agent was down is
// taken as settled too).
type tunnelSettle struct {
	wait time.Duration
	// since is, per Service, when its plan first asked for each tunnel.
	since map[types.NamespacedName]map[settleKey]time.Time
	// due is, per Service still settling, when its next tunnel settles.
	due map[types.NamespacedName]time.Time
	// started: plans built before it take every tunnel as settled.
	started bool
}

// settleKey is one tunnel: a real server of a virtual server, by method.
type settleKey struct {
	vs      ktypes.VSKey
	rs      ktypes.RSKey
	forward ktypes.Forward
	tunPort uint16
}

func newTunnelSettle(wait time.Duration) *tunnelSettle {
	if wait <= 0 {
		wait = DefaultTunnelSettle
	}
	return &tunnelSettle{wait: wait, since: map[types.NamespacedName]map[settleKey]time.Time{}, due: map[types.NamespacedName]time.Time{}}
}

// start marks the end of the first build: tunnels asked for after it settle.
func (s *tunnelSettle) start() { s.started = true }

// apply returns the plan for IPVS and the glue at now: plan itself when
// none of its tunnels is settling, else a copy in which each virtual
// server with a settling tunnel is NAT as a whole (its real servers, and
// for the glue its masquerade and no in-cluster redirect: a real server
// by NAT behind a tunnelled virtual server would not be masqueraded). The
// tunnel ends take plan as built (consumer.AsBuilt).
func (s *tunnelSettle) apply(n types.NamespacedName, plan *model.ServicePlan, now time.Time) *model.ServicePlan {
	delete(s.due, n)
	if plan == nil {
		delete(s.since, n)
		return nil
	}
	was, seen := s.since[n], map[settleKey]time.Time{}
	var out *model.ServicePlan
	for i, vs := range plan.VirtualServers {
		if vs.Forward == ktypes.ForwardNAT {
			continue
		}
		settling := false
		for _, rs := range vs.RealServers {
			if rs.Forward == ktypes.ForwardNAT {
				continue
			}
			k := settleKey{vs: vs.VSKey, rs: rs.RSKey, forward: rs.Forward, tunPort: rs.TunPort}
			at, ok := was[k]
			if !ok {
				at = now
				if !s.started {
					at = now.Add(-s.wait)
				}
			}
			seen[k] = at
			if ready := at.Add(s.wait); now.Before(ready) {
				settling = true
				if d, ok := s.due[n]; !ok || ready.Before(d) {
					s.due[n] = ready
				}
			}
		}
		if settling {
			out = natCopy(out, plan, i)
		}
	}
	if len(seen) == 0 {
		delete(s.since, n)
	} else {
		s.since[n] = seen
	}
	if out == nil {
		return plan
	}
	return out
}

// natCopy makes virtual server i NAT in a copy of plan (out, when already
// a copy), leaving plan as it is.
func natCopy(out, plan *model.ServicePlan, i int) *model.ServicePlan {
	if out == nil {
		c := *plan
		c.VirtualServers = slices.Clone(plan.VirtualServers)
		out = &c
	}
	vs := &out.VirtualServers[i]
	vs.Forward, vs.TunPort, vs.InClusterTo = ktypes.ForwardNAT, 0, netip.AddrPort{}
	vs.RealServers = slices.Clone(vs.RealServers)
	for j := range vs.RealServers {
		vs.RealServers[j].Forward, vs.RealServers[j].TunPort = ktypes.ForwardNAT, 0
	}
	return out
}

// next is when the earliest settling tunnel settles (zero: none settles).
func (s *tunnelSettle) next() time.Time {
	var t time.Time
	for _, d := range s.due {
		if t.IsZero() || d.Before(t) {
			t = d
		}
	}
	return t
}

// settled lists the Services with a tunnel settled by now, to plan again.
func (s *tunnelSettle) settled(now time.Time) []types.NamespacedName {
	var out []types.NamespacedName
	for n, d := range s.due {
		if !now.Before(d) {
			out = append(out, n)
		}
	}
	return out
}
