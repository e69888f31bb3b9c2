package model

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// buildAffinityDefault is the ClientIP session affinity timeout used when a
// Service does not set one (the Kubernetes default, 3 hours).
const buildAffinityDefault = 10800

// buildAffinityMax is the largest timeout the API server accepts.
const buildAffinityMax = 86400

// Skip reports whether a proxy leaves the Service alone: headless Services
// (clusterIP "None"), ExternalName Services, Services that have no cluster IP
// yet, and nil.
func Skip(svc *Service) bool {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return true
	}
	ip := svc.Spec.ClusterIP
	if ip == "" && len(svc.Spec.ClusterIPs) > 0 {
		ip = svc.Spec.ClusterIPs[0]
	}
	ip = strings.TrimSpace(ip)
	return ip == "" || ip == corev1.ClusterIPNone
}

// Build turns one Service and its EndpointSlices into the virtual servers the
// node needs. It does no I/O, its output is sorted, and it never fails:
// problems with the data become Warnings and the rest of the Service is built.
// The caller passes the EndpointSlices labelled for the Service.
func Build(svc *Service, endpointSlices []*EndpointSlice, node NodeInfo, cfg BuildConfig) ServicePlan {
	if svc == nil {
		return ServicePlan{}
	}
	plan := ServicePlan{Service: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name},
		Created: svc.Created}
	if Skip(svc) {
		return plan
	}
	b := &planBuilder{svc: svc, node: node, cfg: cfg}
	b.build(endpointSlices)
	plan.VirtualServers = b.vss
	plan.NodeEndpoints = b.nodeEndpoints()
	plan.Warnings = b.warnings
	if more := len(b.warned) - len(b.warnings); more > 0 {
		plan.Warnings = append(plan.Warnings, fmt.Sprintf("and %d more problems", more))
	}
	plan.HealthCheckNodePort = b.healthCheckNodePort
	plan.LocalEndpoints = b.localEndpoints
	if b.refused != "" {
		// Nothing of it is programmed; its health check (if any) answers
		// that the node has no endpoint, so load balancers keep away.
		plan.Refused = b.refused
		plan.VirtualServers, plan.NodeEndpoints, plan.LocalEndpoints = nil, nil, 0
	}
	return plan
}

// buildFamily is an IP family: 4 or 6.
type buildFamily int

const (
	buildIPv4 buildFamily = 4
	buildIPv6 buildFamily = 6
)

func (f buildFamily) String() string { return "IPv" + strconv.Itoa(int(f)) }

func buildFamilyOf(a netip.Addr) buildFamily {
	if a.Is4() {
		return buildIPv4
	}
	return buildIPv6
}

// buildEndpoint is one EndpointSlice endpoint, parsed.
type buildEndpoint struct {
	addr        netip.Addr
	ready       bool
	serving     bool
	terminating bool
	nodeName    string
	zone        string
	forNodes    []string
	forZones    []string
}

// rank orders duplicates of one address: a ready copy wins over a
// serving-terminating one, which wins over anything else.
func (e *buildEndpoint) rank() int {
	switch {
	case e.ready:
		return 2
	case e.serving && e.terminating:
		return 1
	}
	return 0
}

type buildSlicePort struct {
	name  string
	proto ktypes.Protocol
	port  uint16
}

// buildSlice is one EndpointSlice, parsed and validated once.
type buildSlice struct {
	family    buildFamily
	ports     []buildSlicePort
	endpoints []*buildEndpoint
}

// buildCandidate is an endpoint paired with the port a Service port resolves to.
type buildCandidate struct {
	*buildEndpoint
	key ktypes.RSKey
}

// buildAddr is one address a Service answers on.
type buildAddr struct {
	addr netip.Addr
	kind AddressKind
}

// buildAddrs holds a Service's own addresses (cluster, external and load
// balancer IPs) and the node addresses its node ports listen on.
type buildAddrs struct{ service, node []buildAddr }

