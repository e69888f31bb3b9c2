package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier"
)

func newRunCommand() *cobra.Command {
	var of *optionFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Watch Services and EndpointSlices and program IPVS",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, warn, err := of.resolve() // --config, then the flags set
			if err != nil {
				return err
			}
			return run(cmd.Context(), o, warn)
		},
	}
	of = newOptionFlags(cmd.Flags())
	return cmd
}

func newLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("--log-format: %q is neither json nor console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	return zc.Build()
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("load Kubernetes client configuration: %w", err)
	}
	cfg.UserAgent = "ipvs-proxy/" + version
	// Protobuf: smaller and cheaper to decode than JSON for 10,000s of
	// Services and EndpointSlices.
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	// A cold start lists every Service and EndpointSlice; don't throttle it.
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return cs, nil
}

// ipvsSysctls are the kernel settings IPVS needs, as kube-proxy sets them:
// conntrack for IPVS connections so that iptables can masquerade them; no
// reuse of a connection slot for a new connection from the same port (it
// would skip the scheduler and stall 1 s); drop connections to a deleted
// real server at once instead of black-holing them; expire persistence
// templates of a quiescent real server; forward packets to backends.
var ipvsSysctls = []struct{ name, value string }{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv4/vs/conntrack", "1"},
	{"net/ipv4/vs/conn_reuse_mode", "0"},
	{"net/ipv4/vs/expire_nodest_conn", "1"},
	{"net/ipv4/vs/expire_quiescent_template", "1"},
}

func ensureSysctls(log *zap.Logger, ipv6 bool) error {
	s := netlinkutil.Sysctls{Root: sysctlRoot()} // /host/proc/sys in the DaemonSet (container.go)
	all := ipvsSysctls
	if ipv6 {
		all = append(all, struct{ name, value string }{"net/ipv6/conf/all/forwarding", "1"})
	}
	for _, sc := range all {
		old, err := s.Ensure(sc.name, sc.value)
		if err != nil {
			return err
		}
		if old != sc.value {
			log.Info("set sysctl", zap.String("name", sc.name), zap.String("value", sc.value), zap.String("was", old))
		} else {
			log.Info("sysctl already set", zap.String("name", sc.name), zap.String("value", sc.value))
		}
	}
	return nil
}

// logConfigWarning logs the warning about the config file, if any.
func logConfigWarning(log *zap.Logger, warn *configWarning) {
	if warn != nil {
		log.Warn("ignoring the settings of the config file that ipvs-proxy does not support", zap.String("file", warn.File),
			zap.String("kind", warn.Kind), zap.Strings("ignored", warn.Ignored))
	}
}

// run runs the proxy; warn, if not nil, is logged once at start.
func run(ctx context.Context, o *options, warn *configWarning) error {
	log, err := newLogger(o.LogLevel, o.LogFormat)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	logConfigWarning(log, warn)
	cfg, timeouts, err := o.proxierConfig()
	if err != nil {
		return err
	}
	log = log.With(zap.String("node", cfg.NodeName))
	log.Info("starting ipvs-proxy", zap.String("version", version), zap.String("interface", cfg.Interface),
		zap.String("scheduler", cfg.Scheduler.Name))

	ipvs, err := netlinkutil.NewIPVS()
	if err != nil {
		return err
	}
	defer ipvs.Close()
	links, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	if err := ensureSysctls(log, cfg.IPv6); err != nil {
		return err
	}
	if err := ensureGlueSysctls(log, o.StrictARP); err != nil {
		return err
	}
	g, closeSets, err := newGlue(o, cfg, links, log)
	if err != nil {
		return err
	}
	defer closeSets()
	if timeouts != (netlinkutil.Timeouts{}) {
		if err := ipvs.SetTimeouts(timeouts); err != nil {
			return err
		}
		log.Info("set IPVS timeouts", zap.Duration("tcp", timeouts.TCP), zap.Duration("tcpfin", timeouts.TCPFin), zap.Duration("udp", timeouts.UDP))
	}
	if err := links.EnsureDummy(cfg.Interface); err != nil {
		return err
	}

	client, err := kubeClient(o.Kubeconfig)
	if err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ipvs-proxy", Host: cfg.NodeName})

	reg := prometheus.NewRegistry()
	metrics := proxier.NewMetrics(reg)
	p := proxier.New(cfg, client, ipvs, links, recorder, metrics, log)
	if ct, err := netlinkutil.NewConntrack(); err != nil {
		log.Warn("no conntrack cleanup for removed UDP real servers", zap.Error(err))
	} else {
		p.SetConntrack(ct)
	}
	p.AddConsumer(g)
	stopOps, err := serveOperations(ctx, o, cfg, p, reg, client, links, recorder, log)
	if err != nil {
		return err
	}
	defer stopOps()
	return p.Run(ctx)
}
