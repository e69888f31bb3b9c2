// Package config reads the settings of `ipvs-proxy run`, `preflight` and
// `status`: the flags, the config file (ipvs-proxy's own options, or
// kube-proxy's KubeProxyConfiguration, translated), their precedence and
// validation, and turns them into the proxier's and the glue's
// configuration.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Options are the settings of `ipvs-proxy run`. Flag names follow
// kube-proxy's where they mean the same thing. An option's json tag is its
// key in the flat config file (deprecated), its versioned tag its path in
// an IPVSProxyConfiguration (package v1alpha1).
type Options struct {
	Kubeconfig        string        `json:"kubeconfig" versioned:"clientConnection.kubeconfig"`
	HostnameOverride  string        `json:"hostnameOverride" versioned:"hostnameOverride"`
	Interface         string        `json:"interface" versioned:"ipvs.interface"`
	Scheduler         string        `json:"scheduler" versioned:"ipvs.scheduler"`
	SchedulerFlags    string        `json:"schedulerFlags" versioned:"ipvs.schedulerFlags"`
	NodePortAddresses []string      `json:"nodePortAddresses" versioned:"nodePortAddresses"`
	NodePortRange     string        `json:"nodePortRange" versioned:"nodePortRange"`
	ExternalIPCIDRs   []string      `json:"externalIPCIDRs" versioned:"externalIPCIDRs"`
	ExcludeCIDRs      []string      `json:"excludeCIDRs" versioned:"ipvs.excludeCIDRs"`
	IPFamilies        []string      `json:"ipFamilies" versioned:"ipFamilies"`
	RouteServiceCIDRs bool          `json:"routeServiceCIDRs" versioned:"ipvs.routeServiceCIDRs"`
	ServiceCIDRs      []string      `json:"serviceCIDRs" versioned:"ipvs.serviceCIDRs"`
	MinSyncPeriod     time.Duration `json:"minSyncPeriod" versioned:"ipvs.minSyncPeriod"`
	SyncPeriod        time.Duration `json:"syncPeriod" versioned:"ipvs.syncPeriod"`
	TCPTimeout        time.Duration `json:"tcpTimeout" versioned:"ipvs.tcpTimeout"`
	TCPFinTimeout     time.Duration `json:"tcpFinTimeout" versioned:"ipvs.tcpFinTimeout"`
	UDPTimeout        time.Duration `json:"udpTimeout" versioned:"ipvs.udpTimeout"`
	LogLevel          string        `json:"logLevel" versioned:"logging.level"`
	LogFormat         string        `json:"logFormat" versioned:"logging.format"`

	// Connection tracking, as kube-proxy's conntrack settings.
	ConntrackMaxPerCore            int           `json:"conntrackMaxPerCore" versioned:"conntrack.maxPerCore"`
	ConntrackMin                   int           `json:"conntrackMin" versioned:"conntrack.min"`
	ConntrackTCPEstablishedTimeout time.Duration `json:"conntrackTCPEstablishedTimeout" versioned:"conntrack.tcpEstablishedTimeout"`
	ConntrackTCPCloseWaitTimeout   time.Duration `json:"conntrackTCPCloseWaitTimeout" versioned:"conntrack.tcpCloseWaitTimeout"`
	ConntrackTCPBeLiberal          bool          `json:"conntrackTCPBeLiberal" versioned:"conntrack.tcpBeLiberal"`
	ConntrackUDPTimeout            time.Duration `json:"conntrackUDPTimeout" versioned:"conntrack.udpTimeout"`
	ConntrackUDPStreamTimeout      time.Duration `json:"conntrackUDPStreamTimeout" versioned:"conntrack.udpStreamTimeout"`

	// The iptables glue.
	ClusterCIDRs  []string `json:"clusterCIDRs" versioned:"clusterCIDRs"`
	MasqueradeAll bool     `json:"masqueradeAll" versioned:"iptables.masqueradeAll"`
	// AcceptServiceTraffic accepts Service traffic in filter INPUT ahead of
	// the host's firewall rules.
	AcceptServiceTraffic bool `json:"acceptServiceTraffic" versioned:"iptables.acceptServiceTraffic"`
	// How pods' (in-cluster) traffic is told apart, as kube-proxy's
	// detectLocalMode and detectLocal.
	DetectLocalMode        string `json:"detectLocalMode" versioned:"detectLocalMode"`
	PodBridgeInterface     string `json:"podBridgeInterface" versioned:"detectLocal.bridgeInterface"`
	PodInterfaceNamePrefix string `json:"podInterfaceNamePrefix" versioned:"detectLocal.interfaceNamePrefix"`
	IPTablesBackend        string `json:"iptablesBackend" versioned:"iptables.backend"`
	StrictARP              bool   `json:"strictARP" versioned:"ipvs.strictARP"`

	// Operations.
	MetricsBindAddress string `json:"metricsBindAddress" versioned:"metricsBindAddress"`
	HealthzBindAddress string `json:"healthzBindAddress" versioned:"healthzBindAddress"`
	DebugBindAddress   string `json:"debugBindAddress" versioned:"debugBindAddress"`
	Profiling          bool   `json:"profiling" versioned:"enableProfiling"`
	// ServiceTrafficMetrics exports IPVS's counters per Service port.
	ServiceTrafficMetrics bool `json:"serviceTrafficMetrics" versioned:"serviceTrafficMetrics"`

	// Migration.
	TakeoverKubeProxy bool `json:"takeoverKubeProxy" versioned:"takeoverKubeProxy"`

	// What one Service may ask of the node (model.Limits; 0: the default).
	ServiceMaxVirtualServers   int `json:"serviceMaxVirtualServers" versioned:"serviceLimits.virtualServers"`
	ServiceMaxRealServersPerVS int `json:"serviceMaxRealServersPerVirtualServer" versioned:"serviceLimits.realServersPerVirtualServer"`
	ServiceMaxRealServers      int `json:"serviceMaxRealServers" versioned:"serviceLimits.realServers"`
	ServiceMaxSetEntries       int `json:"serviceMaxSetEntries" versioned:"serviceLimits.setEntries"`

	// Direct server return (model.AnnotationForwarding, proxier/DSR.md).
	DirectServerReturn bool `json:"directServerReturn" versioned:"directServerReturn.enabled"`
	GUEPort            int  `json:"guePort" versioned:"directServerReturn.guePort"`
	// SloppyTCP sets net.ipv4.vs.sloppy_tcp=1 (sysctls.SloppyTCP): every
	// node's IPVS then schedules a TCP flow on any packet, so a flow that
	// a router moves to another node keeps its endpoint (with a hash
	// scheduler) instead of being reset.
	SloppyTCP bool `json:"sloppyTCP" versioned:"directServerReturn.sloppyTCP"`
}