type planBuilder struct {
	svc  *Service
	node NodeInfo
	cfg  BuildConfig

	sched   scheduler.Spec
	flags   uint32
	timeout uint32

	slices   []buildSlice
	families map[buildFamily]bool // the Service's IP families

	vss      []VSPlan
	seen     map[ktypes.VSKey]vsClaim // who claimed each virtual server
	portRS   []portRS                 // the current port's real servers (realServersOf)
	warnings []string
	warned   map[string]bool // every distinct warning, kept or past maxWarnings

	sourceRanges        []netip.Prefix
	healthCheckNodePort uint16
	localEndpoints      int // ready endpoints on this node (readyLocal)

	forward    ktypes.Forward             // AnnotationForwarding, where the node allows it
	tunnels    int                        // tunnelled virtual servers so far
	clusterIPs map[buildFamily]netip.Addr // the clusterIP of each family, as programmed

	nodeRS      map[netip.Addr]bool // addresses of real servers on this node
	realServers int                 // real servers built so far (Limits)
	refused     string              // the Service is over a limit (Limits)
}

// Bounds of what a Service's warnings hold: they quote what a tenant wrote
// (an annotation may be 256 KiB) and become Events and log lines on every
// node.
const (
	maxWarnings    = 16  // per Service; then one line says how many more
	maxWarningSize = 300 // bytes of one warning
)

func (b *planBuilder) warn(format string, args ...any) {
	w := truncate(fmt.Sprintf(format, args...), maxWarningSize)
	if b.warned[w] {
		return
	}
	if b.warned == nil {
		b.warned = map[string]bool{}
	}
	b.warned[w] = true
	if len(b.warnings) < maxWarnings {
		b.warnings = append(b.warnings, w)
	}
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…(cut)"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

func (b *planBuilder) build(endpointSlices []*EndpointSlice) {
	b.schedule()
	b.forward = b.forwarding()
	b.parseSlices(endpointSlices)
	addrs := b.addresses()
	b.clusterIPs = map[buildFamily]netip.Addr{}
	for _, a := range addrs.service {
		if _, dup := b.clusterIPs[buildFamilyOf(a.addr)]; a.kind == KindClusterIP && !dup {
			b.clusterIPs[buildFamilyOf(a.addr)] = a.addr
		}
	}

	b.sourceRanges = b.parseSourceRanges()
	if b.svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		b.localEndpoints = b.readyLocal()
		if hc := b.svc.Spec.HealthCheckNodePort; hc > 65535 {
			b.warn("healthCheckNodePort %d is out of range", hc)
		} else if hc > 0 {
			b.healthCheckNodePort = uint16(hc)
		}
	}
	b.seen = map[ktypes.VSKey]vsClaim{}
	if b.checkSize(addrs); b.refused != "" {
		return
	}
	for i := range b.svc.Spec.Ports {
		if b.buildPort(&b.svc.Spec.Ports[i], addrs); b.refused != "" {
			return
		}
	}
	b.checkSetEntries()
	slices.SortFunc(b.vss, func(x, y VSPlan) int { return ktypes.VSKey.Compare(x.VSKey, y.VSKey) })
}

// parseSourceRanges reads loadBalancerSourceRanges; invalid ones are
// warned about and left out.
func (b *planBuilder) parseSourceRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, r := range b.svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			b.warn("loadBalancerSourceRanges %q is not a CIDR; ignored", r)
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// schedule resolves the scheduler, its flags and session affinity.
func (b *planBuilder) schedule() {
	def := b.cfg.Scheduler
	if def.Name == "" {
		def = scheduler.Spec{Name: scheduler.Default}
	}
	spec, warnings := scheduler.FromAnnotations(b.svc.Annotations, def)
	for _, w := range warnings {
		b.warn("%s", w)
	}
	if spec.Name != def.Name && b.cfg.Unavailable[spec.Name] {
		mod, _ := scheduler.Module(spec.Name)
		b.warn("IPVS scheduler %q is not available in this node's kernel (module %s); using the default %q", spec.Name, mod, def.Name)
		spec = def
	}
	b.sched = spec
	b.flags = spec.Flags

	if b.svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return
	}
	b.flags |= ktypes.FlagPersistent
	b.timeout = buildAffinityDefault
	if tp := b.svc.Spec.AffinityTimeout; tp != nil {
		t := *tp
		if t <= 0 || t > buildAffinityMax {
			b.warn("sessionAffinityConfig.clientIP.timeoutSeconds %d is out of range (1-%d); using %d",
				t, buildAffinityMax, buildAffinityDefault)
		} else {
			b.timeout = uint32(t)
		}
	}
}

