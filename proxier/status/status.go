// Package status is `ipvs-proxy status`: the virtual servers ipvs-proxy
// owns on this node, by Service, and the drift between what the Services
// want (built as run builds it) and the kernel.
package status

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/kmod"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/opsserver"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Kinds of drift between what the Services want and what the kernel holds.
const (
	driftMissingVS    = "missing-virtual-server"   // wanted, not in the kernel
	driftUnwantedVS   = "unwanted-virtual-server"  // owned, in the kernel, wanted by no Service
	driftDifferentVS  = "different-virtual-server" // scheduler, flags or persistence differ
	driftMissingRS    = "missing-real-server"
	driftExtraRS      = "extra-real-server"
	driftWeight       = "different-weight"
	driftForward      = "different-forwarding" // method or GUE port (with or without a weight change)
	driftOrder        = "real-server-order"    // sh, dh, mh: out of canonical order (run moves it to the head)
	driftMissingAddr  = "missing-address"      // wanted, not bound to the interface
	driftUnwantedAddr = "unwanted-address"     // bound, wanted by no Service
	driftMissingRoute = "missing-route"        // a Service range wanted, not routed
	driftExtraRoute   = "unwanted-route"       // routed, not wanted
)

// driftKinds names the drift of each kind of operation that a sync would
// make: drift is exactly what model.Diff says run would write.
var driftKinds = map[ktypes.OpKind]string{
	ktypes.OpAddVirtualServer: driftMissingVS, ktypes.OpDeleteVirtualServer: driftUnwantedVS,
	ktypes.OpUpdateVirtualServer: driftDifferentVS, ktypes.OpAddRealServer: driftMissingRS,
	ktypes.OpDeleteRealServer: driftExtraRS, ktypes.OpUpdateRealServer: driftWeight,
	ktypes.OpBind: driftMissingAddr, ktypes.OpUnbind: driftUnwantedAddr,
	ktypes.OpRoute: driftMissingRoute, ktypes.OpUnroute: driftExtraRoute,
}

// statusRealServer is one real server of a virtual server.
type statusRealServer struct {
	Address       string `json:"address"`
	Port          uint16 `json:"port"`
	Weight        int32  `json:"weight"`
	ActiveConns   int32  `json:"activeConns"`
	InactiveConns int32  `json:"inactiveConns"`
	// InKernel is false for a wanted real server the kernel lacks.
	InKernel bool `json:"inKernel"`
	// Forward is the forwarding method when it is not NAT: "tunnel" (IPIP),
	// "gue:PORT".
	Forward string `json:"forward,omitempty"`
	// Drift is "", or missing, extra, weight, forwarding or
	// weight,forwarding; WantWeight is the wanted weight for missing and
	// weight (0 is a draining real server), WantForward the wanted method
	// for forwarding ("nat", "tunnel", "gue:PORT").
	Drift       string `json:"drift,omitempty"`
	WantWeight  *int32 `json:"wantWeight,omitempty"`
	WantForward string `json:"wantForward,omitempty"`

	key ktypes.RSKey
}

func newStatusRS(rs ktypes.RealServer, inKernel bool) statusRealServer {
	s := statusRealServer{Address: rs.Address.String(), Port: rs.Port, Weight: rs.Weight,
		ActiveConns: rs.ActiveConns, InactiveConns: rs.InactiveConns, InKernel: inKernel, key: rs.RSKey}
	if rs.Forward != ktypes.ForwardNAT {
		s.Forward = rs.ForwardString()
	}
	return s
}