// DefaultDebugBindAddress is where /statusz and pprof are served unless
// --debug-bind-address says otherwise: loopback (they have no
// authentication), on a port of its own so that the metrics may be bound
// to every address for Prometheus without them.
const DefaultDebugBindAddress = "127.0.0.1:10247"

// DefaultOptions returns the options' defaults: kube-proxy's where the same
// setting exists.
func DefaultOptions() Options {
	return Options{
		Interface:     "ipvs-proxy0",
		Scheduler:     scheduler.Default,
		NodePortRange: "30000-32767",
		IPFamilies:    []string{"IPv4", "IPv6"},
		// One local route per IPv4 Service range, not one address per
		// clusterIP (proxier/README.md, "Service ranges as local routes").
		RouteServiceCIDRs: true,
		MinSyncPeriod:     time.Second,
		SyncPeriod:        30 * time.Second,
		LogLevel:          "info",
		LogFormat:         "json",

		ConntrackMaxPerCore:            sysctls.DefaultConntrack.MaxPerCore,
		ConntrackMin:                   sysctls.DefaultConntrack.Min,
		ConntrackTCPEstablishedTimeout: sysctls.DefaultConntrack.TCPEstablishedTimeout,
		ConntrackTCPCloseWaitTimeout:   sysctls.DefaultConntrack.TCPCloseWaitTimeout,

		DetectLocalMode:    DetectClusterCIDR,
		IPTablesBackend:    "auto",
		MetricsBindAddress: "127.0.0.1:10249",
		HealthzBindAddress: "0.0.0.0:10256",
		DebugBindAddress:   DefaultDebugBindAddress,
		GUEPort:            DefaultGUEPort,
	}
}