// buildParseAddr parses an IP address as Kubernetes does: IPv4-mapped IPv6
// addresses count as IPv4, and legacy IPv4 forms with leading zeros are read
// as decimal. Zoned, unspecified and multicast addresses are rejected. When
// it fails, problem completes a warning ("... is not a valid IP address").
func buildParseAddr(s string) (a netip.Addr, problem string) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		var ok bool
		if a, ok = buildParseLegacyIPv4(s); !ok {
			return netip.Addr{}, "is not a valid IP address"
		}
	}
	return buildCheckAddr(a)
}

// buildEndpointAddr is endpoint i's address in s, or why it has none that
// a proxy can use (a warning's text).
func buildEndpointAddr(s *EndpointSlice, i int) (netip.Addr, string) {
	if written, ok := s.Unparsed[i]; ok {
		a, problem := buildParseAddr(written)
		if problem != "" {
			return a, fmt.Sprintf("endpoint address %q %s", written, problem)
		}
		return a, ""
	}
	e := s.Endpoints[i]
	if !e.Address.IsValid() {
		return netip.Addr{}, "an endpoint has no addresses; ignored"
	}
	a, problem := buildCheckAddr(e.Address)
	if problem != "" {
		return a, fmt.Sprintf("endpoint address %q %s", s.WrittenAddress(i), problem)
	}
	return a, ""
}

// buildCheckAddr is a parsed address as a proxy uses it (IPv4-mapped ones
// as IPv4), or what makes it unusable.
func buildCheckAddr(a netip.Addr) (netip.Addr, string) {
	a = a.Unmap()
	if a.Zone() != "" {
		return netip.Addr{}, "has an IPv6 zone"
	}
	if a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, "is not a unicast address"
	}
	return a, ""
}

// buildParseLegacyIPv4 reads dotted-quad IPv4 addresses with leading zeros
// ("010.000.000.001"), which older API servers accepted, as decimal.
func buildParseLegacyIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if len(p) == 0 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return netip.Addr{}, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// allowed reports whether the node may program a virtual server on a: its
// family is enabled. (--exclude-cidrs does not stop it: as in kube-proxy,
// it only keeps what no Service wants from being cleaned up.)
func (b *planBuilder) allowed(a netip.Addr) bool {
	if a.Is6() && b.cfg.NodeWithoutIPv6 {
		b.warn("the node's kernel has no IPv6: the Service's IPv6 addresses are not served on it")
		return false
	}
	if b.cfg.IPv4 || b.cfg.IPv6 {
		if (a.Is4() && !b.cfg.IPv4) || (a.Is6() && !b.cfg.IPv6) {
			return false
		}
	}
	return true
}