// statusVirtualServer is one owned or wanted virtual server.
type statusVirtualServer struct {
	// Service is namespace/name:port ("" when unknown).
	Service     string `json:"service,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	ServicePort string `json:"servicePort,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Address     string `json:"address"`
	Protocol    string `json:"protocol"`
	Port        uint16 `json:"port"`
	// Scheduler, Flags and PersistenceTimeout are the kernel's, or the
	// wanted ones when the kernel lacks the virtual server.
	Scheduler          string             `json:"scheduler"`
	Flags              []string           `json:"flags,omitempty"`
	PersistenceTimeout uint32             `json:"persistenceTimeout,omitempty"`
	InKernel           bool               `json:"inKernel"`
	Wanted             bool               `json:"wanted"`
	RealServers        []statusRealServer `json:"realServers"`
	// Drift lists the kinds of drift of this virtual server.
	Drift []string `json:"drift,omitempty"`

	key ktypes.VSKey
}

// statusDrift is one difference between the wanted and the kernel state:
// one write that run's next full sync would make.
type statusDrift struct {
	Kind          string `json:"kind"`
	VirtualServer string `json:"virtualServer,omitempty"`
	Address       string `json:"address,omitempty"`
	Service       string `json:"service,omitempty"`
	Detail        string `json:"detail"`
}

// statusConflict is a virtual server that two Services want: the older
// one holds it (as run decides).
type statusConflict struct {
	VirtualServer string `json:"virtualServer"`
	Holder        string `json:"holder"`
	Loser         string `json:"loser"`
}

// statusAPI tells whether Kubernetes names could be read.
type statusAPI struct {
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
	Services  int    `json:"services"`
}

// Report is what `ipvs-proxy status` prints.
type Report struct {
	Node      string    `json:"node"`
	Interface string    `json:"interface"`
	API       statusAPI `json:"api"`
	// DriftKnown is false without API access: nothing is known to be wanted.
	DriftKnown     bool                  `json:"driftKnown"`
	VirtualServers []statusVirtualServer `json:"virtualServers"`
	Drift          []statusDrift         `json:"drift"`
	// OtherVirtualServers counts the kernel's virtual servers that
	// ipvs-proxy does not own (and leaves alone).
	OtherVirtualServers int `json:"otherVirtualServers"`
	// Agent is the running agent's per-Service status, from its /statusz.
	Agent opsserver.AgentStatus `json:"agent"`
	// Conntrack is the node's connection tracking table (nil: not read).
	Conntrack *Conntrack       `json:"conntrack,omitempty"`
	Conflicts []statusConflict `json:"conflicts,omitempty"`
	Warnings  []string         `json:"warnings,omitempty"`
}

// SchedulerMissing tells, from the node's modules, whether the kernel
// cannot load a scheduler (nil when modules cannot be read: then none is
// taken as missing).
func SchedulerMissing() func(string) bool {
	mods, err := kmod.NewChecker()
	if err != nil || !mods.ModuleSupport() {
		return nil
	}
	return func(name string) bool {
		m, ok := scheduler.Module(name)
		return ok && mods.Check(m).State == kmod.Missing
	}
}

