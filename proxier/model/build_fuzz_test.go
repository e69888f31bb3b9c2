package model_test

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	stdslices "slices" // build_test.go has a func slices
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// The fuzz input of FuzzBuild is a small text that describes a Service, its
// EndpointSlices, the node and the configuration, one setting a line:
//
//	type NodePort
//	clusterIPs 10.96.0.10,fd00::10
//	port http,TCP,80,30080
//	slice web-a,IPv4
//	sport http,TCP,8080
//	ep 10.1.0.1,tt~,node-a,zone-a
//	node node-a,zone-a
//	nodeAddrs 192.168.1.10
//
// A keyword, a space, then comma-separated fields (a few take the rest of
// the line whole). "~" is a nil pointer wherever the API has one; numbers
// that do not parse are 0; unknown lines are ignored. The fuzzer mutates
// the text, so every field can hold any string, while the seeds keep the
// shapes meaningful. The keywords:
//
//	Service:  type T | clusterIP S | clusterIPs A,... | families F,... |
//	          externalIPs A,... | ingress IP[,MODE] | port NAME,PROTO,PORT[,NODEPORT] |
//	          etp P | itp P | hcnp N | affinity A[,TIMEOUT|~|-] | distribution D |
//	          sourceRanges C,... | annotation K=V | scheduler S | flags F |
//	          created UNIX | second (what follows describes a second Service,
//	          ns/other, starting as a copy of the first)
//	slices:   slice NAME,ADDRESSTYPE | sport NAME,PROTO,PORT |
//	          ep ADDR+...,COND,NODE,ZONE,FORNODE+...,FORZONE+...
//	          (COND: ready, serving, terminating; t, f, or anything else for nil)
//	node:     node NAME[,ZONE] | nodeAddrs A,... (one that does not parse is the zero Addr)
//	config:   default SCHED[,FLAGS] | ipv4 | ipv6 | exclude CIDR,... | unavailable S,...

// fuzzWorld is what one input describes.
type fuzzWorld struct {
	svc, other *corev1.Service
	slices     []*discoveryv1.EndpointSlice
	node       model.NodeInfo
	cfg        model.BuildConfig
	exclude    []netip.Prefix // --exclude-cidrs: the ownership rule's alone
}

// Limits that keep one input cheap to run.
const (
	fuzzMaxLines  = 64
	fuzzMaxSlices = 4
	fuzzMaxList   = 6
)

func fuzzList(s string) []string {
	l := strings.Split(s, ",")
	return l[:min(len(l), fuzzMaxList)]
}

func fuzzField(fs []string, i int) string {
	if i < len(fs) {
		return fs[i]
	}
	return ""
}

// fuzzPtr is nil for a missing field or "~".
func fuzzPtr(fs []string, i int) *string {
	if i >= len(fs) || fs[i] == "~" {
		return nil
	}
	return &fs[i]
}

func fuzzInt32(s string) int32 {
	n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	return int32(n)
}

func fuzzInt32Ptr(fs []string, i int) *int32 {
	p := fuzzPtr(fs, i)
	if p == nil {
		return nil
	}
	n := fuzzInt32(*p)
	return &n
}

func fuzzBool(c byte) *bool {
	switch c {
	case 't':
		return new(true)
	case 'f':
		return new(false)
	}
	return nil
}

// fuzzNames splits a "+"-separated list; "~" is nil.
func fuzzNames(fs []string, i int) []string {
	p := fuzzPtr(fs, i)
	if p == nil {
		return nil
	}
	l := strings.Split(*p, "+")
	return l[:min(len(l), fuzzMaxList)]
}