// addresses lists every address the Service answers on, except node
// addresses (those depend on the port having a nodePort).
func (b *planBuilder) addresses() (addrs buildAddrs) {
	spec := &b.svc.Spec
	b.families = map[buildFamily]bool{}
	for _, f := range spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			b.families[buildIPv4] = true
		case corev1.IPv6Protocol:
			b.families[buildIPv6] = true
		}
	}

	clusterIPs := spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{spec.ClusterIP}
	}
	for _, s := range clusterIPs {
		a, problem := buildParseAddr(s)
		if problem != "" {
			b.warn("clusterIP %q %s", s, problem)
			continue
		}
		b.families[buildFamilyOf(a)] = true
		if b.allowed(a) {
			addrs.service = append(addrs.service, buildAddr{a, KindClusterIP})
		}
	}

	for _, s := range spec.ExternalIPs {
		a, problem := buildParseAddr(s)
		if problem == "" {
			problem = b.externalProblem(a)
		}
		if problem == "" && len(b.cfg.ExternalIPCIDRs) > 0 && !InRanges(b.cfg.ExternalIPCIDRs, a) {
			problem = "is outside externalIPCIDRs; not programmed"
		}
		switch {
		case problem != "":
			b.warn("externalIP %q %s", s, problem)
		case !b.families[buildFamilyOf(a)]:
			b.warn("externalIP %q: the Service has no %s cluster IP", s, buildFamilyOf(a))
		case b.allowed(a):
			addrs.service = append(addrs.service, buildAddr{a, KindExternalIP})
		}
	}

	for _, ing := range b.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: nothing for the proxy to do
		}
		if ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			if *ing.IPMode != corev1.LoadBalancerIPModeProxy {
				b.warn("loadBalancer ingress %q: unknown ipMode %q; skipped", ing.IP, *ing.IPMode)
			}
			continue // the load balancer proxies to the nodes itself
		}
		a, problem := buildParseAddr(ing.IP)
		if problem == "" {
			problem = b.externalProblem(a)
		}
		switch {
		case problem != "":
			b.warn("loadBalancer ingress %q %s", ing.IP, problem)
		case !b.families[buildFamilyOf(a)]:
			// Like kube-proxy, only VIPs of the Service's own families.
		case b.allowed(a):
			addrs.service = append(addrs.service, buildAddr{a, KindLoadBalancer})
		}
	}

	if spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, a := range b.node.NodePortAddresses {
			a = a.Unmap()
			dup := slices.ContainsFunc(addrs.node, func(v buildAddr) bool { return v.addr == a })
			if a.IsValid() && !dup && b.families[buildFamilyOf(a)] && b.allowed(a) {
				addrs.node = append(addrs.node, buildAddr{a, KindNodePort})
			}
		}
	}
	return addrs
}

// externalProblem says why an externalIP or a LoadBalancer ingress IP, which
// any tenant who can write a Service (or its status) chooses, is never
// programmed; "" if it may be. Bound to the proxy's interface and guarded
// by the glue, such an address would take the node's own traffic to it:
// loopback, link-local and broadcast addresses are the node's or no one's
// (buildParseAddr already refuses multicast and unspecified ones), and the
// apiserver's address would cut the node off the apiserver, so that the
// Service's deletion never reaches it (the CVE-2020-8554 class). Another
// Node's address would make this node take every packet to that Node
// (kubelet, sshd, the overlay): it is served by that Node alone, where it
// is a node address (virtual servers, not bound).
func (b *planBuilder) externalProblem(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "is a loopback address; not programmed"
	case a.IsLinkLocalUnicast():
		return "is a link-local address; not programmed"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "is the broadcast address; not programmed"
	case slices.Contains(b.cfg.APIServer, a):
		return "is the address of the apiserver this node uses; not programmed"
	}
	if node, ok := b.cfg.OtherNodes[a]; ok && !b.isNodeAddress(a) {
		return fmt.Sprintf("is an address of Node %s; served by that Node only, not programmed on this one", node)
	}
	return ""
}