// desiredState lists the Services and EndpointSlices and builds the
// desired state from them as run does (agent.DesiredState). It returns
// the desired state, the conflicts, a label (namespace/name:port) for each
// wanted virtual server, the number of Services read and warnings.
func desiredState(ctx context.Context, client kube.Client, cfg agent.Config, nodeAddrs []netip.Addr,
	schedulerMissing func(string) bool) (model.Desired, []model.Conflict, map[ktypes.VSKey]string, int, []string, error) {
	services, err := agent.ListServices(ctx, client)
	if err != nil {
		return model.Desired{}, nil, nil, 0, nil, err
	}
	slicesOf, err := agent.ListEndpointSlices(ctx, client)
	if err != nil {
		return model.Desired{}, nil, nil, 0, nil, err
	}
	var warnings []string
	zone, ownAddrs := "", []netip.Addr(nil)
	var others map[netip.Addr]string
	nodes, err := agent.ListNodes(ctx, client)
	if err != nil {
		warnings = append(warnings, fmt.Sprintf("cannot read the Nodes (this one's zone shapes topology-aware routing; the others' addresses are not programmed here): %v", err))
	} else {
		var own *model.Node
		if own, others = agent.NodeFacts(nodes, cfg.NodeName); own != nil {
			zone, ownAddrs = own.Zone, own.Addresses
		}
	}

	node := model.NodeInfo{Name: cfg.NodeName, Zone: zone, NodePortAddresses: model.FilterNodePortAddresses(nodeAddrs, cfg.NodePortAddresses),
		Addresses: nodeAddrs}
	// run falls back to the default scheduler for a Service whose
	// scheduler the kernel cannot load: so does status.
	unavailable := map[string]bool{}
	if schedulerMissing != nil {
		for _, n := range scheduler.Names() {
			if n != cfg.Scheduler.Name && schedulerMissing(n) {
				unavailable[n] = true
			}
		}
	}
	ranges, err := agent.ListServiceRanges(ctx, client, cfg)
	if err != nil {
		// run falls back to binding one address per clusterIP.
		warnings = append(warnings, fmt.Sprintf("cannot read the Service ranges to route (%v): comparing with one address per clusterIP, as run does then", err))
	}
	ranges = agent.SaneRanges(ranges, slices.Concat(nodeAddrs, ownAddrs), others)
	want, conflicts, plans := agent.DesiredState(cfg, cfg.Planner(unavailable).WithRanges(ranges).WithOtherNodes(others), services, slicesOf, node)
	for _, p := range ranges {
		want.Route(p)
	}
	for _, plan := range plans {
		for _, w := range plan.Warnings {
			warnings = append(warnings, plan.Service.String()+": "+w)
		}
	}
	byName := map[types.NamespacedName]*corev1.Service{}
	for i := range services {
		byName[types.NamespacedName{Namespace: services[i].Namespace, Name: services[i].Name}] = &services[i]
	}
	labels := make(map[ktypes.VSKey]string, len(want.VirtualServers))
	for k, w := range want.VirtualServers {
		labels[k] = w.Service.String() + ":" + servicePortLabel(byName[w.Service], w.PortName)
	}
	return want, conflicts, labels, len(plans), warnings, nil
}

// servicePortLabel names a Service port: its name, or its number when the
// Service has a single unnamed port.
func servicePortLabel(svc *corev1.Service, portName string) string {
	if portName != "" {
		return portName
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == "" {
			return strconv.Itoa(int(p.Port))
		}
	}
	return "?"
}

