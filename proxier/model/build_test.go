package model_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model/modeltest"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// ---- Service constructors ----

type svcOpt func(*corev1.Service)

// svc is ns/web, a ClusterIP Service on 10.96.0.10 with port "http" 80/TCP
// targeting 8080, changed by opts.
func svc(opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Selector:   map[string]string{"app": "web"},
			Ports:      []corev1.ServicePort{port("http", "TCP", 80, 0)},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// port is a Service port targeting port+8000 (80 -> 8080) unless changed.
func port(name string, proto corev1.Protocol, p, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: p, NodePort: nodePort, TargetPort: intstr.FromInt32(p + 8000)}
}

func ports(ps ...corev1.ServicePort) svcOpt { return func(s *corev1.Service) { s.Spec.Ports = ps } }

func typ(t corev1.ServiceType) svcOpt { return func(s *corev1.Service) { s.Spec.Type = t } }

// clusterIPs sets clusterIP, clusterIPs and ipFamilies.
func clusterIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = ips[0], ips, nil
		for _, ip := range ips {
			f := corev1.IPv4Protocol
			if strings.Contains(ip, ":") {
				f = corev1.IPv6Protocol
			}
			s.Spec.IPFamilies = append(s.Spec.IPFamilies, f)
		}
	}
}

func externalIPs(ips ...string) svcOpt { return func(s *corev1.Service) { s.Spec.ExternalIPs = ips } }

func ingress(ings ...corev1.LoadBalancerIngress) svcOpt {
	return func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = ings }
}

func lbIP(ip string) corev1.LoadBalancerIngress { return corev1.LoadBalancerIngress{IP: ip} }

func lbIPMode(ip string, mode corev1.LoadBalancerIPMode) corev1.LoadBalancerIngress {
	return corev1.LoadBalancerIngress{IP: ip, IPMode: &mode}
}

func etpLocal(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

func itpLocal(s *corev1.Service) {
	p := corev1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &p
}

// affinity sets ClientIP session affinity; timeout 0 leaves it unset.
func affinity(timeout int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		if timeout != 0 {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
		}
	}
}

func distribution(d string) svcOpt {
	return func(s *corev1.Service) { s.Spec.TrafficDistribution = &d }
}

func annotate(kv ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Annotations = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func noSelector(s *corev1.Service) { s.Spec.Selector = nil }

// ---- EndpointSlice constructors ----

func slice(name string, at discoveryv1.AddressType, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: at, Ports: ps, Endpoints: eps,
	}
}

func slice4(name string, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return slice(name, discoveryv1.AddressTypeIPv4, ps, eps...)
}

func slice6(name string, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return slice(name, discoveryv1.AddressTypeIPv6, ps, eps...)
}

func slices(ss ...*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice { return ss }

func sports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

// sp is a slice port as the EndpointSlice controller writes it.
func sp(name string, proto corev1.Protocol, p int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &p}
}

// http8080 is the slice port of the default Service port.
var http8080 = sports(sp("http", "TCP", 8080))

type epOpt func(*discoveryv1.Endpoint)

// ep is a ready endpoint with no node or zone unless changed.
func ep(addr string, opts ...epOpt) discoveryv1.Endpoint {
	t := true
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t}}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func on(node string) epOpt { return func(e *discoveryv1.Endpoint) { e.NodeName = &node } }

func zone(z string) epOpt { return func(e *discoveryv1.Endpoint) { e.Zone = &z } }

func conds(ready, serving, terminating *bool) epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	}
}

var (
	yes, no     = new(true), new(false)
	notReady    = conds(no, no, no)
	terminating = conds(no, yes, yes)  // serving and terminating
	dying       = conds(no, no, yes)   // terminating, not serving
	nilReady    = conds(nil, nil, nil) // all conditions unset
	readyButTrm = conds(yes, yes, yes) // ready wins over terminating
)