// parseSlices validates the EndpointSlices once, in name order, so that
// warnings are reported once per slice rather than once per port.
func (b *planBuilder) parseSlices(in []*EndpointSlice) {
	sorted := slices.Clone(in)
	sorted = slices.DeleteFunc(sorted, func(s *EndpointSlice) bool { return s == nil })
	slices.SortStableFunc(sorted, func(x, y *EndpointSlice) int { return cmp.Compare(x.Name, y.Name) })

	for _, s := range sorted {
		var info buildSlice
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4:
			info.family = buildIPv4
		case discoveryv1.AddressTypeIPv6:
			info.family = buildIPv6
		case discoveryv1.AddressTypeFQDN:
			continue // not proxied
		default:
			b.warn("EndpointSlice %q: addressType %q is not supported", s.Name, s.AddressType)
			continue
		}

		for _, p := range s.Ports {
			name := buildDeref(p.Name)
			proto := ktypes.TCP
			if p.Protocol != nil {
				var err error
				if proto, err = ktypes.ParseProtocol(string(*p.Protocol)); err != nil {
					continue // cannot match any Service port; reported there
				}
			}
			if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
				num := "none"
				if p.Port != nil {
					num = strconv.Itoa(int(*p.Port))
				}
				b.warn("EndpointSlice %q: port %q has an invalid port number (%s); ignored", s.Name, name, num)
				continue
			}
			info.ports = append(info.ports, buildSlicePort{name, proto, uint16(*p.Port)})
		}

		for i, e := range s.Endpoints {
			a, problem := buildEndpointAddr(s, i)
			if problem != "" {
				b.warn("EndpointSlice %q: %s", s.Name, problem)
				continue
			}
			if buildFamilyOf(a) != info.family {
				b.warn("EndpointSlice %q: endpoint address %q is not an %s address", s.Name, s.WrittenAddress(i), info.family)
				continue
			}
			ep := &buildEndpoint{addr: a, ready: e.Ready, serving: e.Serving, terminating: e.Terminating,
				nodeName: e.NodeName, zone: e.Zone}
			if e.Hints != nil {
				ep.forNodes, ep.forZones = e.Hints.ForNodes, e.Hints.ForZones
			}
			info.endpoints = append(info.endpoints, ep)
		}
		b.slices = append(b.slices, info)
	}
}

func buildDeref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func buildPortLabel(p *ServicePort) string {
	if p.Name != "" {
		return strconv.Quote(p.Name)
	}
	return strconv.Itoa(int(p.Port))
}

// buildPort adds the virtual servers of one Service port.
func (b *planBuilder) buildPort(p *ServicePort, addrs buildAddrs) {
	label := buildPortLabel(p)
	proto := ktypes.TCP
	if p.Protocol != "" {
		var err error
		if proto, err = ktypes.ParseProtocol(string(p.Protocol)); err != nil {
			b.warn("port %s: protocol %q is not supported", label, p.Protocol)
			return
		}
	}
	if p.Port <= 0 || p.Port > 65535 {
		b.warn("port %s: port number %d is out of range", label, p.Port)
		return
	}

	cands := b.candidates(p.Name, proto, label)
	b.portRS = b.portRS[:0]
	for _, a := range addrs.service {
		b.addVS(a, proto, uint16(p.Port), p.Name, label, cands[buildFamilyOf(a.addr)])
	}
	if len(addrs.node) > 0 && p.NodePort != 0 {
		if p.NodePort < 0 || p.NodePort > 65535 {
			b.warn("port %s: nodePort %d is out of range", label, p.NodePort)
			return
		}
		for _, a := range addrs.node {
			b.addVS(a, proto, uint16(p.NodePort), p.Name, label, cands[buildFamilyOf(a.addr)])
		}
	}
}

// candidates collects, per family, the endpoints of every slice with the
// port a Service port resolves to: the slice port of the same name and
// protocol. Duplicates (same address and port) are merged, the ready copy
// winning. The result is sorted by address and port.
func (b *planBuilder) candidates(name string, proto ktypes.Protocol, label string) map[buildFamily][]buildCandidate {
	byKey := map[ktypes.RSKey]buildCandidate{}
	matched, anyEndpoints := false, false
	for _, s := range b.slices {
		anyEndpoints = anyEndpoints || len(s.endpoints) > 0
		for _, sp := range s.ports {
			if sp.name != name || sp.proto != proto {
				continue
			}
			matched = true
			for _, e := range s.endpoints {
				key := ktypes.RSKey{Address: e.addr, Port: sp.port}
				if old, dup := byKey[key]; !dup || e.rank() > old.rank() {
					byKey[key] = buildCandidate{e, key}
				}
			}
		}
	}
	if anyEndpoints && !matched {
		b.warn("port %s: no EndpointSlice has a %s port named %q; the port has no endpoints", label, proto, name)
	}
	out := map[buildFamily][]buildCandidate{}
	for _, c := range byKey {
		f := buildFamilyOf(c.key.Address)
		out[f] = append(out[f], c)
	}
	for _, cs := range out {
		slices.SortFunc(cs, func(x, y buildCandidate) int { return ktypes.RSKey.Compare(x.key, y.key) })
	}
	return out
}