func parseFuzzWorld(in string) fuzzWorld {
	w := fuzzWorld{
		svc: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web",
			CreationTimestamp: metav1.Unix(1_700_000_000, 0)}},
	}
	cur := w.svc
	var sl *discoveryv1.EndpointSlice
	lines := strings.Split(in, "\n")
	for _, line := range lines[:min(len(lines), fuzzMaxLines)] {
		key, rest, _ := strings.Cut(line, " ")
		fs := fuzzList(rest)
		spec := &cur.Spec
		switch key {
		case "type":
			spec.Type = corev1.ServiceType(rest)
		case "clusterIP":
			spec.ClusterIP = rest
		case "clusterIPs":
			spec.ClusterIPs = fs
		case "families":
			spec.IPFamilies = nil
			for _, f := range fs {
				spec.IPFamilies = append(spec.IPFamilies, corev1.IPFamily(f))
			}
		case "externalIPs":
			spec.ExternalIPs = fs
		case "ingress":
			ing := corev1.LoadBalancerIngress{IP: fs[0]}
			if m := fuzzPtr(fs, 1); m != nil {
				ing.IPMode = (*corev1.LoadBalancerIPMode)(m)
			}
			cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, ing)
		case "port":
			if len(spec.Ports) < fuzzMaxList {
				spec.Ports = append(spec.Ports, corev1.ServicePort{Name: fs[0], Protocol: corev1.Protocol(fuzzField(fs, 1)),
					Port: fuzzInt32(fuzzField(fs, 2)), NodePort: fuzzInt32(fuzzField(fs, 3))})
			}
		case "etp":
			spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(rest)
		case "itp":
			spec.InternalTrafficPolicy = (*corev1.ServiceInternalTrafficPolicy)(fuzzPtr(fs, 0))
		case "hcnp":
			spec.HealthCheckNodePort = fuzzInt32(rest)
		case "affinity":
			spec.SessionAffinity = corev1.ServiceAffinity(fs[0])
			switch fuzzField(fs, 1) {
			case "":
				spec.SessionAffinityConfig = nil
			case "-":
				spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
			default:
				spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: fuzzInt32Ptr(fs, 1)}}
			}
		case "distribution":
			spec.TrafficDistribution = fuzzPtr(fs, 0)
		case "sourceRanges":
			spec.LoadBalancerSourceRanges = fs
		case "annotation", "scheduler", "flags":
			k, v, _ := strings.Cut(rest, "=")
			switch key {
			case "scheduler":
				k, v = scheduler.AnnotationScheduler, rest
			case "flags":
				k, v = scheduler.AnnotationFlags, rest
			}
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[k] = v
		case "created":
			n, _ := strconv.ParseInt(rest, 10, 64)
			cur.CreationTimestamp = metav1.Unix(n%(1<<40), 0)
		case "second":
			if w.other == nil {
				w.other = w.svc.DeepCopy()
				w.other.Name = "other"
				cur = w.other
			}

		case "slice":
			if len(w.slices) == fuzzMaxSlices {
				sl = nil // the rest of this input's slices are dropped
				continue
			}
			// Slice names are unique in a namespace.
			name := fs[0]
			for stdslices.ContainsFunc(w.slices, func(s *discoveryv1.EndpointSlice) bool { return s.Name == name }) {
				name += "'"
			}
			sl = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
				AddressType: discoveryv1.AddressType(fuzzField(fs, 1))}
			w.slices = append(w.slices, sl)
		case "sport":
			if sl != nil && len(sl.Ports) < fuzzMaxList {
				sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: fuzzPtr(fs, 0),
					Protocol: (*corev1.Protocol)(fuzzPtr(fs, 1)), Port: fuzzInt32Ptr(fs, 2)})
			}
		case "ep":
			if sl == nil || len(sl.Endpoints) == fuzzMaxList {
				continue
			}
			cond := fuzzField(fs, 1) + "   "
			e := discoveryv1.Endpoint{Addresses: fuzzNames(fs, 0),
				Conditions: discoveryv1.EndpointConditions{Ready: fuzzBool(cond[0]), Serving: fuzzBool(cond[1]), Terminating: fuzzBool(cond[2])},
				NodeName:   fuzzPtr(fs, 2), Zone: fuzzPtr(fs, 3)}
			if len(fs) > 4 {
				e.Hints = &discoveryv1.EndpointHints{}
				for _, n := range fuzzNames(fs, 4) {
					e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
				}
				for _, z := range fuzzNames(fs, 5) {
					e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
				}
			}
			sl.Endpoints = append(sl.Endpoints, e)

		case "node":
			w.node.Name, w.node.Zone = fs[0], fuzzField(fs, 1)
		case "nodeAddrs":
			w.node.NodePortAddresses = nil
			for _, s := range fs {
				a, _ := netip.ParseAddr(s) // the zero Addr when it does not parse
				w.node.NodePortAddresses = append(w.node.NodePortAddresses, a)
			}

		case "default":
			// The command line's validation lets only a known scheduler
			// with its own flags through.
			if scheduler.Validate(fs[0]) == nil {
				flags, _ := scheduler.ParseFlags(fs[0], fuzzField(fs, 1))
				w.cfg.Scheduler = scheduler.Spec{Name: fs[0], Flags: flags}
			}
		case "ipv4":
			w.cfg.IPv4 = true
		case "ipv6":
			w.cfg.IPv6 = true
		case "exclude":
			for _, s := range fs {
				if p, err := netip.ParsePrefix(s); err == nil {
					w.exclude = append(w.exclude, p.Masked())
				}
			}
		case "unavailable":
			w.cfg.Unavailable = map[string]bool{}
			for _, s := range fs {
				w.cfg.Unavailable[s] = true
			}
		}
	}
	if w.other == nil {
		// The second Service wants everything the first does: every
		// virtual server is a conflict, won by ns/other (same age, lower name).
		w.other = w.svc.DeepCopy()
		w.other.Name = "other"
	}
	return w
}

