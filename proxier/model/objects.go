package model

import (
	"net/netip"
	"slices"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Service is what the agent reads of a Service, and all that its informer
// keeps (Compact makes it from the API object). Its fields are named as
// the API's are, so that Build reads the same paths; the API object is
// about three times its size, with maps, pointers and strings the agent
// never reads.
type Service struct {
	Namespace, Name string
	UID             types.UID
	ResourceVersion string
	Created         time.Time
	// Annotations holds the scheduler's and AnnotationForwarding only (nil
	// without).
	Annotations map[string]string
	Spec        ServiceSpec
	Status      ServiceStatus
}

// ServiceSpec is what Build reads of a Service's spec.
type ServiceSpec struct {
	Type                     corev1.ServiceType
	ClusterIP                string
	ClusterIPs               []string
	IPFamilies               []corev1.IPFamily
	ExternalIPs              []string
	LoadBalancerSourceRanges []string
	ExternalTrafficPolicy    corev1.ServiceExternalTrafficPolicy
	InternalTrafficPolicy    *corev1.ServiceInternalTrafficPolicy
	HealthCheckNodePort      int32
	SessionAffinity          corev1.ServiceAffinity
	// AffinityTimeout is sessionAffinityConfig.clientIP.timeoutSeconds.
	AffinityTimeout *int32
	Ports           []ServicePort
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	NodePort int32
}

// ServiceStatus holds the Service's load-balancer ingress points.
type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus
}

// LoadBalancerStatus holds the ingress points.
type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress
}

// LoadBalancerIngress is one ingress point (hostname-only ones are left
// out: a proxy has nothing to do for them).
type LoadBalancerIngress struct {
	IP     string
	IPMode *corev1.LoadBalancerIPMode
}

// EndpointSlice is what the agent reads of an EndpointSlice, and all that
// its informer keeps (Compact makes it).
type EndpointSlice struct {
	Namespace, Name string
	ResourceVersion string
	// Service is the kubernetes.io/service-name label: the Service the
	// slice serves ("" for none).
	Service string
	// Triggered is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation (zero without, or when it does not parse).
	Triggered   time.Time
	AddressType discoveryv1.AddressType
	Ports       []discoveryv1.EndpointPort
	Endpoints   []Endpoint
	// Unparsed holds, by index in Endpoints, the first address of each
	// endpoint whose Address could not hold it (it does not parse), as
	// written, for Build to read the old forms it accepts or to name in
	// its warning; nil when there is none, as in every slice the API
	// validated.
	Unparsed map[int]string
}

// Endpoint is one endpoint of a slice: its first address, the one a proxy
// uses, parsed (the zero Addr when it has none, or see
// EndpointSlice.Unparsed), so that the informer keeps neither the decoded
// string nor its array (32 bytes an endpoint). Node and zone names are
// interned: a cluster's endpoints name few.
type Endpoint struct {
	Address netip.Addr
	// The conditions as a consumer reads them: an unset ready or serving
	// is true, an unset terminating false.
	Ready, Serving, Terminating bool
	NodeName, Zone              string
	Hints                       *EndpointHints
}

// EndpointHints are the topology hints: node names and zone names.
type EndpointHints struct {
	ForNodes, ForZones []string
}

// GetObjectMeta makes the Service usable in an informer's store
// (metav1.ObjectMetaAccessor: its key and resource version); the metadata
// is made when asked, not kept.
func (s *Service) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion, UID: s.UID}
}

// GetObjectMeta makes the slice usable in an informer's store.
func (s *EndpointSlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}
}

// Ref is the Service's object reference, for Events.
func (s *Service) Ref() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: s.Namespace, Name: s.Name,
		UID: s.UID, ResourceVersion: s.ResourceVersion}
}

// ServiceOf returns what the agent reads of svc (nil for nil). It shares
// svc's strings and leaves svc unchanged.
func ServiceOf(svc *corev1.Service) *Service {
	if svc == nil {
		return nil
	}
	sp := &svc.Spec
	out := &Service{Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, ResourceVersion: svc.ResourceVersion,
		Created: svc.CreationTimestamp.Time,
		Annotations: keepKeys(svc.Annotations, func(k string) bool {
			return k == scheduler.AnnotationScheduler || k == scheduler.AnnotationFlags || k == AnnotationForwarding
		}),
		Spec: ServiceSpec{Type: sp.Type, ClusterIP: sp.ClusterIP, ClusterIPs: sp.ClusterIPs, IPFamilies: sp.IPFamilies,
			ExternalIPs: sp.ExternalIPs, LoadBalancerSourceRanges: sp.LoadBalancerSourceRanges,
			ExternalTrafficPolicy: sp.ExternalTrafficPolicy, InternalTrafficPolicy: sp.InternalTrafficPolicy,
			HealthCheckNodePort: sp.HealthCheckNodePort, SessionAffinity: sp.SessionAffinity},
	}
	if len(sp.ClusterIPs) > 0 && sp.ClusterIP == sp.ClusterIPs[0] {
		out.Spec.ClusterIP = sp.ClusterIPs[0] // one string, not two equal ones
	}
	if c := sp.SessionAffinityConfig; c != nil && c.ClientIP != nil {
		out.Spec.AffinityTimeout = c.ClientIP.TimeoutSeconds
	}
	if len(sp.Ports) > 0 {
		out.Spec.Ports = make([]ServicePort, len(sp.Ports))
		for i, p := range sp.Ports {
			out.Spec.Ports[i] = ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, LoadBalancerIngress{IP: ing.IP, IPMode: ing.IPMode})
		}
	}
	return out
}