// portRS is the real servers one port's virtual servers of a family got
// with a locality: each node address's node port (and each other address
// of the same kind of locality) wants the same ones, chosen once per port
// (buildPort resets them).
type portRS struct {
	fam             buildFamily
	local, external bool
	rss             []ktypes.RealServer
	inClusterOnly   bool
}

// realServersOf is the real servers of a's virtual server from cands (the
// port's candidates of a's family): chosen once per port, family and
// locality; each virtual server gets its own copy, the first too, since
// forwarding (tunnelled, right after addVS) and the agent's settle edit
// a plan's real servers in place and the kept choice must stay as chosen.
func (b *planBuilder) realServersOf(a buildAddr, local bool, proto ktypes.Protocol, cands []buildCandidate) ([]ktypes.RealServer, bool) {
	fam, external := buildFamilyOf(a.addr), local && a.kind.External()
	for _, m := range b.portRS {
		if m.fam == fam && m.local == local && m.external == external {
			return slices.Clone(m.rss), m.inClusterOnly
		}
	}
	rss, inClusterOnly := b.chooseRealServers(local, external, proto, cands)
	b.portRS = append(b.portRS, portRS{fam, local, external, rss, inClusterOnly})
	return slices.Clone(rss), inClusterOnly
}

// chooseRealServers picks the real servers of a virtual server from cands:
// on a Local one (local) only this node's endpoints, or every endpoint
// for in-cluster clients of an external address (external) with none
// here; the ready ones at weight 1, narrowed by topology hints, else the
// serving terminating ones; draining and not-ready ones of TCP at 0.
func (b *planBuilder) chooseRealServers(local, external bool, proto ktypes.Protocol, cands []buildCandidate) ([]ktypes.RealServer, bool) {
	var selected, pool []buildCandidate
	inClusterOnly := false
	if local {
		pool = b.onNode(cands)
		selected, _ = buildUsable(pool)
		if external && len(selected) == 0 {
			// No usable endpoint here: traffic from outside the cluster
			// finds none (the glue drops it), in-cluster clients get
			// every endpoint, as from a Cluster policy.
			inClusterOnly = true
			pool = cands
			var fallback bool
			if selected, fallback = buildUsable(cands); !fallback {
				selected = b.topology(selected)
			}
		}
	} else {
		pool = cands
		var fallback bool
		if selected, fallback = buildUsable(cands); !fallback {
			// Hints narrow the ready endpoints only: with none ready
			// anywhere, every serving terminating endpoint is the last
			// resort, hints or not (as kube-proxy does).
			selected = b.topology(selected)
		}
	}
	chosen := chosenKeys(selected)
	rss := make([]ktypes.RealServer, 0, len(pool))
	for _, c := range pool {
		switch {
		case chosen.has(selected, c.key):
			rss = append(rss, ktypes.RealServer{RSKey: c.key, Weight: 1})
			b.markOnNode(c)
		case proto != ktypes.TCP:
			// UDP and SCTP (kube-proxy's rule): an endpoint that is not
			// chosen loses its real server at once, and the reconciler
			// clears its UDP flows' conntrack entries, so a client that
			// keeps its source port is scheduled afresh at its next
			// datagram instead of staying on an endpoint that stopped
			// serving for as long as it sends.
		case c.serving && c.terminating:
			// Draining: a terminating endpoint that still serves keeps
			// its real server at weight 0, so it gets no new connections
			// but its established ones go on until the endpoint leaves
			// the slice (deleting the real server would cut them, since
			// expire_nodest_conn=1).
			rss = append(rss, ktypes.RealServer{RSKey: c.key, Weight: 0})
			b.markOnNode(c)
		case !c.ready:
			// Not serving (failing readiness, or terminating and done
			// serving) but still in a slice: marked Drain, the real
			// server is kept at weight 0 only while the kernel counts
			// connections on it (see Diff), never added.
			rss = append(rss, ktypes.RealServer{RSKey: c.key, Weight: 0, Drain: true})
			b.markOnNode(c)
		}
	}
	if len(rss) == 0 {
		rss = nil
	}
	return rss, inClusterOnly
}

