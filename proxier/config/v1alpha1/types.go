package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPVSProxyConfiguration is ipvs-proxy's configuration file. A field the
// file does not set keeps ipvs-proxy's default (null too); flags given on
// the command line override the file. Durations are strings such as 30s
// or 1m30s; lists are lists.
type IPVSProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// ClientConnection is how ipvs-proxy reaches the apiserver
	// (--kubeconfig).
	ClientConnection ClientConnectionConfiguration `json:"clientConnection"`
	// HostnameOverride is the name of this node; empty: the host name
	// (--hostname-override).
	HostnameOverride string `json:"hostnameOverride"`
	// IPFamilies are the IP families to program, IPv4, IPv6 or both
	// (--ip-families). At the top: the IPVS and the iptables sides both
	// follow them.
	IPFamilies []string `json:"ipFamilies"`
	// NodePortAddresses are the CIDRs of the node addresses that serve
	// node ports, per family (a family no CIDR names keeps all its
	// addresses, as in kube-proxy); empty: all but loopback and the
	// proxy's interface (--nodeport-addresses).
	NodePortAddresses []string `json:"nodePortAddresses"`
	// NodePortRange is the apiserver's node-port range, e.g. 30000-32767
	// (--service-node-port-range). At the top: a fact of the cluster, not
	// a setting of one of the groups.
	NodePortRange string `json:"nodePortRange"`
	// ExternalIPCIDRs are the CIDRs a Service's externalIPs may be in: an
	// externalIP outside all of them is not programmed, with a warning
	// Event on the Service; empty: every externalIP is allowed, as in
	// kube-proxy (--external-ip-cidrs). At the top: a policy on Services.
	ExternalIPCIDRs []string `json:"externalIPCIDRs"`
	// ClusterCIDRs are the pods' CIDRs (--cluster-cidr; kube-proxy's
	// clusterCIDR, there one comma-separated string).
	ClusterCIDRs []string `json:"clusterCIDRs"`
	// DetectLocalMode is how pods' traffic is told from the rest:
	// ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix
	// (--detect-local-mode).
	DetectLocalMode string `json:"detectLocalMode"`
	// DetectLocal holds the interfaces of the detectLocalMode that need
	// one.
	DetectLocal DetectLocalConfiguration `json:"detectLocal"`
	// IPVS is the IPVS side: the interface, schedulers, syncs and
	// timeouts.
	IPVS IPVSConfiguration `json:"ipvs"`
	// IPTables is the iptables glue.
	IPTables IPTablesConfiguration `json:"iptables"`
	// Conntrack is the connection tracking table and its timeouts.
	Conntrack ConntrackConfiguration `json:"conntrack"`
	// MetricsBindAddress is the host:port of /metrics; empty disables it
	// (--metrics-bind-address).
	MetricsBindAddress string `json:"metricsBindAddress"`
	// HealthzBindAddress is the host:port of /healthz and /livez; empty
	// disables them (--healthz-bind-address).
	HealthzBindAddress string `json:"healthzBindAddress"`
	// DebugBindAddress is the host:port of /statusz (which `ipvs-proxy
	// status` reads) and, with enableProfiling, /debug/pprof/; they have
	// no authentication: loopback by default (127.0.0.1:10247); empty
	// disables them (--debug-bind-address).
	DebugBindAddress string `json:"debugBindAddress"`
	// EnableProfiling serves Go's pprof profiles on the debug address
	// (--profiling).
	EnableProfiling bool `json:"enableProfiling"`
	// ServiceTrafficMetrics exports IPVS's counters per Service port on
	// /metrics (--service-traffic-metrics).
	ServiceTrafficMetrics bool `json:"serviceTrafficMetrics"`
	// Logging is the log's level and format.
	Logging LoggingConfiguration `json:"logging"`
	// TakeoverKubeProxy takes the node over from a stopped kube-proxy in
	// IPVS mode, in place (--takeover-kube-proxy). At the top: a one-off
	// switch of the migration, of no group.
	TakeoverKubeProxy bool `json:"takeoverKubeProxy"`
	// ServiceLimits bound what one Service may ask of the node; a Service
	// over one is not programmed, with an Event.
	ServiceLimits ServiceLimitsConfiguration `json:"serviceLimits"`
	// DirectServerReturn lets Services tunnel their external traffic to
	// their endpoints (annotation ipvs-proxy.io/forwarding).
	DirectServerReturn DirectServerReturnConfiguration `json:"directServerReturn"`
}

// DirectServerReturnConfiguration is the node's direct server return.
type DirectServerReturnConfiguration struct {
	// Enabled lets Services choose it (--direct-server-return).
	Enabled bool `json:"enabled"`
	// GUEPort is the UDP port nodes receive GUE on (--gue-port).
	GUEPort int32 `json:"guePort"`
	// SloppyTCP sets net.ipv4.vs.sloppy_tcp=1 on the node: IPVS schedules
	// a TCP flow on any packet, not only its SYN (--sloppy-tcp; needs
	// Enabled).
	SloppyTCP bool `json:"sloppyTCP"`
}

