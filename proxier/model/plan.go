package model

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// AddressKind says which of a Service's addresses a virtual server serves.
type AddressKind string

// Kinds of Service addresses.
const (
	KindClusterIP    AddressKind = "ClusterIP"
	KindNodePort     AddressKind = "NodePort"
	KindExternalIP   AddressKind = "ExternalIP"
	KindLoadBalancer AddressKind = "LoadBalancer"
)

// External reports whether traffic to this kind of address comes from outside
// the cluster (and so follows externalTrafficPolicy).
func (k AddressKind) External() bool { return k != KindClusterIP }

// Bound reports whether addresses of this kind are bound to the proxy's dummy
// interface (node-port addresses belong to the node already).
func (k AddressKind) Bound() bool { return k != KindNodePort }

// VSPlan is one virtual server that a Service needs, with its real servers.
type VSPlan struct {
	ktypes.VirtualServer
	Kind AddressKind
	// PortName is the Service port's name ("" for a single unnamed port).
	PortName string
	// RealServers are sorted by address, then port. Weight 1 serves;
	// weight 0 drains (a terminating endpoint that still serves while
	// others are ready: no new connections, established ones go on);
	// weight 0 marked Drain is an endpoint that no longer serves, kept in
	// the kernel only while it has connections (see RealServer.Drain).
	RealServers []ktypes.RealServer
	// Local is set when a Local traffic policy restricts this virtual
	// server to the node's own endpoints (externalTrafficPolicy for
	// external kinds, internalTrafficPolicy for clusterIPs): the client's
	// address must then be preserved, not masqueraded.
	Local bool
	// InClusterOnly is set on an external virtual server under a Local
	// externalTrafficPolicy when the node has no usable endpoint of its
	// own: its real servers are then the cluster's endpoints, for
	// in-cluster clients only (pods and the node itself, which every
	// kube-proxy mode sends to all endpoints); the glue drops traffic to
	// it from outside the cluster, as it would find no local endpoint.
	InClusterOnly bool
	// SourceRanges are the Service's loadBalancerSourceRanges, on
	// KindLoadBalancer virtual servers only; empty allows every source.
	SourceRanges []netip.Prefix
	// NodeAddress is set on an externalIP or LoadBalancer virtual server
	// whose address is one of the node's own (NodeInfo.Addresses): an
	// operator's externalIP or a controller's ingress IP naming a node.
	// It is programmed, but its address is neither bound to the proxy's
	// interface nor protected (see Bound).
	NodeAddress bool
	// Routed is set on a clusterIP virtual server whose address lies in
	// one of the Service ranges that the node routes as local through
	// the proxy's interface (BuildConfig.ServiceRanges): the address is
	// the node's own without being bound, and protected as a bound one.
	Routed bool
	// Forward is how traffic from outside the cluster reaches the
	// endpoints of an externalIP or LoadBalancer virtual server
	// (AnnotationForwarding): NAT, or a tunnel (with TunPort for GUE) to
	// the real servers on other nodes (those on this node keep NAT).
	// InClusterTo is then the clusterIP and port that the glue redirects
	// in-cluster clients to, which NATs them.
	Forward     ktypes.Forward
	TunPort     uint16
	InClusterTo netip.AddrPort
}

// Bound reports whether the virtual server's address is bound to the
// proxy's dummy interface and protected (new connections to its other
// ports refused): Service addresses are, node addresses are not (node
// ports, and externalIP or LoadBalancer IPs that are node addresses:
// binding one would move the node's address to the dummy interface, and
// the protection would refuse sshd, the kubelet and every other port of
// it).
func (v VSPlan) Bound() bool { return v.Kind.Bound() && !v.NodeAddress && !v.Routed }

// Held reports whether the virtual server's address is the node's own
// through the proxy, bound or in a routed range: such addresses are
// protected, and the node's own connections from one are masqueraded.
func (v VSPlan) Held() bool { return v.Bound() || v.Routed }

// ServicePlan is everything one Kubernetes Service asks of the kernel. It is
// plain data, built by Build, compared with go-cmp in tests and diffed
// against the kernel by the reconciler.
type ServicePlan struct {
	Service types.NamespacedName
	// Created is the Service's creation time: when two Services want the
	// same virtual server, the older one holds it (see Precedes).
	Created time.Time
	// VirtualServers is sorted by VSKey (address, protocol, port).
	VirtualServers []VSPlan
	// Warnings are problems with the Service's data that did not stop it
	// being programmed (an unknown scheduler, a port that cannot be
	// resolved). Each becomes a Kubernetes Event and a log line.
	Warnings []string
	// HealthCheckNodePort is the Service's healthCheckNodePort (a
	// LoadBalancer Service with externalTrafficPolicy Local), 0 if none.
	HealthCheckNodePort uint16
	// LocalEndpoints counts the distinct ready endpoint addresses on this
	// node (for the health check of externalTrafficPolicy Local): the
	// serving-terminating fallback is not counted, so that load balancers
	// drain the node while its last endpoints shut down.
	LocalEndpoints int
	// NodeEndpoints are the distinct addresses of the real servers whose
	// endpoints are on this node, sorted: the pods that IPVS may balance
	// to themselves (hairpin), which the glue masquerades.
	NodeEndpoints []netip.Addr
	// Refused, when set, says which limit the Service is over (see
	// Limits): it then has no virtual servers and counts no local
	// endpoint, and the agent reports it as failing.
	Refused string
}

// NodeInfo is what the builder needs to know of the node it runs on.
type NodeInfo struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
	// NodePortAddresses are the addresses node ports listen on, already
	// filtered by --nodeport-addresses.
	NodePortAddresses []netip.Addr
	// Addresses are all the node's own addresses (every link but loopback
	// and the proxies' dummy interfaces, whatever --nodeport-addresses
	// says): an externalIP or LoadBalancer IP among them is not bound.
	Addresses []netip.Addr
}

// BuildConfig is the part of the configuration that shapes plans.
type BuildConfig struct {
	// Scheduler is the default scheduler (--scheduler) and its flags.
	Scheduler scheduler.Spec
	// IPFamilies the node can serve; empty means both.
	IPv4, IPv6 bool
	// NodeWithoutIPv6: the node's kernel has no IPv6, so IPv6 is off
	// (IPv6 false) and a Service's IPv6 addresses get a warning.
	NodeWithoutIPv6 bool
	// APIServer are the addresses of the apiserver the agent talks to: no
	// externalIP or LoadBalancer IP may take them.
	APIServer []netip.Addr
	// OtherNodes are the addresses of the other Nodes (their
	// status.addresses, InternalIP and ExternalIP), each with its Node's
	// name: an externalIP or LoadBalancer IP among them is not programmed
	// on this node, unless it is one of this node's own addresses.
	OtherNodes map[netip.Addr]string
	// ExternalIPCIDRs, when not empty, are the only prefixes an externalIP
	// may be in (externalIPCIDRs); empty allows every one, as kube-proxy
	// does.
	ExternalIPCIDRs []netip.Prefix
	// Unavailable are schedulers the node's kernel refused: a Service
	// asking for one gets the default, with a warning.
	Unavailable map[string]bool
	// ServiceRanges are the Service ranges (IPv4) that the node routes as
	// local through the proxy's interface: clusterIPs inside one are not
	// bound (VSPlan.Routed).
	ServiceRanges []netip.Prefix
	// Limits bound what one Service may ask of the node.
	Limits Limits
	// DSR is the node's direct server return (AnnotationForwarding).
	DSR DSRConfig
}