// readOwnedKernel reads, by run's rule (reconciler.ReadKernel), the part of
// the kernel ipvs-proxy owns given what is wanted, with every owned virtual
// server's real servers (one bulk read), and counts the others' virtual
// servers.
func readOwnedKernel(cfg agent.Config, ipvs netlinkutil.IPVS, links netlinkutil.Links, want model.Desired) (*model.Kernel, int, error) {
	own := cfg.Ownership()
	// What ipvs-proxy itself holds: not what a takeover adopts from
	// kube-proxy's interface (as before the rule was written once).
	own.Adopt = ""
	k, others, _, err := reconciler.ReadKernel(ipvs, links, own, func(key ktypes.VSKey) bool {
		_, ok := want.VirtualServers[key]
		return ok
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read the kernel: %w", err)
	}
	// Every virtual server's real servers in one read, as the
	// reconciler's full sync reads them; those the read left out (see
	// netlinkutil.IPVS) are read alone.
	all, err := ipvs.ListAllRealServers()
	if err != nil {
		return nil, 0, fmt.Errorf("read the kernel: %w", err)
	}
	for key := range k.VirtualServers {
		rss, ok := all[key]
		if !ok {
			if rss, err = ipvs.ListRealServers(key); err != nil {
				return nil, 0, fmt.Errorf("read the kernel: %w", err)
			}
		}
		k.RealServers[key] = rss
	}
	return k, others, nil
}

// Collect reads the kernel and, with a client, the Services, and
// joins them; drift is the operations run's next full sync would make
// (model.Diff). apiErr, when set, is why there is no client.
func Collect(ctx context.Context, cfg agent.Config, ipvs netlinkutil.IPVS, links netlinkutil.Links,
	client kube.Client, apiErr error, schedulerMissing func(string) bool) (Report, error) {
	rep := Report{Node: cfg.NodeName, Interface: cfg.Interface, VirtualServers: []statusVirtualServer{}}
	// Node addresses first: node ports are built on them.
	nodeAddrs, err := links.NodeAddresses(netlinkutil.ProxyInterfaces(cfg.Interface)...)
	if err != nil {
		return rep, fmt.Errorf("read the kernel: %w", err)
	}
	want := model.Desired{VirtualServers: map[ktypes.VSKey]model.Want{}, Addresses: map[netip.Addr]bool{}}
	var conflicts []model.Conflict
	var labels map[ktypes.VSKey]string
	if apiErr == nil && client != nil {
		var n int
		want, conflicts, labels, n, rep.Warnings, apiErr = desiredState(ctx, client, cfg, nodeAddrs, schedulerMissing)
		rep.API.Services = n
	} else if apiErr == nil {
		apiErr = agent.ErrNoAPI
	}
	if apiErr != nil {
		want = model.Desired{VirtualServers: map[ktypes.VSKey]model.Want{}, Addresses: map[netip.Addr]bool{}}
		rep.API.Error = apiErr.Error()
	} else {
		rep.API.Available, rep.DriftKnown = true, true
		rep.Drift = []statusDrift{}
	}
	kernel, others, err := readOwnedKernel(cfg, ipvs, links, want)
	if err != nil {
		return rep, err
	}
	rep.OtherVirtualServers = others

	byKey := map[ktypes.VSKey]*statusVirtualServer{}
	for k, vs := range kernel.VirtualServers {
		s := newStatusVS(k, vs)
		s.InKernel = true
		rss := slices.Clone(kernel.RealServers[k])
		slices.SortFunc(rss, func(a, b ktypes.RealServer) int { return a.RSKey.Compare(b.RSKey) })
		for _, rs := range rss {
			s.RealServers = append(s.RealServers, newStatusRS(rs, true))
		}
		byKey[k] = s
	}
	for k, w := range want.VirtualServers {
		s, ok := byKey[k]
		if !ok {
			s = newStatusVS(k, w.VirtualServer)
			byKey[k] = s
		}
		s.Wanted = true
		s.Namespace, s.Name, s.Kind = w.Service.Namespace, w.Service.Name, string(w.Kind)
		s.Service = labels[k]
		s.ServicePort = strings.TrimPrefix(labels[k], w.Service.String()+":")
	}
	if rep.DriftKnown {
		for _, op := range model.Diff(want, kernel, model.Scope{All: true}) {
			rep.addDrift(byKey, op)
		}
		for _, c := range conflicts {
			rep.Conflicts = append(rep.Conflicts, statusConflict{VirtualServer: c.VirtualServer.String(),
				Holder: c.Holder.String(), Loser: c.Loser.String()})
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: %s; run gives it no traffic there", c.Loser, c))
		}
	}
	for _, s := range byKey {
		slices.SortFunc(s.RealServers, func(a, b statusRealServer) int { return a.key.Compare(b.key) })
		s.Drift = slices.Compact(s.Drift)
		rep.VirtualServers = append(rep.VirtualServers, *s)
	}
	slices.SortFunc(rep.VirtualServers, func(a, b statusVirtualServer) int {
		// Named first, by Service; then by address, protocol, port.
		unnamed := func(v statusVirtualServer) int {
			if v.Service == "" {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(unnamed(a), unnamed(b)), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name), a.key.Compare(b.key))
	})
	slices.SortStableFunc(rep.Drift, func(a, b statusDrift) int {
		return cmp.Or(cmp.Compare(a.VirtualServer, b.VirtualServer), cmp.Compare(a.Address, b.Address))
	})
	return rep, nil
}

func newStatusVS(k ktypes.VSKey, vs ktypes.VirtualServer) *statusVirtualServer {
	s := &statusVirtualServer{Address: k.Address.String(), Protocol: k.Protocol.String(), Port: k.Port,
		Scheduler: vs.Scheduler, Flags: flagNames(vs), RealServers: []statusRealServer{}, key: k}
	if vs.Flags&ktypes.FlagPersistent != 0 {
		s.PersistenceTimeout = vs.Timeout
	}
	return s
}

// addressDrift explains the drift of the interface's addresses and routes.
var addressDrift = map[ktypes.OpKind]string{
	ktypes.OpBind:    "wanted, not bound to the interface",
	ktypes.OpUnbind:  "bound to the interface, wanted by no Service (run unbinds it on its next full sync)",
	ktypes.OpRoute:   "a Service range, not routed as local through the interface",
	ktypes.OpUnroute: "routed as local through the interface, not a Service range to route (run deletes the route on its next full sync)",
}

// addDrift records one operation of the diff as drift, on the report and
// on its virtual server and real server rows.
func (r *Report) addDrift(byKey map[ktypes.VSKey]*statusVirtualServer, op ktypes.Op) {
	kind := driftKinds[op.Kind]
	if detail, ok := addressDrift[op.Kind]; ok {
		where := op.Address.String()
		if op.Kind == ktypes.OpRoute || op.Kind == ktypes.OpUnroute {
			where = op.Prefix.String()
		}
		r.Drift = append(r.Drift, statusDrift{Kind: kind, Address: where, Detail: detail})
		return
	}
	k := op.VirtualServer.VSKey
	s := byKey[k]
	rs := op.RealServer
	if op.Move {
		r.addOrderDrift(s, op)
		return
	}
	var detail string
	switch op.Kind {
	case ktypes.OpAddVirtualServer:
		detail = "wanted, not in the kernel: " + op.VirtualServer.String()
	case ktypes.OpUpdateVirtualServer:
		detail = fmt.Sprintf("kernel has %s, wanted %s", op.WasVirtualServer, op.VirtualServer)
	case ktypes.OpDeleteVirtualServer:
		detail = "owned by ipvs-proxy and wanted by no Service (run deletes it on its next full sync)"
	case ktypes.OpAddRealServer:
		m := newStatusRS(rs, false)
		m.Drift, m.WantWeight = "missing", &rs.Weight
		s.RealServers = append(s.RealServers, m)
		if !s.InKernel {
			return // part of the missing virtual server
		}
		detail = fmt.Sprintf("real server %s w=%d is wanted, not in the kernel", rs.RSKey, rs.Weight)
	case ktypes.OpUpdateRealServer:
		kind, detail = updateDrift(s, op)
	case ktypes.OpDeleteRealServer:
		for i := range s.RealServers {
			if s.RealServers[i].key == rs.RSKey {
				s.RealServers[i].Drift = "extra"
			}
		}
		detail = fmt.Sprintf("real server %s w=%d is in the kernel, not wanted", rs.RSKey, rs.Weight)
	}
	s.Drift = append(s.Drift, kind)
	r.Drift = append(r.Drift, statusDrift{Kind: kind, VirtualServer: k.String(), Service: s.Service, Detail: detail})
}

// updateDrift records an in-place update of a real server on its row: a
// different weight, a different forwarding method (or GUE port), or both.
func updateDrift(s *statusVirtualServer, op ktypes.Op) (kind, detail string) {
	rs := op.RealServer
	was := ktypes.RealServer{RSKey: rs.RSKey, Weight: op.WasWeight, Forward: op.WasForward, TunPort: op.WasTunPort}
	var drift []string
	if was.Weight != rs.Weight {
		drift = append(drift, "weight")
		kind, detail = driftWeight, fmt.Sprintf("real server %s has weight %d, wanted %d", rs.RSKey, was.Weight, rs.Weight)
	}
	if !was.SameForward(rs) {
		drift = append(drift, "forwarding")
		fwd := fmt.Sprintf("is forwarded by %s, wanted %s", was.ForwardString(), rs.ForwardString())
		if kind == "" {
			detail = fmt.Sprintf("real server %s %s", rs.RSKey, fwd)
		} else {
			detail += "; it " + fwd
		}
		kind = driftForward
	}
	for i := range s.RealServers {
		if m := &s.RealServers[i]; m.key == rs.RSKey {
			m.Drift = strings.Join(drift, ",")
			if was.Weight != rs.Weight {
				m.WantWeight = &rs.Weight
			}
			if kind == driftForward {
				m.WantForward = rs.ForwardString()
			}
		}
	}
	return kind, detail
}

// addOrderDrift records a move (the delete and the add of a real server
// of an sh, dh or mh virtual server out of canonical order) once, on its
// delete.
func (r *Report) addOrderDrift(s *statusVirtualServer, op ktypes.Op) {
	if op.Kind != ktypes.OpDeleteRealServer {
		return
	}
	for i := range s.RealServers {
		if s.RealServers[i].key == op.RealServer.RSKey {
			s.RealServers[i].Drift = "order"
		}
	}
	s.Drift = append(s.Drift, driftOrder)
	r.Drift = append(r.Drift, statusDrift{Kind: driftOrder, VirtualServer: op.VirtualServer.VSKey.String(), Service: s.Service,
		Detail: fmt.Sprintf("real server %s is out of the list's canonical order (%s builds its table from it; run moves it to the head)",
			op.RealServer.RSKey, op.VirtualServer.Scheduler)})
}

// flagNames names a virtual server's flags: persistent, one-packet, and the
// scheduler's own flags (sh-port, ...).
func flagNames(vs ktypes.VirtualServer) []string {
	var out []string
	f := vs.Flags & ktypes.FlagsCompared
	if f&ktypes.FlagPersistent != 0 {
		out = append(out, "persistent")
	}
	if f&ktypes.FlagOnePacket != 0 {
		out = append(out, "one-packet")
	}
	rest := f &^ (ktypes.FlagPersistent | ktypes.FlagOnePacket)
	for _, name := range []string{"sh-fallback", "sh-port", "mh-fallback", "mh-port"} {
		if bits, err := scheduler.ParseFlags(vs.Scheduler, name); err == nil && rest&bits != 0 {
			out = append(out, name)
			rest &^= bits
		}
	}
	if rest != 0 {
		out = append(out, fmt.Sprintf("flags-%#x", rest))
	}
	return out
}

// Write prints the report as a table or JSON.
func Write(w io.Writer, rep Report, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write the status: %w", err)
		}
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node %s, interface %s; ", rep.Node, rep.Interface)
	if rep.API.Available {
		fmt.Fprintf(&b, "%d Services read from the API\n", rep.API.Services)
	} else {
		fmt.Fprintf(&b, "no API access (%s): names and drift unknown\n", rep.API.Error)
	}
	if err := writeTable(&b, rep.VirtualServers); err != nil {
		return fmt.Errorf("write the status: %w", err)
	}
	if len(rep.VirtualServers) == 0 {
		b.WriteString("(no virtual servers owned by ipvs-proxy)\n")
	}
	if rep.OtherVirtualServers > 0 {
		fmt.Fprintf(&b, "virtual servers of others (left alone): %d\n", rep.OtherVirtualServers)
	}
	writeDrift(&b, rep)
	writeAgent(&b, rep.Agent)
	writeConntrack(&b, rep.Conntrack)
	for _, w := range rep.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write the status: %w", err)
	}
	return nil
}