// DefaultGUEPort is the UDP port nodes receive GUE on (--gue-port).
const DefaultGUEPort = 6080

func (o *Options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig; empty means in-cluster configuration.")
	fs.StringVar(&o.HostnameOverride, "hostname-override", o.HostnameOverride, "The name of this node (default: the host name).")
	fs.StringVar(&o.Interface, "interface", o.Interface, "Dummy interface that holds the virtual IPs (created if missing).")
	fs.StringVar(&o.Scheduler, "scheduler", o.Scheduler, "Default IPVS scheduler: "+strings.Join(scheduler.Names(), ", ")+".")
	fs.StringVar(&o.SchedulerFlags, "scheduler-flags", o.SchedulerFlags, "Flags of the default scheduler (sh-fallback, sh-port, mh-fallback, mh-port).")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", o.NodePortAddresses, "CIDRs of the node addresses that serve node ports, per family: a family no CIDR names keeps all its addresses (default: all but loopback and the proxy's interface).")
	fs.StringVar(&o.NodePortRange, "service-node-port-range", o.NodePortRange, "The apiserver's node-port range; node-port virtual servers in it are owned by ipvs-proxy.")
	fs.BoolVar(&o.TakeoverKubeProxy, "takeover-kube-proxy", o.TakeoverKubeProxy, "Take the node over from a stopped kube-proxy in IPVS mode, in place: adopt the virtual servers on kube-ipvs0's addresses (kept as they are when wanted), then, once the node is fully programmed, remove kube-proxy's KUBE-* chains and sets and kube-ipvs0. Harmless where kube-proxy left nothing; never while kube-proxy runs.")
	fs.StringSliceVar(&o.ExternalIPCIDRs, "external-ip-cidrs", o.ExternalIPCIDRs, "CIDRs a Service's externalIPs may be in; an externalIP outside all of them is not programmed, with a warning Event on the Service. Empty: every externalIP is allowed, as in kube-proxy (which has no such option).")
	fs.StringSliceVar(&o.ExcludeCIDRs, "exclude-cidrs", o.ExcludeCIDRs, "CIDRs whose virtual servers and addresses ipvs-proxy never cleans up when no Service wants them (kube-proxy's meaning); what a Service wants there is programmed.")
	fs.StringSliceVar(&o.IPFamilies, "ip-families", o.IPFamilies, "IP families to program: IPv4, IPv6 or both.")
	fs.BoolVar(&o.RouteServiceCIDRs, "route-service-cidrs", o.RouteServiceCIDRs, "Route the IPv4 Service ranges as local through the interface (one route each) instead of binding one address per clusterIP: the ranges of --service-cidrs, else of the cluster's ServiceCIDR objects (Kubernetes 1.33+). --route-service-cidrs=false binds one address per clusterIP, as kube-proxy's IPVS mode does, for tooling that reads the interface's addresses.")
	fs.StringSliceVar(&o.ServiceCIDRs, "service-cidrs", o.ServiceCIDRs, "With --route-service-cidrs: the Service ranges to route, instead of the cluster's ServiceCIDR objects.")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", o.MinSyncPeriod, "Minimum time between syncs; bursts of changes are coalesced (a change waits it only after a sync that carried changes).")
	fs.DurationVar(&o.SyncPeriod, "sync-period", o.SyncPeriod, "Period of the full resync that reads the kernel and repairs drift.")
	fs.DurationVar(&o.TCPTimeout, "ipvs-tcp-timeout", o.TCPTimeout, "IPVS timeout of idle TCP connections (0: leave as is).")
	fs.DurationVar(&o.TCPFinTimeout, "ipvs-tcpfin-timeout", o.TCPFinTimeout, "IPVS timeout of TCP connections after FIN (0: leave as is).")
	fs.DurationVar(&o.UDPTimeout, "ipvs-udp-timeout", o.UDPTimeout, "IPVS timeout of UDP flows (0: leave as is).")
	def := model.DefaultLimits()
	fs.IntVar(&o.ServiceMaxVirtualServers, "service-max-virtual-servers", o.ServiceMaxVirtualServers, fmt.Sprintf("Most virtual servers one Service may have (ports × addresses); a Service over a limit is not programmed, with an Event (0: %d).", def.VirtualServers))
	fs.IntVar(&o.ServiceMaxRealServersPerVS, "service-max-real-servers-per-virtual-server", o.ServiceMaxRealServersPerVS, fmt.Sprintf("Most real servers of one virtual server (0: %d).", def.RealServersPerVirtualServer))
	fs.IntVar(&o.ServiceMaxRealServers, "service-max-real-servers", o.ServiceMaxRealServers, fmt.Sprintf("Most real servers of one Service, and endpoint ports of its EndpointSlices (0: %d).", def.RealServers))
	fs.IntVar(&o.ServiceMaxSetEntries, "service-max-set-entries", o.ServiceMaxSetEntries, fmt.Sprintf("Most entries of one Service in the iptables glue's ipsets (0: %d).", def.SetEntries))
	fs.IntVar(&o.ConntrackMaxPerCore, "conntrack-max-per-core", o.ConntrackMaxPerCore, "Connection-tracking entries per CPU (nf_conntrack_max, at least --conntrack-min; 0: leave the kernel's limit).")
	fs.IntVar(&o.ConntrackMin, "conntrack-min", o.ConntrackMin, "Minimum of nf_conntrack_max, whatever the number of CPUs.")
	fs.DurationVar(&o.ConntrackTCPEstablishedTimeout, "conntrack-tcp-timeout-established", o.ConntrackTCPEstablishedTimeout, "Conntrack timeout of idle established TCP connections (0: leave as is).")
	fs.DurationVar(&o.ConntrackTCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", o.ConntrackTCPCloseWaitTimeout, "Conntrack timeout of TCP connections in CLOSE_WAIT (0: leave as is).")
	fs.BoolVar(&o.ConntrackTCPBeLiberal, "conntrack-tcp-be-liberal", o.ConntrackTCPBeLiberal, "Do not mark out-of-window TCP packets INVALID (nf_conntrack_tcp_be_liberal=1).")
	fs.DurationVar(&o.ConntrackUDPTimeout, "conntrack-udp-timeout", o.ConntrackUDPTimeout, "Conntrack timeout of unreplied UDP flows (0: leave as is).")
	fs.DurationVar(&o.ConntrackUDPStreamTimeout, "conntrack-udp-timeout-stream", o.ConntrackUDPStreamTimeout, "Conntrack timeout of replied UDP flows (0: leave as is).")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "Log level: debug, info, warn, error.")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "Log format: json or console.")
	fs.StringSliceVar(&o.ClusterCIDRs, "cluster-cidr", o.ClusterCIDRs, "The pods' CIDRs: traffic to clusterIPs from outside them is masqueraded.")
	fs.BoolVar(&o.MasqueradeAll, "masquerade-all", o.MasqueradeAll, "Masquerade all traffic to clusterIPs.")
	fs.BoolVar(&o.AcceptServiceTraffic, "iptables-accept-service-traffic", o.AcceptServiceTraffic, "Accept traffic to Services' virtual servers (node ports among them) in filter INPUT, ahead of the host's own firewall rules, for hosts whose INPUT drops by default (default: the host's rules decide, as with kube-proxy's IPVS mode).")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", o.DetectLocalMode, "How pods' traffic is told from the rest: ClusterCIDR (--cluster-cidr), NodeCIDR (the Node's podCIDRs), BridgeInterface (--pod-bridge-interface) or InterfaceNamePrefix (--pod-interface-name-prefix).")
	fs.StringVar(&o.PodBridgeInterface, "pod-bridge-interface", o.PodBridgeInterface, "With --detect-local-mode BridgeInterface: traffic arriving on this bridge is pods' traffic.")
	fs.StringVar(&o.PodInterfaceNamePrefix, "pod-interface-name-prefix", o.PodInterfaceNamePrefix, "With --detect-local-mode InterfaceNamePrefix: traffic arriving on interfaces named so is pods' traffic.")
	fs.StringVar(&o.IPTablesBackend, "iptables-backend", o.IPTablesBackend, "iptables backend: auto (whichever the node's other rules use), nft or legacy.")
	fs.BoolVar(&o.StrictARP, "strict-arp", o.StrictARP, "Do not answer ARP for the VIPs on the proxy's interface (arp_ignore=1, arp_announce=2).")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address of the Prometheus metrics endpoint (/metrics); empty disables it.")
	fs.StringVar(&o.DebugBindAddress, "debug-bind-address", o.DebugBindAddress, "Address of the debug endpoints: /statusz (which `ipvs-proxy status` reads) and, with --profiling, /debug/pprof/. They tell Services, addresses and internals without authentication: keep it on loopback; empty disables them.")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's pprof profiles under /debug/pprof/ on the debug address (off by default: they expose internals).")
	fs.BoolVar(&o.ServiceTrafficMetrics, "service-traffic-metrics", o.ServiceTrafficMetrics, "Export IPVS's counters per Service port on /metrics (connections, packets and bytes in and out; five series per Service port, and one dump of every virtual server per scrape).")
	fs.BoolVar(&o.DirectServerReturn, "direct-server-return", o.DirectServerReturn, "Let Services choose direct server return for their externalIPs and LoadBalancer IPs with the annotation ipvs-proxy.io/forwarding: tunnel or gue (every node must run with it: it ends the tunnels to its pods).")
	fs.BoolVar(&o.SloppyTCP, "sloppy-tcp", o.SloppyTCP, "With --direct-server-return: set net.ipv4.vs.sloppy_tcp=1 on the node, so that IPVS schedules a TCP flow on any packet, not only its SYN: a flow a router moves to another node keeps its pod where the Service uses the mh or sh scheduler. Node-wide, for every virtual server: a stray mid-flow packet creates an IPVS connection (proxier/DSR.md).")
	fs.IntVar(&o.GUEPort, "gue-port", o.GUEPort, "With --direct-server-return: the UDP port every node receives GUE (ipvs-proxy.io/forwarding: gue) on.")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", o.HealthzBindAddress, "Address of /healthz and /livez; empty disables them.")
}