// SliceOf returns what the agent reads of s (nil for nil). It shares s's
// strings and leaves s unchanged.
func SliceOf(s *discoveryv1.EndpointSlice) *EndpointSlice {
	if s == nil {
		return nil
	}
	out := &EndpointSlice{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion,
		Service: s.Labels[discoveryv1.LabelServiceName], AddressType: s.AddressType, Ports: s.Ports}
	if v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			out.Triggered = t
		}
	}
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]Endpoint, len(s.Endpoints))
	}
	for i, e := range s.Endpoints {
		c := e.Conditions
		o := Endpoint{Ready: c.Ready == nil || *c.Ready, Serving: c.Serving == nil || *c.Serving,
			Terminating: c.Terminating != nil && *c.Terminating, NodeName: intern(e.NodeName), Zone: intern(e.Zone)}
		if len(e.Addresses) > 0 {
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				if out.Unparsed == nil {
					out.Unparsed = map[int]string{}
				}
				out.Unparsed[i] = strings.Clone(e.Addresses[0])
			}
			o.Address = a
		}
		if h := e.Hints; h != nil && (len(h.ForNodes) > 0 || len(h.ForZones) > 0) {
			o.Hints = &EndpointHints{}
			for _, n := range h.ForNodes {
				o.Hints.ForNodes = append(o.Hints.ForNodes, intern(&n.Name))
			}
			for _, z := range h.ForZones {
				o.Hints.ForZones = append(o.Hints.ForZones, intern(&z.Name))
			}
		}
		out.Endpoints[i] = o
	}
	return out
}

// WrittenAddress is endpoint i's first address as a message shows it: as
// written when it did not parse, else parsed ("" for none).
func (s *EndpointSlice) WrittenAddress(i int) string {
	if w, ok := s.Unparsed[i]; ok {
		return w
	}
	if a := s.Endpoints[i].Address; a.IsValid() {
		return a.String()
	}
	return ""
}

// intern is *s as one copy the process shares with every equal string
// ("" for nil): node and zone names repeat on every endpoint of a node.
func intern(s *string) string {
	if s == nil || *s == "" {
		return ""
	}
	return unique.Make(*s).Value()
}

// SlicesOf returns SliceOf of each slice.
func SlicesOf(in []*discoveryv1.EndpointSlice) []*EndpointSlice {
	if in == nil {
		return nil
	}
	out := make([]*EndpointSlice, len(in))
	for i, s := range in {
		out[i] = SliceOf(s)
	}
	return out
}

// Node is what the agent reads of a Node, and all that its informer keeps
// (Compact makes it): the agent watches every Node for their addresses
// (BuildConfig.OtherNodes), and reads the rest of its own. About 200 bytes
// a Node, where the API object, with its images and conditions, is
// kilobytes.
type Node struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	// Zone is the topology.kubernetes.io/zone label.
	Zone string
	// Leaving: the Node is being deleted, or tainted
	// ToBeDeletedByClusterAutoscaler.
	Leaving bool
	// PodCIDRs are spec.podCIDRs (spec.podCIDR when only it is set);
	// malformed ones are left out.
	PodCIDRs []netip.Prefix
	// Addresses are the InternalIP and ExternalIP addresses of
	// status.addresses, each once.
	Addresses []netip.Addr
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to delete.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// GetObjectMeta makes the Node usable in an informer's store.
func (n *Node) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, UID: n.UID}
}

// Ref is the Node's object reference, for Events (the kubelet's: the UID
// is the name).
func (n *Node) Ref() *corev1.ObjectReference {
	return NodeRef(n.Name)
}

// NodeRef is the reference of the Node of that name, for Events.
func NodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

// NodeOf returns what the agent reads of n (nil for nil); n is unchanged.
func NodeOf(n *corev1.Node) *Node {
	if n == nil {
		return nil
	}
	out := &Node{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Zone: n.Labels[corev1.LabelTopologyZone],
		Leaving: n.DeletionTimestamp != nil ||
			slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ToBeDeletedTaint })}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out.Addresses, ip.Unmap()) {
			out.Addresses = append(out.Addresses, ip.Unmap())
		}
	}
	return out
}