// fuzzSeeds are inputs for f.Add; the corpus in testdata/fuzz/FuzzBuild
// holds longer ones.
var fuzzSeeds = []string{
	"",
	"clusterIP 10.96.0.10\nport http,TCP,80\nslice web-a,IPv4\nsport http,TCP,8080\nep 10.1.0.1,tt~",
	"clusterIPs None\nport ,UDP,53",
	"type ExternalName\nclusterIP 10.96.0.10\nport ,TCP,80",
	"type NodePort\nclusterIPs fd00::10\nfamilies IPv6\nport ,TCP,443,30443\nnode n\nnodeAddrs 2001:db8::1,::ffff:192.168.1.1,bogus\nslice s,IPv6\nsport ~,~,8443\nep fd01::1,ttf,n",
}

func FuzzBuild(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		w := parseFuzzWorld(in)
		svcBefore, slicesBefore := w.svc.DeepCopy(), deepCopySlices(w.slices)

		plan := buildUnchanged(t, w.svc, w.slices, w.node, w.cfg)
		checkFuzzPlan(t, &w, w.svc, &plan)

		if !reflect.DeepEqual(w.svc, svcBefore) || !reflect.DeepEqual(w.slices, slicesBefore) {
			t.Fatal("Build changed its input (objects shared with the informers' caches)")
		}
		if again := build(w.svc, w.slices, w.node, w.cfg); !cmp.Equal(plan, again, planCmp...) {
			t.Fatalf("Build is not deterministic:\n%s", cmp.Diff(plan, again, planCmp...))
		}
		for _, order := range fuzzOrders(w.slices) {
			if got := build(w.svc, order, w.node, w.cfg); !cmp.Equal(plan, got, planCmp...) {
				t.Fatalf("Build depends on the order of the EndpointSlices (-in order +reordered):\n%s", cmp.Diff(plan, got, planCmp...))
			}
		}

		other := build(w.other, w.slices, w.node, w.cfg)
		checkFuzzPlan(t, &w, w.other, &other)
		checkFuzzAssign(t, &w, []*model.ServicePlan{&plan, &other})
	})
}

// fuzzOrders are the slices reversed and rotated by one.
func fuzzOrders(in []*discoveryv1.EndpointSlice) [][]*discoveryv1.EndpointSlice {
	if len(in) < 2 {
		return nil
	}
	rev := stdslices.Clone(in)
	stdslices.Reverse(rev)
	return [][]*discoveryv1.EndpointSlice{rev, append(stdslices.Clone(in[1:]), in[0])}
}

// nodeAddrs are the node-port addresses as IPv4 or IPv6 (not IPv4-mapped).
func (w *fuzzWorld) nodeAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, a := range w.node.NodePortAddresses {
		out[a.Unmap()] = true
	}
	return out
}