// ParsePrefixes parses CIDRs (what names them in errors).
func ParsePrefixes(what string, in []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range in {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a CIDR: %w", what, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ParsePortRange parses a port range of the form "30000-32767".
func ParsePortRange(s string) (model.PortRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if !ok || err1 != nil || err2 != nil || a > b || a == 0 {
		return model.PortRange{}, fmt.Errorf("--service-node-port-range: %q is not a port range like 30000-32767", s)
	}
	return model.PortRange{Min: uint16(a), Max: uint16(b)}, nil
}

// ProxierConfig validates the options and turns them into the proxier's
// configuration.
func (o *Options) ProxierConfig() (agent.Config, netlinkutil.Timeouts, error) {
	var cfg agent.Config
	var err error
	cfg.NodeName = o.HostnameOverride
	if cfg.NodeName == "" {
		if cfg.NodeName, err = os.Hostname(); err != nil {
			return cfg, netlinkutil.Timeouts{}, fmt.Errorf("read host name: %w", err)
		}
	}
	cfg.NodeName = strings.ToLower(strings.TrimSpace(cfg.NodeName))
	if o.Interface == "" || len(o.Interface) > 15 {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--interface: %q is not a valid interface name", o.Interface)
	}
	cfg.Interface = o.Interface
	if o.TakeoverKubeProxy {
		if o.Interface == model.KubeProxyInterface {
			return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--takeover-kube-proxy: --interface must not be kube-proxy's %s", model.KubeProxyInterface)
		}
		cfg.AdoptInterface = model.KubeProxyInterface
	}
	if err := scheduler.Validate(o.Scheduler); err != nil {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--scheduler: %w", err)
	}
	flags, err := scheduler.ParseFlags(o.Scheduler, o.SchedulerFlags)
	if err != nil {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--scheduler-flags: %w", err)
	}
	cfg.Scheduler = scheduler.Spec{Name: o.Scheduler, Flags: flags}
	if cfg.NodePortAddresses, err = ParsePrefixes("nodeport-addresses", o.NodePortAddresses); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	if cfg.ExcludeCIDRs, err = ParsePrefixes("exclude-cidrs", o.ExcludeCIDRs); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	if cfg.ExternalIPCIDRs, err = ParsePrefixes("external-ip-cidrs", o.ExternalIPCIDRs); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	if cfg.NodePortRange, err = ParsePortRange(o.NodePortRange); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	for _, f := range o.IPFamilies {
		switch strings.ToLower(strings.TrimSpace(f)) {
		case "ipv4":
			cfg.IPv4 = true
		case "ipv6":
			cfg.IPv6 = true
		default:
			return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--ip-families: unknown family %q (IPv4 or IPv6)", f)
		}
	}
	if !cfg.IPv4 && !cfg.IPv6 {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--ip-families: at least one family is needed")
	}
	if o.MinSyncPeriod < 0 || o.SyncPeriod <= 0 || o.MinSyncPeriod > o.SyncPeriod {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--min-sync-period (%s) must be between 0 and --sync-period (%s)", o.MinSyncPeriod, o.SyncPeriod)
	}
	cfg.MinSyncPeriod, cfg.SyncPeriod = o.MinSyncPeriod, o.SyncPeriod
	cfg.RouteServiceRanges = o.RouteServiceCIDRs
	if cfg.ServiceRanges, err = ParsePrefixes("service-cidrs", o.ServiceCIDRs); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	if len(cfg.ServiceRanges) > 0 && !cfg.RouteServiceRanges {
		return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--service-cidrs needs --route-service-cidrs")
	}
	for _, p := range cfg.ServiceRanges {
		if p.Bits() == 0 {
			return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--service-cidrs: %s would make every address local", p)
		}
	}
	cfg.Limits = model.Limits{VirtualServers: o.ServiceMaxVirtualServers, RealServersPerVirtualServer: o.ServiceMaxRealServersPerVS,
		RealServers: o.ServiceMaxRealServers, SetEntries: o.ServiceMaxSetEntries}
	if err := cfg.Limits.Validate(); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	cfg.Limits = cfg.Limits.OrDefault()
	for name, d := range map[string]time.Duration{"ipvs-tcp-timeout": o.TCPTimeout, "ipvs-tcpfin-timeout": o.TCPFinTimeout, "ipvs-udp-timeout": o.UDPTimeout} {
		if d < 0 || (d > 0 && d < time.Second) {
			return cfg, netlinkutil.Timeouts{}, fmt.Errorf("--%s: %s must be 0 or at least 1s", name, d)
		}
	}
	g, err := o.GlueConfig(cfg)
	if err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	if cfg.DSR, err = o.DSRConfig(g); err != nil {
		return cfg, netlinkutil.Timeouts{}, err
	}
	return cfg, netlinkutil.Timeouts{TCP: o.TCPTimeout, TCPFin: o.TCPFinTimeout, UDP: o.UDPTimeout}, nil
}

// GlueConfig validates the flags of the iptables glue and turns them into
// its configuration.
func (o *Options) GlueConfig(cfg agent.Config) (glue.Config, error) {
	cidrs, err := ParsePrefixes("cluster-cidr", o.ClusterCIDRs)
	if err != nil {
		return glue.Config{}, err
	}
	switch o.IPTablesBackend {
	case "auto", string(glue.NFT), string(glue.Legacy):
	default:
		return glue.Config{}, fmt.Errorf("--iptables-backend: %q is not auto, nft or legacy", o.IPTablesBackend)
	}
	g := glue.Config{Interface: cfg.Interface, NodePortAddresses: cfg.NodePortAddresses, ClusterCIDRs: cidrs,
		MasqueradeAll: o.MasqueradeAll, AcceptServices: o.AcceptServiceTraffic, IPv4: cfg.IPv4, IPv6: cfg.IPv6, Background: cfg.Background}
	switch o.DetectLocalMode {
	case "", DetectClusterCIDR:
	case DetectNodeCIDR:
		g.ClusterCIDRs = nil // the Node's podCIDRs, read at start (nodeCIDRs)
	case DetectBridge:
		if o.PodBridgeInterface == "" {
			return glue.Config{}, fmt.Errorf("--detect-local-mode %s needs --pod-bridge-interface", o.DetectLocalMode)
		}
		g.ClusterCIDRs, g.LocalBridge = nil, o.PodBridgeInterface
	case DetectPrefix:
		if o.PodInterfaceNamePrefix == "" {
			return glue.Config{}, fmt.Errorf("--detect-local-mode %s needs --pod-interface-name-prefix", o.DetectLocalMode)
		}
		g.ClusterCIDRs, g.LocalInterfacePrefix = nil, o.PodInterfaceNamePrefix
	default:
		return glue.Config{}, fmt.Errorf("--detect-local-mode: %q is not %s, %s, %s or %s", o.DetectLocalMode,
			DetectClusterCIDR, DetectNodeCIDR, DetectBridge, DetectPrefix)
	}
	return g, nil
}

// DSRConfig is the node's direct server return: off, with the reason that
// Services asking for it are told, unless --direct-server-return is set
// and the glue can tell pods' IPv4 traffic from the rest (the in-cluster
// redirect needs it; direct server return is IPv4 only). --sloppy-tcp
// without --direct-server-return is an error.
func (o *Options) DSRConfig(g glue.Config) (model.DSRConfig, error) {
	if o.GUEPort < 1 || o.GUEPort > 65535 {
		return model.DSRConfig{}, fmt.Errorf("--gue-port: %d is not a port", o.GUEPort)
	}
	if o.SloppyTCP && !o.DirectServerReturn {
		return model.DSRConfig{}, fmt.Errorf("--sloppy-tcp needs --direct-server-return: only tunnelled flows keep their pod when IPVS schedules mid-flow, and every virtual server of the node would bear its cost")
	}
	c := model.DSRConfig{GUEPort: uint16(o.GUEPort)}
	switch {
	case !o.DirectServerReturn:
		c.Off = "direct server return is off on this node (--direct-server-return)"
	case !g.IPv4:
		c.Off = "direct server return is IPv4 only, and the node serves no IPv4"
	case o.DetectLocalMode == DetectNodeCIDR, g.LocalBridge != "", g.LocalInterfacePrefix != "":
	case !slices.ContainsFunc(g.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is4() && p.Bits() > 0 }):
		c.Off = "direct server return needs pods' IPv4 traffic told apart (an IPv4 --cluster-cidr, or --detect-local-mode)"
	}
	return c, nil
}

// The values of --detect-local-mode (kube-proxy's detectLocalMode).
const (
	DetectClusterCIDR = "ClusterCIDR"
	DetectNodeCIDR    = "NodeCIDR"
	DetectBridge      = "BridgeInterface"
	DetectPrefix      = "InterfaceNamePrefix"
)

// Conntrack is the connection tracking the options ask for.
func (o *Options) Conntrack() sysctls.Conntrack {
	return sysctls.Conntrack{
		MaxPerCore: o.ConntrackMaxPerCore, Min: o.ConntrackMin,
		TCPEstablishedTimeout: o.ConntrackTCPEstablishedTimeout, TCPCloseWaitTimeout: o.ConntrackTCPCloseWaitTimeout,
		TCPBeLiberal: o.ConntrackTCPBeLiberal,
		UDPTimeout:   o.ConntrackUDPTimeout, UDPStreamTimeout: o.ConntrackUDPStreamTimeout,
	}
}