// writeTable writes the virtual servers' table: a row per real server,
// the virtual server's columns on its first.
func writeTable(b *strings.Builder, vss []statusVirtualServer) error {
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tKIND\tVIRTUAL SERVER\tSCHEDULER\tREAL SERVER\tWEIGHT\tACTIVE\tINACTIVE\tDRIFT")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, vs := range vss {
		sched := vs.Scheduler
		if len(vs.Flags) > 0 {
			sched += " " + strings.Join(vs.Flags, ",")
		}
		if vs.PersistenceTimeout > 0 {
			sched += fmt.Sprintf(" %ds", vs.PersistenceTimeout)
		}
		first := fmt.Sprintf("%s\t%s\t%s\t%s\t", dash(vs.Service), dash(vs.Kind), vs.key, sched)
		vsDrift := strings.Join(slices.DeleteFunc(slices.Clone(vs.Drift), func(d string) bool {
			return d == driftMissingRS || d == driftExtraRS || d == driftWeight || d == driftForward || d == driftOrder
		}), ",")
		if len(vs.RealServers) == 0 {
			fmt.Fprintf(tw, "%s-\t\t\t\t%s\n", first, vsDrift)
			continue
		}
		for i, rs := range vs.RealServers {
			prefix := "\t\t\t\t"
			if i == 0 {
				prefix = first
			}
			d := rs.Drift
			if i == 0 && vsDrift != "" {
				d = strings.Trim(vsDrift+","+d, ",")
			}
			active, inactive := strconv.Itoa(int(rs.ActiveConns)), strconv.Itoa(int(rs.InactiveConns))
			if !rs.InKernel {
				active, inactive = "-", "-"
			}
			weight := rowWeight(rs)
			fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\n", prefix, rs.key, weight, active, inactive, d)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(table.String(), "\n") {
		b.WriteString(strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			b.WriteString("\n")
		}
	}
	return nil
}