// ServiceLimitsConfiguration bounds one Service; 0 takes the default.
type ServiceLimitsConfiguration struct {
	// VirtualServers: its ports × its addresses
	// (--service-max-virtual-servers).
	VirtualServers int32 `json:"virtualServers"`
	// RealServersPerVirtualServer
	// (--service-max-real-servers-per-virtual-server).
	RealServersPerVirtualServer int32 `json:"realServersPerVirtualServer"`
	// RealServers in all, and endpoint ports of its EndpointSlices
	// (--service-max-real-servers).
	RealServers int32 `json:"realServers"`
	// SetEntries in the iptables glue's ipsets (--service-max-set-entries).
	SetEntries int32 `json:"setEntries"`
}

// ClientConnectionConfiguration is how ipvs-proxy reaches the apiserver.
type ClientConnectionConfiguration struct {
	// Kubeconfig is the path of a kubeconfig; empty: the in-cluster
	// configuration (--kubeconfig).
	Kubeconfig string `json:"kubeconfig"`
}

// DetectLocalConfiguration names the interfaces pods' traffic arrives on.
type DetectLocalConfiguration struct {
	// BridgeInterface, with detectLocalMode BridgeInterface
	// (--pod-bridge-interface).
	BridgeInterface string `json:"bridgeInterface"`
	// InterfaceNamePrefix, with detectLocalMode InterfaceNamePrefix
	// (--pod-interface-name-prefix).
	InterfaceNamePrefix string `json:"interfaceNamePrefix"`
}

// IPVSConfiguration is the IPVS side of ipvs-proxy.
type IPVSConfiguration struct {
	// Interface is the dummy interface that holds the virtual IPs, as
	// kube-proxy's kube-ipvs0 (--interface).
	Interface string `json:"interface"`
	// Scheduler is the default IPVS scheduler (--scheduler).
	Scheduler string `json:"scheduler"`
	// SchedulerFlags are the default scheduler's flags (--scheduler-flags).
	SchedulerFlags string `json:"schedulerFlags"`
	// SyncPeriod is the period of the full resync (--sync-period).
	SyncPeriod metav1.Duration `json:"syncPeriod"`
	// MinSyncPeriod is the least time between syncs (--min-sync-period);
	// a Service change waits it only after a sync that carried changes.
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
	// ExcludeCIDRs are CIDRs whose virtual servers and addresses are never
	// cleaned up when no Service wants them, as in kube-proxy; what a
	// Service wants there is programmed (--exclude-cidrs).
	ExcludeCIDRs []string `json:"excludeCIDRs"`
	// StrictARP keeps the interface's VIPs out of ARP (--strict-arp).
	StrictARP bool `json:"strictARP"`
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's timeouts; 0s
	// leaves the kernel's (--ipvs-tcp-timeout, --ipvs-tcpfin-timeout,
	// --ipvs-udp-timeout).
	TCPTimeout    metav1.Duration `json:"tcpTimeout"`
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	UDPTimeout    metav1.Duration `json:"udpTimeout"`
	// RouteServiceCIDRs routes the IPv4 Service ranges as local through
	// the interface instead of binding each clusterIP to it
	// (--route-service-cidrs).
	RouteServiceCIDRs bool `json:"routeServiceCIDRs"`
	// ServiceCIDRs are the ranges routeServiceCIDRs routes; empty: the
	// cluster's ServiceCIDR objects (--service-cidrs).
	ServiceCIDRs []string `json:"serviceCIDRs"`
}

// IPTablesConfiguration is ipvs-proxy's iptables glue.
type IPTablesConfiguration struct {
	// MasqueradeAll masquerades all traffic to clusterIPs
	// (--masquerade-all).
	MasqueradeAll bool `json:"masqueradeAll"`
	// AcceptServiceTraffic accepts traffic to Services' virtual servers in
	// filter INPUT ahead of the host's own rules
	// (--iptables-accept-service-traffic); off, the host's rules decide.
	AcceptServiceTraffic bool `json:"acceptServiceTraffic"`
	// Backend is auto, nft or legacy (--iptables-backend).
	Backend string `json:"backend"`
}

// ConntrackConfiguration is the connection tracking ipvs-proxy sets, as
// kube-proxy's conntrack.
type ConntrackConfiguration struct {
	// MaxPerCore is nf_conntrack_max per CPU; 0 leaves the kernel's
	// (--conntrack-max-per-core).
	MaxPerCore int32 `json:"maxPerCore"`
	// Min is the least nf_conntrack_max (--conntrack-min).
	Min int32 `json:"min"`
	// The timeouts; 0s leaves the kernel's.
	TCPEstablishedTimeout metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   metav1.Duration `json:"tcpCloseWaitTimeout"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal
	// (--conntrack-tcp-be-liberal).
	TCPBeLiberal     bool            `json:"tcpBeLiberal"`
	UDPTimeout       metav1.Duration `json:"udpTimeout"`
	UDPStreamTimeout metav1.Duration `json:"udpStreamTimeout"`
}

// LoggingConfiguration is the agent's log.
type LoggingConfiguration struct {
	// Level is debug, info, warn or error (--log-level).
	Level string `json:"level"`
	// Format is json or console (--log-format; kube-proxy's
	// logging.format is json or text).
	Format string `json:"format"`
}