// fuzzParseAddr parses an endpoint's address, also in the legacy IPv4 form
// with leading zeros that the builder accepts; IPv4-mapped addresses are
// IPv4. It returns the zero Addr when the string is no address.
func fuzzParseAddr(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap()
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil || strings.HasPrefix(p, "+") || len(p) > 3 {
			return netip.Addr{}
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	a, _ := netip.ParseAddr(strings.Join(parts, "."))
	return a
}

// fuzzUnicast reports whether an address may be a virtual or real server's:
// valid, unicast, without a zone and not IPv4-mapped.
func fuzzUnicast(a netip.Addr) bool {
	return a.IsValid() && a.Zone() == "" && !a.Is4In6() && !a.IsUnspecified() && !a.IsMulticast()
}

// checkFuzzPlan checks what holds for every plan, whatever the input.
func checkFuzzPlan(t *testing.T, w *fuzzWorld, svc *corev1.Service, plan *model.ServicePlan) {
	t.Helper()
	fail := func(vs model.VSPlan, format string, args ...any) {
		t.Helper()
		t.Fatalf("%s %s (%s): %s", plan.Service, vs.VSKey, vs.Kind, fmt.Sprintf(format, args...))
	}
	nodeAddrs := w.nodeAddrs()
	// Every endpoint address of a slice of its family, and what some copy
	// of it is: a real server must be one of them.
	type endpointInfo struct{ ready, usable, draining, onNode bool }
	endpoints := map[netip.Addr]endpointInfo{}
	for _, s := range w.slices {
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			a := fuzzParseAddr(e.Addresses[0])
			if !(a.Is4() && s.AddressType == discoveryv1.AddressTypeIPv4) && !(a.Is6() && s.AddressType == discoveryv1.AddressTypeIPv6) {
				continue
			}
			c := e.Conditions
			ready, serving, terminating := c.Ready == nil || *c.Ready, c.Serving == nil || *c.Serving, c.Terminating != nil && *c.Terminating
			info := endpoints[a]
			info.ready = info.ready || ready
			info.usable = info.usable || ready || (serving && terminating)
			info.draining = info.draining || (serving && terminating)
			info.onNode = info.onNode || (w.node.Name != "" && e.NodeName != nil && *e.NodeName == w.node.Name)
			endpoints[a] = info
		}
	}
	// The Service's families (a superset: from ipFamilies and every
	// cluster IP that looks like an address).
	families := map[bool]bool{} // by Is4
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			families[true] = true
		case corev1.IPv6Protocol:
			families[false] = true
		}
	}
	for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		if a := fuzzParseAddr(ip); a.IsValid() {
			families[a.Is4()] = true
		}
	}
	localAddrs := map[netip.Addr]bool{}
	def := w.cfg.Scheduler.Name
	if def == "" {
		def = scheduler.Default
	}
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer

	for i, vs := range plan.VirtualServers {
		if i > 0 && plan.VirtualServers[i-1].VSKey.Compare(vs.VSKey) >= 0 {
			fail(vs, "not sorted after %s, or a duplicate", plan.VirtualServers[i-1].VSKey)
		}
		a := vs.Address
		switch {
		case vs.Kind.Bound() && !fuzzUnicast(a):
			fail(vs, "a bound address that is not a plain unicast address")
		case vs.Kind == model.KindNodePort && (!nodeAddrs[a] || !nodePorts):
			fail(vs, "a node port on %s, not a node-port address %v of a NodePort or LoadBalancer Service (%q)", a, w.node.NodePortAddresses, svc.Spec.Type)
		case !stdslices.Contains([]model.AddressKind{model.KindClusterIP, model.KindNodePort, model.KindExternalIP, model.KindLoadBalancer}, vs.Kind):
			fail(vs, "unknown kind")
		case (w.cfg.IPv4 || w.cfg.IPv6) && ((a.Is4() && !w.cfg.IPv4) || (a.Is6() && !w.cfg.IPv6)):
			fail(vs, "an address of a family the node does not serve (IPv4 %v, IPv6 %v)", w.cfg.IPv4, w.cfg.IPv6)
		case vs.Port == 0 || !stdslices.Contains([]ktypes.Protocol{ktypes.TCP, ktypes.UDP, ktypes.SCTP}, vs.Protocol):
			fail(vs, "port 0 or an unknown protocol")
		case scheduler.Validate(vs.Scheduler) != nil || (vs.Scheduler != def && w.cfg.Unavailable[vs.Scheduler]):
			fail(vs, "scheduler %q is unknown or unavailable", vs.Scheduler)
		case vs.Flags&^(ktypes.FlagPersistent|ktypes.FlagSched1|ktypes.FlagSched2|ktypes.FlagSched3) != 0:
			fail(vs, "flags %#x", vs.Flags)
		case (vs.Flags&ktypes.FlagPersistent != 0) != (vs.Timeout >= 1 && vs.Timeout <= 86400):
			fail(vs, "flags %#x with timeout %d", vs.Flags, vs.Timeout)
		case vs.InClusterOnly && !(vs.Local && vs.Kind.External()):
			fail(vs, "in-cluster only, but not external under a Local policy")
		case len(vs.SourceRanges) > 0 && vs.Kind != model.KindLoadBalancer:
			fail(vs, "source ranges on a %s", vs.Kind)
		case !families[a.Is4()]:
			fail(vs, "an address of a family the Service does not have")
		}
		for j, rs := range vs.RealServers {
			switch {
			case j > 0 && vs.RealServers[j-1].RSKey.Compare(rs.RSKey) >= 0:
				fail(vs, "real server %s not sorted after %s, or a duplicate", rs, vs.RealServers[j-1])
			case !fuzzUnicast(rs.Address) || rs.Address.Is4() != a.Is4():
				fail(vs, "real server %s is not a plain unicast address of the virtual server's family", rs)
			case rs.Port == 0 || (rs.Weight != 0 && rs.Weight != 1):
				fail(vs, "real server %s: port 0 or a weight other than 0 and 1", rs)
			}
			info, ok := endpoints[rs.Address]
			switch {
			case !ok:
				fail(vs, "real server %s is no endpoint of a slice of its family", rs)
			case rs.Weight == 1 && !info.usable:
				fail(vs, "real server %s serves but its endpoint is neither ready nor serving and terminating", rs)
			case rs.Drain && (rs.Weight != 0 || info.usable):
				fail(vs, "real server %s is marked drain but its weight is not 0 or its endpoint is ready or serving and terminating", rs)
			case rs.Weight == 0 && !rs.Drain && !info.draining:
				fail(vs, "real server %s drains but its endpoint is not serving and terminating", rs)
			case vs.Local && !vs.InClusterOnly && !info.onNode:
				fail(vs, "real server %s of a Local traffic policy is not on node %q", rs, w.node.Name)
			case vs.InClusterOnly && rs.Weight == 1 && info.onNode:
				fail(vs, "real server %s serves in-cluster clients only, yet its endpoint is local", rs)
			}
			if vs.Local && !vs.InClusterOnly && vs.Kind.External() && rs.Weight == 1 && info.ready {
				localAddrs[rs.Address] = true
			}
		}
	}
	// At most: an address with a ready copy on another port may serve
	// this one only through the serving-terminating fallback.
	if plan.LocalEndpoints > len(localAddrs) {
		t.Fatalf("LocalEndpoints %d, but only %d ready endpoint addresses serve external traffic with a Local policy", plan.LocalEndpoints, len(localAddrs))
	}
	if plan.HealthCheckNodePort != 0 && svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Fatalf("health check node port %d without externalTrafficPolicy Local", plan.HealthCheckNodePort)
	}
	for i, w := range plan.Warnings {
		if stdslices.Contains(plan.Warnings[:i], w) {
			t.Fatalf("warning %q twice", w)
		}
	}
}