// rowWeight is a real server's WEIGHT column: its weight, its forwarding
// method when not NAT, and what is wanted of either when it differs.
func rowWeight(rs statusRealServer) string {
	weight := strconv.Itoa(int(rs.Weight))
	if rs.WantWeight != nil && strings.Contains(rs.Drift, "weight") {
		weight += fmt.Sprintf(" (want %d)", *rs.WantWeight)
	}
	if rs.Forward != "" {
		weight += " " + rs.Forward
	}
	if rs.WantForward != "" {
		weight += fmt.Sprintf(" (want %s)", rs.WantForward)
	}
	return weight
}

// writeDrift writes the drift, one line per operation.
func writeDrift(b *strings.Builder, rep Report) {
	switch {
	case !rep.DriftKnown:
		b.WriteString("drift: unknown without API access\n")
	case len(rep.Drift) == 0:
		b.WriteString("drift: none\n")
	default:
		fmt.Fprintf(b, "drift: %d\n", len(rep.Drift))
		for _, d := range rep.Drift {
			svc := ""
			if d.Service != "" {
				svc = " (" + d.Service + ")"
			}
			what := d.VirtualServer
			if what == "" {
				what = d.Address
			}
			fmt.Fprintf(b, "  %s %s%s: %s\n", d.Kind, what, svc, d.Detail)
		}
	}
}

// writeAgent writes what the agent says: the node-wide parts whose sync
// fails, and its failing Services.
func writeAgent(b *strings.Builder, agent opsserver.AgentStatus) {
	if !agent.Available {
		fmt.Fprintf(b, "agent: status unknown (%s)\n", agent.Error)
		return
	}
	if len(agent.Failing) > 0 {
		fmt.Fprintf(b, "agent: node-wide part failing: %s; last sync's error: %s\n", strings.Join(agent.Failing, ", "), agent.LastSyncError)
	}
	failing := 0
	for _, a := range agent.Services {
		if a.Failures == 0 {
			continue
		}
		failing++
		retry := ""
		if a.NextRetry != nil {
			retry = ", next retry " + a.NextRetry.Format(time.RFC3339)
		}
		fmt.Fprintf(b, "failing: %s (%d attempts%s): %s\n", a.Service, a.Failures, retry, a.LastError)
	}
	if failing == 0 {
		b.WriteString("agent: every Service programmed\n")
	}
}