// chosenSet tells the selected candidates' keys: a scan of the few a
// Service usually has, a map past smallChosen (no map per virtual server
// for two endpoints).
type chosenSet map[ktypes.RSKey]bool

const smallChosen = 8

func chosenKeys(selected []buildCandidate) chosenSet {
	if len(selected) <= smallChosen {
		return nil
	}
	m := make(chosenSet, len(selected))
	for _, c := range selected {
		m[c.key] = true
	}
	return m
}

func (m chosenSet) has(selected []buildCandidate, k ktypes.RSKey) bool {
	if m != nil {
		return m[k]
	}
	return slices.ContainsFunc(selected, func(c buildCandidate) bool { return c.key == k })
}

// vsClaim is what claimed a virtual server: an address kind of a port,
// formatted only for the warning of a virtual server claimed twice.
type vsClaim struct {
	kind  AddressKind
	label string
}

func (c vsClaim) String() string { return fmt.Sprintf("%s of port %s", c.kind, c.label) }

func (b *planBuilder) addVS(a buildAddr, proto ktypes.Protocol, port uint16, portName, label string, cands []buildCandidate) {
	if b.refused != "" {
		return
	}
	key := ktypes.VSKey{Address: a.addr, Protocol: proto, Port: port}
	claim := vsClaim{a.kind, label}
	if first, dup := b.seen[key]; dup {
		b.warn("virtual server %s is claimed twice (%s, %s); keeping the first", key, first, claim)
		return
	}
	b.seen[key] = claim

	local := b.localOnly(a.kind)
	rss, inClusterOnly := b.realServersOf(a, local, proto, cands)
	b.vss = append(b.vss, VSPlan{
		VirtualServer: ktypes.VirtualServer{
			VSKey:     key,
			Scheduler: b.sched.Name,
			Flags:     b.flags,
			Timeout:   b.timeout,
		},
		Kind:          a.kind,
		PortName:      portName,
		RealServers:   rss,
		Local:         local,
		InClusterOnly: inClusterOnly,
	})
	if a.kind == KindLoadBalancer {
		b.vss[len(b.vss)-1].SourceRanges = b.sourceRanges
	}
	if a.kind == KindExternalIP || a.kind == KindLoadBalancer {
		b.vss[len(b.vss)-1].NodeAddress = b.isNodeAddress(a.addr)
	}
	if a.kind == KindClusterIP {
		b.vss[len(b.vss)-1].Routed = InRanges(b.cfg.ServiceRanges, a.addr)
	}
	b.tunnelled(&b.vss[len(b.vss)-1])
	b.checkRealServers(b.vss[len(b.vss)-1])
}

// markOnNode records a real server's address when its endpoint is on this
// node.
func (b *planBuilder) markOnNode(c buildCandidate) {
	if b.node.Name == "" || c.nodeName != b.node.Name {
		return
	}
	if b.nodeRS == nil {
		b.nodeRS = map[netip.Addr]bool{}
	}
	b.nodeRS[c.addr] = true
}