// checkFuzzAssign checks Assign and a diff against an empty kernel: one
// holder per virtual server, the older Service's, a conflict for each
// loser, every virtual server on an address that is bound or the node's,
// and a diff that binds and adds exactly what was assigned.
func checkFuzzAssign(t *testing.T, w *fuzzWorld, plans []*model.ServicePlan) {
	t.Helper()
	own := model.Ownership{Interface: "ipvs-proxy0", NodePortRange: model.PortRange{Min: 30000, Max: 32767}, ExcludeCIDRs: w.exclude}
	d, conflicts := model.Assign(plans, own)

	nodeAddrs := w.nodeAddrs()
	wanters := map[ktypes.VSKey][]*model.ServicePlan{}
	bound := map[netip.Addr]bool{}
	for _, p := range plans {
		for _, vs := range p.VirtualServers {
			wanters[vs.VSKey] = append(wanters[vs.VSKey], p)
			if vs.Kind.Bound() {
				bound[vs.Address] = true
			}
		}
	}
	if !maps.Equal(bound, d.Addresses) {
		t.Fatalf("bound addresses %v, want those of the bound kinds %v", d.Addresses, bound)
	}
	var wantConflicts []model.Conflict
	for key, ps := range wanters {
		held, ok := d.VirtualServers[key]
		if !ok {
			t.Fatalf("%s is wanted by %d Services but held by none", key, len(ps))
		}
		holder := ps[0]
		for _, p := range ps[1:] {
			if model.Precedes(p, holder) {
				holder = p
			}
		}
		if held.Service != holder.Service {
			t.Fatalf("%s is held by %s, want the older %s", key, held.Service, holder.Service)
		}
		i := stdslices.IndexFunc(holder.VirtualServers, func(v model.VSPlan) bool { return v.VSKey == key })
		if !cmp.Equal(held.VSPlan, holder.VirtualServers[i], planCmp...) {
			t.Fatalf("%s: held %+v, the holder's plan says %+v", key, held.VSPlan, holder.VirtualServers[i])
		}
		if !(held.Kind.Bound() && d.Addresses[key.Address]) && !(held.Kind == model.KindNodePort && nodeAddrs[key.Address]) {
			t.Fatalf("%s (%s) is on an address neither bound nor the node's", key, held.Kind)
		}
		if !own.Owns(key, d.Addresses[key.Address], true) && held.Kind.Bound() {
			t.Fatalf("%s: a bound virtual server the ownership rule does not cover", key)
		}
		for _, p := range ps {
			if p != holder {
				wantConflicts = append(wantConflicts, model.Conflict{VirtualServer: key, Holder: holder.Service, Loser: p.Service})
			}
		}
	}
	if len(d.VirtualServers) != len(wanters) {
		t.Fatalf("%d virtual servers held, %d wanted", len(d.VirtualServers), len(wanters))
	}
	stdslices.SortFunc(wantConflicts, func(a, b model.Conflict) int {
		if c := a.VirtualServer.Compare(b.VirtualServer); c != 0 {
			return c
		}
		return strings.Compare(a.Loser.String(), b.Loser.String())
	})
	if diff := cmp.Diff(wantConflicts, conflicts, planCmp...); diff != "" {
		t.Fatalf("conflicts (-want +got):\n%s", diff)
	}

	// Against an empty kernel: bind every address, then add each virtual
	// server with its real servers, in key order.
	var want []ktypes.Op
	addrs := make([]netip.Addr, 0, len(d.Addresses))
	for a := range d.Addresses {
		addrs = append(addrs, a)
	}
	stdslices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		want = append(want, ktypes.Op{Kind: ktypes.OpBind, Address: a})
	}
	keys := make([]ktypes.VSKey, 0, len(d.VirtualServers))
	for k := range d.VirtualServers {
		keys = append(keys, k)
	}
	stdslices.SortFunc(keys, ktypes.VSKey.Compare)
	for _, k := range keys {
		h := d.VirtualServers[k]
		want = append(want, ktypes.Op{Kind: ktypes.OpAddVirtualServer, Service: h.Service, VirtualServer: h.VirtualServer})
		for _, rs := range h.RealServers {
			if rs.Drain {
				continue // never added
			}
			want = append(want, ktypes.Op{Kind: ktypes.OpAddRealServer, Service: h.Service, VirtualServer: h.VirtualServer, RealServer: rs})
		}
	}
	ops := model.Diff(d, model.NewKernel(nil, nil), model.Scope{All: true})
	if diff := cmp.Diff(want, ops, planCmp...); diff != "" {
		t.Fatalf("diff against an empty kernel (-want +got):\n%s", diff)
	}
}