func forZones(zs ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zs {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func forNodes(ns ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range ns {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// ---- expected plans ----

// vs is an expected virtual server "addr:port" with the default scheduler
// and real servers "addr:port", weight 1, "addr:port@0", weight 0
// (draining), or "addr:port@d", weight 0 marked Drain (not serving: kept
// only while the kernel counts connections on it).
func vs(kind model.AddressKind, addrPort string, proto ktypes.Protocol, portName string, rss ...string) model.VSPlan {
	v := modeltest.VS(kind, addrPort, "rr", rss...)
	v.Protocol, v.PortName = proto, portName
	return v
}

// sched sets the scheduler, flags and timeout of expected virtual servers.
func sched(name string, flags, timeout uint32, vss ...model.VSPlan) []model.VSPlan {
	for i := range vss {
		vss[i].Scheduler, vss[i].Flags, vss[i].Timeout = name, flags, timeout
	}
	return vss
}

func vss(vs ...model.VSPlan) []model.VSPlan { return vs }

// local marks an expected virtual server as restricted to local endpoints
// by a Local traffic policy.
func local(v model.VSPlan) model.VSPlan {
	v.Local = true
	return v
}

// onNode marks an expected virtual server as one on the node's own
// address (not bound, not protected).
func onNode(v model.VSPlan) model.VSPlan {
	v.NodeAddress = true
	return v
}

// inCluster marks an expected virtual server of a Local
// externalTrafficPolicy as serving in-cluster clients only, from every
// endpoint (the node has no usable endpoint of its own).
func inCluster(v model.VSPlan) model.VSPlan {
	v.Local, v.InClusterOnly = true, true
	return v
}

// ranges sets the expected loadBalancerSourceRanges of a virtual server.
func ranges(v model.VSPlan, cidrs ...string) model.VSPlan {
	for _, c := range cidrs {
		v.SourceRanges = append(v.SourceRanges, netip.MustParsePrefix(c))
	}
	return v
}

func warns(ws ...string) []string { return ws }

const (
	ci  = model.KindClusterIP
	np  = model.KindNodePort
	eip = model.KindExternalIP
	lb  = model.KindLoadBalancer
	tcp = ktypes.TCP
	udp = ktypes.UDP
)

var testNode = model.NodeInfo{
	Name: "node-a", Zone: "zone-a",
	NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")},
	// Every address of the node: 192.168.2.20 serves no node port
	// (outside --nodeport-addresses) but is the node's all the same.
	Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.2.20"), netip.MustParseAddr("2001:db8::10")},
}

var testCfg = model.BuildConfig{Scheduler: scheduler.Spec{Name: "rr"}}

var planCmp = []cmp.Option{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
	// Compare virtual servers exactly, not with their lenient Equal method.
	cmp.Comparer(func(a, b ktypes.VirtualServer) bool { return a == b }),
}

func TestBuild(t *testing.T) {
	unknownSched := fmt.Sprintf("annotation %s: %v; using the default %q",
		scheduler.AnnotationScheduler, scheduler.Validate("fastest"), "rr")
	// Endpoints in two zones on three nodes, for topology cases.
	spread := slices(slice4("web-1", http8080,
		ep("10.1.0.1", on("node-a"), zone("zone-a")),
		ep("10.1.0.2", on("node-b"), zone("zone-a")),
		ep("10.1.0.3", on("node-c"), zone("zone-b")),
	))

	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		node   *model.NodeInfo    // testNode if nil
		cfg    *model.BuildConfig // testCfg if nil
		want   []model.VSPlan
		warns  []string
		// localEndpoints and healthCheck are the plan's LocalEndpoints
		// and HealthCheckNodePort.
		localEndpoints int
		healthCheck    uint16
		// nodeEndpoints is the plan's NodeEndpoints (this node's real
		// servers, which the glue masquerades when balanced to themselves).
		nodeEndpoints []netip.Addr
	}{
		// ---- addresses and ports ----
		{
			name:   "cluster IP, endpoints sorted",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.2"), ep("10.1.0.10"), ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.10:8080")),
		},
		{
			name: "dual-stack: each family gets its own slice's endpoints",
			svc:  svc(clusterIPs("fd00::10", "10.96.0.10")),
			slices: slices(
				slice6("web-6", http8080, ep("fd01::1")),
				slice4("web-4", http8080, ep("10.1.0.1")),
			),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				vs(ci, "[fd00::10]:80", tcp, "http", "[fd01::1]:8080"),
			),
		},
		{
			name:   "IPv6 slice is not used by an IPv4 Service",
			svc:    svc(),
			slices: slices(slice6("web-6", http8080, ep("fd01::1")), slice4("web-4", http8080, ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
		},
		{
			name: "multi-port TCP, UDP, SCTP; slice ports matched by name and protocol",
			svc:  svc(ports(port("http", "TCP", 80, 0), port("dns", "UDP", 53, 0), port("sig", "SCTP", 3868, 0))),
			slices: slices(slice4("web-1",
				sports(sp("dns", "TCP", 9999), sp("dns", "UDP", 5353), sp("http", "TCP", 8080), sp("sig", "SCTP", 3869)),
				ep("10.1.0.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"), // TCP (6) < UDP (17) < SCTP (132)
				vs(ci, "10.96.0.10:53", udp, "dns", "10.1.0.1:5353"),
				vs(ci, "10.96.0.10:3868", ktypes.SCTP, "sig", "10.1.0.1:3869"),
			),
		},
		{
			name: "named targetPort resolves through the slice port of the Service port's name",
			svc: svc(func(s *corev1.Service) {
				s.Spec.Ports[0].TargetPort = intstr.FromString("web")
			}),
			slices: slices(slice4("web-1", sports(sp("http", "TCP", 8443)), ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8443")),
		},
		{
			name:   "single unnamed port matches the unnamed slice port",
			svc:    svc(ports(port("", "TCP", 80, 0))),
			slices: slices(slice4("web-1", sports(sp("", "TCP", 8080)), ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "", "10.1.0.1:8080")),
		},
		{
			name: "selector-less Service with hand-made slices (nil port name and protocol)",
			svc:  svc(noSelector, ports(port("", "", 5432, 0))),
			slices: slices(
				slice4("db-manual", sports(discoveryv1.EndpointPort{Port: new(int32(5432))}), ep("192.0.2.7", nilReady)),
				slice4("db-extra", sports(discoveryv1.EndpointPort{Port: new(int32(5433))}), ep("192.0.2.8", nilReady)),
			),
			want: vss(vs(ci, "10.96.0.10:5432", tcp, "", "192.0.2.7:5432", "192.0.2.8:5433")),
		},
		{
			name:   "NodePort on the node addresses of the Service's family",
			svc:    svc(typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080"),
			),
		},
		{
			name: "dual-stack NodePort on both node addresses",
			svc: svc(typ(corev1.ServiceTypeNodePort), clusterIPs("10.96.0.10", "fd00::10"),
				ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-4", http8080, ep("10.1.0.1")), slice6("web-6", http8080, ep("fd01::1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080"),
				vs(np, "[2001:db8::10]:30080", tcp, "http", "[fd01::1]:8080"),
				vs(ci, "[fd00::10]:80", tcp, "http", "[fd01::1]:8080"),
			),
		},
		{
			name:   "nodePort on a ClusterIP Service is ignored",
			svc:    svc(ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
		},
		{
			name:   "external IPs; one of a family the Service lacks",
			svc:    svc(externalIPs("203.0.113.5", "2001:db8:ff::5")),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				vs(eip, "203.0.113.5:80", tcp, "http", "10.1.0.1:8080"),
			),
			warns: warns(`externalIP "2001:db8:ff::5": the Service has no IPv6 cluster IP`),
		},
		{
			name: "LoadBalancer: VIP ingress IPs, ipMode Proxy and hostnames skipped",
			svc: svc(typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)), ingress(
				lbIP("198.51.100.1"),
				lbIPMode("198.51.100.2", corev1.LoadBalancerIPModeProxy),
				lbIPMode("198.51.100.3", corev1.LoadBalancerIPModeVIP),
				corev1.LoadBalancerIngress{Hostname: "lb.example.com"},
			)),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080"),
				vs(lb, "198.51.100.1:80", tcp, "http", "10.1.0.1:8080"),
				vs(lb, "198.51.100.3:80", tcp, "http", "10.1.0.1:8080"),
			),
		},
		{
			name: "LoadBalancer without node ports",
			svc:  svc(typ(corev1.ServiceTypeLoadBalancer), ingress(lbIP("198.51.100.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http"),
				vs(lb, "198.51.100.1:80", tcp, "http"),
			),
		},
		{
			name: "address both external IP and LB ingress: first kept, warning",
			svc:  svc(typ(corev1.ServiceTypeLoadBalancer), externalIPs("198.51.100.1"), ingress(lbIP("198.51.100.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http"),
				vs(eip, "198.51.100.1:80", tcp, "http"),
			),
			warns: warns(`virtual server 198.51.100.1:80/TCP is claimed twice (ExternalIP of port "http", LoadBalancer of port "http"); keeping the first`),
		},
		{
			name: "headless Service: empty plan",
			svc:  svc(clusterIPs("None")),
		},
		{
			name: "ExternalName Service: empty plan",
			svc:  svc(typ(corev1.ServiceTypeExternalName), clusterIPs("10.96.0.10")),
		},
		{
			name: "IPv4-only node: dual-stack Service gets IPv4 only",
			svc:  svc(clusterIPs("10.96.0.10", "fd00::10")),
			cfg:  &model.BuildConfig{Scheduler: scheduler.Spec{Name: "rr"}, IPv4: true},
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http")),
		},

		// ---- endpoints: merging and conditions ----
		{
			name: "two slices merged, duplicates once (ready copy wins)",
			svc:  svc(),
			slices: slices(
				slice4("web-b", http8080, ep("10.1.0.2"), ep("10.1.0.3")),
				slice4("web-a", http8080, ep("10.1.0.1"), ep("10.1.0.2", terminating), ep("10.1.0.1")),
			),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},
		{
			name:   "several addresses: first used",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, discoveryv1.Endpoint{Addresses: []string{"10.1.0.1", "10.1.0.99"}})),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
		},
		{
			name: "ready endpoints only when some are ready",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1"), ep("10.1.0.2", notReady), ep("10.1.0.3", terminating), ep("10.1.0.4", readyButTrm), ep("10.1.0.5", dying))),
			// 10.1.0.3 drains: weight 0 keeps its connections, takes no new
			// ones. 10.1.0.2 and 10.1.0.5 do not serve: weight 0, kept only
			// while busy.
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080@d", "10.1.0.3:8080@0",
				"10.1.0.4:8080", "10.1.0.5:8080@d")),
		},
		{
			name:   "nil ready means ready",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", nilReady), ep("10.1.0.2", terminating))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080@0")),
		},
		{
			name: "none ready: serving-terminating endpoints",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", notReady), ep("10.1.0.2", terminating), ep("10.1.0.3", dying))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080@d", "10.1.0.2:8080", "10.1.0.3:8080@d")),
		},
		{
			name:   "none usable: virtual server with no serving real server",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", notReady), ep("10.1.0.3", dying))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080@d", "10.1.0.3:8080@d")),
		},
		{
			// Not serving: failing readiness (serving false, terminating
			// unset), terminating and not serving, and not ready though
			// serving (no state the API gives a live pod).
			name: "not-serving endpoints of every kind are marked drain",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1"), ep("10.1.0.2", conds(no, no, nil)), ep("10.1.0.3", dying), ep("10.1.0.4", conds(no, yes, no)))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080@d", "10.1.0.3:8080@d", "10.1.0.4:8080@d")),
		},
		{
			name: "no slices at all",
			svc:  svc(),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http")),
		},

		// ---- session affinity and scheduler ----
		{
			name: "ClientIP affinity, default timeout",
			svc:  svc(affinity(0)),
			want: sched("rr", ktypes.FlagPersistent, 10800, vs(ci, "10.96.0.10:80", tcp, "http")),
		},
		{
			name: "ClientIP affinity, custom timeout",
			svc:  svc(affinity(600)),
			want: sched("rr", ktypes.FlagPersistent, 600, vs(ci, "10.96.0.10:80", tcp, "http")),
		},
		{
			name:  "ClientIP affinity, out-of-range timeout",
			svc:   svc(affinity(-5)),
			want:  sched("rr", ktypes.FlagPersistent, 10800, vs(ci, "10.96.0.10:80", tcp, "http")),
			warns: warns("sessionAffinityConfig.clientIP.timeoutSeconds -5 is out of range (1-86400); using 10800"),
		},
		{
			name: "scheduler annotation sh with flags, plus affinity",
			svc: svc(affinity(60), annotate(scheduler.AnnotationScheduler, "sh",
				scheduler.AnnotationFlags, "sh-fallback,sh-port")),
			want: sched("sh", ktypes.FlagSched1|ktypes.FlagSched2|ktypes.FlagPersistent, 60,
				vs(ci, "10.96.0.10:80", tcp, "http")),
		},
		{
			name:  "unknown scheduler: default and warning",
			svc:   svc(annotate(scheduler.AnnotationScheduler, "fastest")),
			want:  vss(vs(ci, "10.96.0.10:80", tcp, "http")),
			warns: warns(unknownSched),
		},
		{
			name: "default scheduler and flags from the configuration",
			svc:  svc(),
			cfg:  &model.BuildConfig{Scheduler: scheduler.Spec{Name: "mh", Flags: ktypes.FlagSched2}},
			want: sched("mh", ktypes.FlagSched2, 0, vs(ci, "10.96.0.10:80", tcp, "http")),
		},

		{
			// An operator's externalIP or a controller's ingress IP that is
			// one of the node's addresses: programmed, but never bound to
			// the proxy's interface nor protected (the node's other ports
			// on that address must keep working).
			name: "externalIP and load balancer IP equal to node addresses",
			svc: svc(typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)),
				externalIPs("192.168.1.10", "203.0.113.5"), ingress(lbIP("192.168.2.20"))),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"),
				onNode(vs(eip, "192.168.1.10:80", tcp, "http", "10.1.0.1:8080")),
				vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080"),
				onNode(vs(lb, "192.168.2.20:80", tcp, "http", "10.1.0.1:8080")),
				vs(eip, "203.0.113.5:80", tcp, "http", "10.1.0.1:8080"),
			),
		},

		// ---- traffic policies ----
		{
			name:          "externalTrafficPolicy Local: external kinds use local endpoints, cluster IP all",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.3")},
			svc: svc(etpLocal, typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)),
				externalIPs("203.0.113.5"), ingress(lbIP("198.51.100.1"))),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a")), ep("10.1.0.2", on("node-b")), ep("10.1.0.3", on("node-a"), notReady),
				ep("10.1.0.4", on("node-b"), dying))),
			// Not-serving endpoints are marked drain where they would have
			// served: everywhere on the cluster IP, on this node's own
			// endpoints on the Local virtual servers.
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080@d", "10.1.0.4:8080@d"),
				local(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080", "10.1.0.3:8080@d")),
				local(vs(lb, "198.51.100.1:80", tcp, "http", "10.1.0.1:8080", "10.1.0.3:8080@d")),
				local(vs(eip, "203.0.113.5:80", tcp, "http", "10.1.0.1:8080", "10.1.0.3:8080@d")),
			),
			localEndpoints: 1,
		},
		{
			// In-cluster clients (pods, the node) of the external addresses
			// are served by every endpoint, as by kube-proxy; the glue
			// drops traffic from outside the cluster. The health check
			// counts no local endpoint.
			name:          "externalTrafficPolicy Local without local endpoints: external kinds serve in-cluster clients from all",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.4")},
			svc: svc(etpLocal, typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)),
				externalIPs("203.0.113.5"), ingress(lbIP("198.51.100.1")), func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.2", on("node-b")), ep("10.1.0.3", on("node-c"), terminating), ep("10.1.0.4", on("node-a"), notReady))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.2:8080", "10.1.0.3:8080@0", "10.1.0.4:8080@d"),
				inCluster(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.2:8080", "10.1.0.3:8080@0", "10.1.0.4:8080@d")),
				inCluster(vs(lb, "198.51.100.1:80", tcp, "http", "10.1.0.2:8080", "10.1.0.3:8080@0", "10.1.0.4:8080@d")),
				inCluster(vs(eip, "203.0.113.5:80", tcp, "http", "10.1.0.2:8080", "10.1.0.3:8080@0", "10.1.0.4:8080@d")),
			),
			healthCheck: 32000,
		},
		{
			name:          "externalTrafficPolicy Local without any endpoint: in-cluster only, empty",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.4")},
			svc:           svc(etpLocal, typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
			slices:        slices(slice4("web-1", http8080, ep("10.1.0.4", on("node-a"), notReady))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.4:8080@d"),
				inCluster(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.4:8080@d")),
			),
		},
		{
			// The fallback still routes to the serving-terminating
			// endpoint, but the health check counts ready endpoints only
			// (as kube-proxy), so that load balancers drain the node.
			name:          "externalTrafficPolicy Local: local serving-terminating when no local ready; not counted for the health check",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(etpLocal, typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a"), terminating), ep("10.1.0.2", on("node-b")))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080@0", "10.1.0.2:8080"),
				local(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080")),
			),
			localEndpoints: 0,
		},
		{
			name:          "externalTrafficPolicy Local: a local terminating endpoint drains beside a local ready one",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.3")},
			svc:           svc(etpLocal, typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a"), terminating), ep("10.1.0.2", on("node-b")), ep("10.1.0.3", on("node-a")),
				ep("10.1.0.4", on("node-b"), terminating))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080@0", "10.1.0.2:8080", "10.1.0.3:8080", "10.1.0.4:8080@0"),
				local(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080@0", "10.1.0.3:8080")),
			),
			localEndpoints: 1,
		},
		{
			name: "topology: a terminating endpoint outside the zone drains too",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2", forZones("zone-b")), ep("10.1.0.3", forZones("zone-b"), terminating))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.3:8080@0")),
		},
		{
			name:          "internalTrafficPolicy Local: cluster IP local only, external IP all",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(itpLocal, externalIPs("203.0.113.5")),
			slices:        slices(slice4("web-1", http8080, ep("10.1.0.1", on("node-a")), ep("10.1.0.2", on("node-b")))),
			want: vss(
				local(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
				vs(eip, "203.0.113.5:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080"),
			),
		},
		{
			name:   "internalTrafficPolicy Local without local endpoints",
			svc:    svc(itpLocal),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.2", on("node-b")))),
			want:   vss(local(vs(ci, "10.96.0.10:80", tcp, "http"))),
		},

		// ---- topology ----
		{
			name: "zone hints: endpoints hinted for this node's zone",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2", forZones("zone-b")), ep("10.1.0.3", forZones("zone-b", "zone-a")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.3:8080")),
		},
		{
			name: "node hints win over zone hints",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", forNodes("node-b"), forZones("zone-a")), ep("10.1.0.2", forNodes("node-a"), forZones("zone-b")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.2:8080")),
		},
		{
			// No endpoint is ready anywhere: the fallback to the serving
			// terminating ones is the last resort, and like kube-proxy it
			// takes every one of them, whatever the hints say.
			name: "hints ignored for the serving-terminating fallback",
			svc:  svc(),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", forZones("zone-a"), terminating), ep("10.1.0.2", forZones("zone-b"), terminating),
				ep("10.1.0.3", forNodes("node-b"), forZones("zone-b"), terminating))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},
		{
			name:   "hints ignored when some endpoint has none",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080")),
		},
		{
			name:   "hints ignored when none is for this node or zone",
			svc:    svc(),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", forZones("zone-b")), ep("10.1.0.2", forZones("zone-c")))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080")),
		},
		{
			name:          "hints do not apply with externalTrafficPolicy Local",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(etpLocal, typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a"), forZones("zone-b")), ep("10.1.0.2", on("node-b"), forZones("zone-a")))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.2:8080"),
				local(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080")),
			),
			localEndpoints: 1,
		},
		{
			name:          "loadBalancerSourceRanges on load balancer IPs only; health check node port",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")},
			svc: svc(etpLocal, typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)),
				ingress(lbIP("198.51.100.1")), func(s *corev1.Service) {
					s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", " 10.20.0.1/16", "bogus"}
					s.Spec.HealthCheckNodePort = 32000
				}),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", on("node-a")), ep("10.1.0.2", on("node-a")))),
			want: vss(
				vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080"),
				local(vs(np, "192.168.1.10:30080", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080")),
				local(ranges(vs(lb, "198.51.100.1:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080"), "192.0.2.0/24", "10.20.0.0/16")),
			),
			warns:          warns(`loadBalancerSourceRanges "bogus" is not a CIDR; ignored`),
			localEndpoints: 2,
			healthCheck:    32000,
		},
		// trafficDistribution acts through the hints the EndpointSlice
		// controller sets, never through the endpoints' own node or zone.
		{
			name:          "trafficDistribution PreferSameNode without hints (hand-made slice): all endpoints",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(distribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:        spread,
			want:          vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},
		{
			name:          "trafficDistribution PreferClose without hints: all endpoints",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(distribution(corev1.ServiceTrafficDistributionPreferClose)),
			slices:        spread,
			want:          vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},
		{
			name:          "trafficDistribution PreferSameNode with node hints: the ones hinted for this node",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(distribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a"), zone("zone-a"), forNodes("node-a"), forZones("zone-a")),
				ep("10.1.0.2", on("node-b"), zone("zone-a"), forNodes("node-b"), forZones("zone-a")),
				ep("10.1.0.3", on("node-c"), zone("zone-b"), forNodes("node-c"), forZones("zone-b")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
		},
		{
			name: "node hints, none for this node: the zone hints",
			svc:  svc(distribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.2", on("node-b"), zone("zone-a"), forNodes("node-b"), forZones("zone-a")),
				ep("10.1.0.3", on("node-c"), zone("zone-b"), forNodes("node-c"), forZones("zone-b")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.2:8080")),
		},
		{
			name:          "zone hints for another zone only: all endpoints, even with one in this zone",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(distribution(corev1.ServiceTrafficDistributionPreferClose)),
			slices: slices(slice4("web-1", http8080,
				ep("10.1.0.1", on("node-a"), zone("zone-a"), forZones("zone-b")),
				ep("10.1.0.2", on("node-b"), zone("zone-b"), forZones("zone-b")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080")),
		},
		{
			name:          "some hinted, some not (a controller catching up): all endpoints",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(distribution(corev1.ServiceTrafficDistributionPreferClose)),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1", on("node-a"), zone("zone-a"), forZones("zone-a"))),
				slice4("web-2", http8080, ep("10.1.0.2", on("node-b"), zone("zone-a")), ep("10.1.0.3", on("node-c"), zone("zone-b")))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},
		{
			name:          "no trafficDistribution: all endpoints",
			nodeEndpoints: []netip.Addr{netip.MustParseAddr("10.1.0.1")},
			svc:           svc(),
			slices:        spread,
			want:          vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080")),
		},

		// ---- malformed input ----
		{
			name:   "invalid cluster IP: warning, the other family still built",
			svc:    svc(clusterIPs("10.96.0.300", "fd00::10")),
			slices: slices(slice6("web-6", http8080, ep("fd01::1"))),
			want:   vss(vs(ci, "[fd00::10]:80", tcp, "http", "[fd01::1]:8080")),
			warns:  warns(`clusterIP "10.96.0.300" is not a valid IP address`),
		},
		{
			name:  "invalid external IP: warning",
			svc:   svc(externalIPs("not-an-ip", "203.0.113.5")),
			want:  vss(vs(ci, "10.96.0.10:80", tcp, "http"), vs(eip, "203.0.113.5:80", tcp, "http")),
			warns: warns(`externalIP "not-an-ip" is not a valid IP address`),
		},
		{
			name: "invalid LB ingress IP and unknown ipMode: warnings",
			svc: svc(typ(corev1.ServiceTypeLoadBalancer),
				ingress(lbIP("198.51.100.300"), lbIPMode("198.51.100.4", "Tunnel"))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http")),
			warns: warns(`loadBalancer ingress "198.51.100.300" is not a valid IP address`,
				`loadBalancer ingress "198.51.100.4": unknown ipMode "Tunnel"; skipped`),
		},
		{
			name: "legacy IPv4 with leading zeros is read as decimal",
			svc:  svc(clusterIPs("010.096.000.010")),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http")),
		},
		{
			name:   "unsupported protocol: warning, other ports built",
			svc:    svc(ports(port("ping", "ICMP", 7, 0), port("http", "TCP", 80, 0))),
			slices: slices(slice4("web-1", http8080, ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080")),
			warns:  warns(`port "ping": protocol "ICMP" is not supported`),
		},
		{
			name: "bad slice data: warnings, the rest used",
			svc:  svc(),
			slices: slices(
				nil,
				slice("web-fqdn", discoveryv1.AddressTypeFQDN, http8080, ep("web.example.com")),
				slice("web-odd", "IPv5", http8080, ep("10.1.0.9")),
				slice4("web-1", sports(sp("http", "TCP", 8080), discoveryv1.EndpointPort{Name: new("http")}),
					ep("10.1.0.1"),
					ep("bogus"),
					ep("fd01::1"),
					discoveryv1.Endpoint{},
					ep("10.1.0.2", func(e *discoveryv1.Endpoint) { e.Hints = &discoveryv1.EndpointHints{} }),
					ep("010.001.000.003"), // an old API server's form, read as decimal
					ep("0.0.0.0"),
					ep("::ffff:10.1.0.4"), // IPv4-mapped: the IPv4 address
					ep("::ffff:0.0.0.0"),
				),
			),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080", "10.1.0.4:8080")),
			warns: warns(
				`EndpointSlice "web-1": port "http" has an invalid port number (none); ignored`,
				`EndpointSlice "web-1": endpoint address "bogus" is not a valid IP address`,
				`EndpointSlice "web-1": endpoint address "fd01::1" is not an IPv4 address`,
				`EndpointSlice "web-1": an endpoint has no addresses; ignored`,
				`EndpointSlice "web-1": endpoint address "0.0.0.0" is not a unicast address`,
				`EndpointSlice "web-1": endpoint address "::ffff:0.0.0.0" is not a unicast address`,
				`EndpointSlice "web-odd": addressType "IPv5" is not supported`,
			),
		},
		{
			name: "port numbers out of range: warnings",
			svc: svc(typ(corev1.ServiceTypeNodePort),
				ports(port("zero", "TCP", 0, 0), port("http", "TCP", 80, 70000))),
			want: vss(vs(ci, "10.96.0.10:80", tcp, "http")),
			warns: warns(`port "zero": port number 0 is out of range`,
				`port "http": nodePort 70000 is out of range`),
		},
		{
			name:   "no slice port matches the Service port: warning",
			svc:    svc(),
			slices: slices(slice4("web-1", sports(sp("https", "TCP", 8443)), ep("10.1.0.1"))),
			want:   vss(vs(ci, "10.96.0.10:80", tcp, "http")),
			warns:  warns(`port "http": no EndpointSlice has a TCP port named "http"; the port has no endpoints`),
		},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node, cfg := testNode, testCfg
			if tc.node != nil {
				node = *tc.node
			}
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			svcBefore, slicesBefore := tc.svc.DeepCopy(), deepCopySlices(tc.slices)
			got := buildUnchanged(t, tc.svc, tc.slices, node, cfg)
			if !reflect.DeepEqual(svcBefore, tc.svc) || !reflect.DeepEqual(slicesBefore, tc.slices) {
				t.Error("Build modified its input")
			}
			want := model.ServicePlan{
				Service:        types.NamespacedName{Namespace: "ns", Name: "web"},
				VirtualServers: tc.want,
				Warnings:       tc.warns,

				LocalEndpoints:      tc.localEndpoints,
				HealthCheckNodePort: tc.healthCheck,
				NodeEndpoints:       tc.nodeEndpoints,
			}
			if diff := cmp.Diff(want, got, planCmp...); diff != "" {
				t.Errorf("Build() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// build is Build of the API objects, made into what the informers hold
// (model.ServiceOf, model.SlicesOf); the objects are left unchanged.
func build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node model.NodeInfo, cfg model.BuildConfig) model.ServicePlan {
	return model.Build(model.ServiceOf(svc), model.SlicesOf(slices), node, cfg)
}

// buildUnchanged is build, checking that Build leaves the compact objects
// (those the informers' caches hold) as they were.
func buildUnchanged(t testing.TB, svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node model.NodeInfo, cfg model.BuildConfig) model.ServicePlan {
	t.Helper()
	s, in := model.ServiceOf(svc), model.SlicesOf(slices)
	plan := model.Build(s, in, node, cfg)
	if diff := cmp.Diff(model.ServiceOf(svc), s); diff != "" {
		t.Errorf("Build changed the Service (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(model.SlicesOf(slices), in, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("Build changed the EndpointSlices (-before +after):\n%s", diff)
	}
	return plan
}

func deepCopySlices(in []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, s := range in {
		out = append(out, s.DeepCopy())
	}
	return out
}

func TestBuildSliceOrderIrrelevant(t *testing.T) {
	s := svc(clusterIPs("10.96.0.10", "fd00::10"), externalIPs("203.0.113.5"))
	in := slices(
		slice4("web-a", http8080, ep("10.1.0.3"), ep("10.1.0.1")),
		slice4("web-b", http8080, ep("10.1.0.2"), ep("10.1.0.1", terminating)),
		slice6("web-c", http8080, ep("fd01::2"), ep("fd01::1")),
	)
	want := build(s, in, testNode, testCfg)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		if diff := cmp.Diff(want, build(s, in, testNode, testCfg), planCmp...); diff != "" {
			t.Fatalf("Build depends on slice order (-first +now):\n%s", diff)
		}
	}
}

func TestBuildNilInput(t *testing.T) {
	if got := build(nil, nil, model.NodeInfo{}, model.BuildConfig{}); !cmp.Equal(got, model.ServicePlan{}, planCmp...) {
		t.Errorf("Build(nil) = %+v, want an empty plan", got)
	}
	// A zero configuration and node still build, with the default scheduler.
	got := build(svc(typ(corev1.ServiceTypeNodePort), ports(port("http", "TCP", 80, 30080))),
		slices(slice4("web-1", http8080, ep("10.1.0.1", conds(nil, nil, nil), on("")))), model.NodeInfo{}, model.BuildConfig{})
	want := vss(vs(ci, "10.96.0.10:80", tcp, "http", "10.1.0.1:8080"))
	want[0].Scheduler = scheduler.Default
	if diff := cmp.Diff(want, got.VirtualServers, planCmp...); diff != "" {
		t.Errorf("zero config (-want +got):\n%s", diff)
	}
}

func TestBuildSkip(t *testing.T) {
	tests := []struct {
		name string
		svc  *corev1.Service
		want bool
	}{
		{"nil", nil, true},
		{"cluster IP", svc(), false},
		{"headless", svc(clusterIPs("None")), true},
		{"no cluster IP yet", svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }), true},
		{"ExternalName", svc(typ(corev1.ServiceTypeExternalName), clusterIPs("")), true},
		{"NodePort", svc(typ(corev1.ServiceTypeNodePort)), false},
	}
	for _, tc := range tests {
		if got := model.Skip(model.ServiceOf(tc.svc)); got != tc.want {
			t.Errorf("Skip(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBuildOddInputNoPanic feeds shapes the API server would reject; Build
// must not panic on any of them.
func TestBuildOddInputNoPanic(t *testing.T) {
	odd := []*corev1.Service{
		svc(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
		}),
		svc(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}
		}),
		svc(ports()),
		svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", []string{"10.96.0.10"} }),
		svc(clusterIPs("fe80::1%eth0", "224.0.0.1", "0.0.0.0", "::ffff:10.96.0.10")),
		svc(typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, -1)), ingress(lbIPMode("", "Proxy"))),
	}
	odd4 := slices(
		slice4("odd", sports(sp("http", "ICMP", 8080), discoveryv1.EndpointPort{}, sp("http", "TCP", -3)),
			discoveryv1.Endpoint{Addresses: []string{""}}, ep("10.1.0.1", func(e *discoveryv1.Endpoint) {
				e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{}}}
			})),
		&discoveryv1.EndpointSlice{},
	)
	for i, s := range odd {
		for _, node := range []model.NodeInfo{testNode, {NodePortAddresses: []netip.Addr{{}}}} {
			p := build(s, odd4, node, testCfg)
			t.Logf("case %d: %d virtual servers, warnings %q", i, len(p.VirtualServers), p.Warnings)
		}
	}
}

// TestBuildUnavailableScheduler: a scheduler the kernel refused is replaced
// by the default, flags and all, with a warning naming the module; the
// default itself is never replaced.
func TestBuildUnavailableScheduler(t *testing.T) {
	cfg := testCfg
	cfg.Unavailable = map[string]bool{"mh": true, "rr": true}
	got := build(svc(annotate(scheduler.AnnotationScheduler, "mh", scheduler.AnnotationFlags, "mh-port")), nil, testNode, cfg)
	if diff := cmp.Diff(vss(vs(ci, "10.96.0.10:80", tcp, "http")), got.VirtualServers, planCmp...); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], `"mh" is not available in this node's kernel (module ip_vs_mh); using the default "rr"`) {
		t.Errorf("warnings %q, want one about ip_vs_mh", got.Warnings)
	}
	if got := build(svc(annotate(scheduler.AnnotationScheduler, "sh")), nil, testNode, cfg); len(got.Warnings) != 0 || got.VirtualServers[0].Scheduler != "sh" {
		t.Errorf("an available scheduler: %s, warnings %q", got.VirtualServers[0].Scheduler, got.Warnings)
	}
}

// TestBuildRoutedClusterIPs: a clusterIP inside a routed Service range is
// Routed (held, not bound); one outside every range, and externalIPs, are
// bound as before.
func TestBuildRoutedClusterIPs(t *testing.T) {
	cfg := model.BuildConfig{ServiceRanges: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		routed map[string]bool // address -> Routed
	}{
		{"in the range", svc(externalIPs("192.0.2.7")), map[string]bool{"10.96.0.10": true, "192.0.2.7": false}},
		{"outside it", svc(clusterIPs("10.97.0.10")), map[string]bool{"10.97.0.10": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(tc.svc, nil, testNode, cfg)
			if len(p.VirtualServers) != len(tc.routed) {
				t.Fatalf("virtual servers %v, want one per address of %v", p.VirtualServers, tc.routed)
			}
			for _, vs := range p.VirtualServers {
				want := tc.routed[vs.Address.String()]
				if vs.Routed != want || vs.Bound() == want || !vs.Held() {
					t.Errorf("%s (%s): Routed %v Bound %v Held %v; want Routed %v, Bound %v, Held", vs.VSKey, vs.Kind, vs.Routed, vs.Bound(), vs.Held(), want, !want)
				}
			}
		})
	}
}

// TestBuildWarningsBounded: what a tenant writes is quoted in warnings,
// which become Events and log lines on every node: each warning is cut to
// a bounded size, and a Service has a bounded number of them, the last
// saying how many more there were.
func TestBuildWarningsBounded(t *testing.T) {
	var bad []string
	for i := range 40 {
		bad = append(bad, fmt.Sprintf("not-an-ip-%d", i))
	}
	huge := strings.Repeat("é", 100_000) // 200 KB, multi-byte
	p := model.Build(model.ServiceOf(svc(externalIPs(bad...), annotate(scheduler.AnnotationScheduler, huge))), nil,
		model.NodeInfo{Name: "node-a"}, model.BuildConfig{Scheduler: scheduler.Spec{Name: "rr"}})
	if len(p.Warnings) != 17 {
		t.Fatalf("%d warnings, want 16 and one saying how many more: %q", len(p.Warnings), p.Warnings)
	}
	if last := p.Warnings[16]; last != "and 25 more problems" {
		t.Errorf("last warning %q, want %q", last, "and 25 more problems")
	}
	for _, w := range p.Warnings {
		if len(w) > 300 || !utf8.ValidString(w) {
			t.Errorf("warning of %d bytes (valid UTF-8: %v), want at most 300: %.80q...", len(w), utf8.ValidString(w), w)
		}
	}
	if !strings.HasSuffix(p.Warnings[0], "…(cut)") {
		t.Errorf("the annotation's warning is not marked cut: %.80q...", p.Warnings[0])
	}
	if len(p.VirtualServers) != 1 {
		t.Errorf("the Service's clusterIP is still programmed: %v", p.VirtualServers)
	}
}

// TestBuildRealServersNotShared: the virtual servers of one port on several
// addresses get equal real servers, chosen once (realServersOf), but each
// its own array: the agent's settle and the forwarding edit a plan's real
// servers in place, one virtual server at a time.
func TestBuildRealServersNotShared(t *testing.T) {
	node := testNode
	node.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11"), netip.MustParseAddr("192.168.1.12")}
	got := build(svc(typ(corev1.ServiceTypeLoadBalancer), ports(port("http", "TCP", 80, 30080)), ingress(lbIP("198.51.100.1"))),
		slices(slice4("web-1", http8080, ep("10.1.0.1"), ep("10.1.0.2", notReady))), node, testCfg)
	if len(got.VirtualServers) != 5 {
		t.Fatalf("%d virtual servers, want 5 (clusterIP, LoadBalancer IP, 3 node ports): %+v", len(got.VirtualServers), got.VirtualServers)
	}
	want := got.VirtualServers[0].RealServers
	if len(want) != 2 {
		t.Fatalf("real servers %+v, want the ready one at 1 and the not ready one draining", want)
	}
	for i := range got.VirtualServers {
		vs := &got.VirtualServers[i]
		if diff := cmp.Diff(want, vs.RealServers, planCmp...); diff != "" {
			t.Errorf("%s: real servers differ from the clusterIP's (-want +got):\n%s", vs.VSKey, diff)
		}
		vs.RealServers[0].Weight = 7
		for j, other := range got.VirtualServers {
			if j != i && other.RealServers[0].Weight == 7 {
				t.Fatalf("an edit of %s's real servers shows in %s's", vs.VSKey, other.VSKey)
			}
		}
		vs.RealServers[0].Weight = 1
	}
}