// nodeEndpoints is ServicePlan.NodeEndpoints: the addresses markOnNode saw,
// sorted.
func (b *planBuilder) nodeEndpoints() []netip.Addr {
	if len(b.nodeRS) == 0 {
		return nil
	}
	out := slices.Collect(maps.Keys(b.nodeRS))
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// InRanges reports whether one of the prefixes holds a.
func InRanges(ranges []netip.Prefix, a netip.Addr) bool {
	for _, p := range ranges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// isNodeAddress reports whether a is one of the node's own addresses.
func (b *planBuilder) isNodeAddress(a netip.Addr) bool {
	is := func(n netip.Addr) bool { return n.Unmap() == a }
	return slices.ContainsFunc(b.node.Addresses, is) || slices.ContainsFunc(b.node.NodePortAddresses, is)
}

// localOnly reports whether the traffic policy for this kind of address is
// Local.
func (b *planBuilder) localOnly(kind AddressKind) bool {
	if kind.External() {
		return b.svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	}
	itp := b.svc.Spec.InternalTrafficPolicy
	return itp != nil && *itp == corev1.ServiceInternalTrafficPolicyLocal
}

func buildFilter(cs []buildCandidate, keep func(buildCandidate) bool) []buildCandidate {
	var out []buildCandidate
	for _, c := range cs {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// buildUsable returns the ready endpoints or, when none is ready, the serving
// terminating ones (fallback set).
func buildUsable(cs []buildCandidate) (usable []buildCandidate, fallback bool) {
	if ready := buildFilter(cs, func(c buildCandidate) bool { return c.ready }); len(ready) > 0 {
		return ready, false
	}
	return buildFilter(cs, func(c buildCandidate) bool { return c.serving && c.terminating }), true
}

// readyLocal is what the health check counts (kube-proxy's rule): the
// distinct ready endpoint addresses on this node in the Service's slices
// that have a port, whether or not the node serves an external address of
// the Service (no node ports, a hostname-only ingress, an IP not yet
// assigned); per family, the larger count, since a dual-stack pod is one
// endpoint with an address in each (kube-proxy's families each report
// their own count to one server). The serving-terminating fallback still
// routes here but is not counted, so load balancers drain the node.
func (b *planBuilder) readyLocal() int {
	if b.node.Name == "" {
		return 0
	}
	perFamily := map[buildFamily]map[netip.Addr]bool{}
	for _, s := range b.slices {
		if len(s.ports) == 0 {
			continue
		}
		for _, e := range s.endpoints {
			if e.ready && e.nodeName == b.node.Name {
				if perFamily[s.family] == nil {
					perFamily[s.family] = map[netip.Addr]bool{}
				}
				perFamily[s.family][e.addr] = true
			}
		}
	}
	n := 0
	for _, addrs := range perFamily {
		n = max(n, len(addrs))
	}
	return n
}

// onNode returns the endpoints on this node (Local traffic policy).
func (b *planBuilder) onNode(cs []buildCandidate) []buildCandidate {
	if b.node.Name == "" {
		return nil
	}
	return buildFilter(cs, func(c buildCandidate) bool { return c.nodeName == b.node.Name })
}

// topology narrows the ready endpoints of a Cluster traffic policy path by
// the hints the EndpointSlice controller sets for trafficDistribution and
// Topology Aware Routing: node hints, else zone hints, and only when every
// endpoint has such hints and some are for this node or its zone. Otherwise
// every usable endpoint serves (the documented safeguard: hand-made slices,
// a controller that has not caught up, a zone without capacity). The
// endpoints' own nodeName and zone never narrow anything.
func (b *planBuilder) topology(cs []buildCandidate) []buildCandidate {
	if len(cs) == 0 {
		return cs
	}
	byHint := func(mine string, hints func(buildCandidate) []string) []buildCandidate {
		if mine == "" {
			return nil
		}
		for _, c := range cs {
			if len(hints(c)) == 0 {
				return nil
			}
		}
		return buildFilter(cs, func(c buildCandidate) bool { return slices.Contains(hints(c), mine) })
	}
	if m := byHint(b.node.Name, func(c buildCandidate) []string { return c.forNodes }); len(m) > 0 {
		return m
	}
	if m := byHint(b.node.Zone, func(c buildCandidate) []string { return c.forZones }); len(m) > 0 {
		return m
	}
	return cs
}

// UsesExternalAddress reports whether one of svc's externalIPs or
// LoadBalancer ingress IPs, read as Build reads them, is in addrs: a
// change of what Build knows of those addresses (BuildConfig.OtherNodes)
// changes svc's plan.
func UsesExternalAddress(svc *Service, addrs map[netip.Addr]bool) bool {
	if svc == nil || len(addrs) == 0 {
		return false
	}
	in := func(s string) bool {
		a, problem := buildParseAddr(s)
		return problem == "" && addrs[a]
	}
	if slices.ContainsFunc(svc.Spec.ExternalIPs, in) {
		return true
	}
	return slices.ContainsFunc(svc.Status.LoadBalancer.Ingress, func(ing LoadBalancerIngress) bool { return in(ing.IP) })
}
