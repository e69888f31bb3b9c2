package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"

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
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

func newRunCommand() *cobra.Command {
	var of *optionFlags
	var hooks kernelHookFactory
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Watch Services and EndpointSlices and program IPVS",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, warn, err := of.resolve() // --config, then the flags set
			if err != nil {
				return err
			}
			return run(cmd.Context(), o, warn, hooks)
		},
	}
	of = newOptionFlags(cmd.Flags())
	hooks = addKernelHookFlags(cmd.Flags()) // none in the released binary
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
	proxier.TuneClientConfig(cfg, "ipvs-proxy/"+version)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return cs, nil
}

// ipvsSysctls are the kernel settings IPVS needs, as kube-proxy sets them:
// conntrack for IPVS connections so that iptables can masquerade them; drop
// connections to a deleted real server at once instead of black-holing them;
// expire persistence templates of a quiescent real server; forward packets
// to backends. conn_reuse_mode depends on the kernel (netlinkutil.ConnReuseMode).
var ipvsSysctls = []struct{ name, value string }{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv4/vs/conntrack", "1"},
	{"net/ipv4/vs/expire_nodest_conn", "1"},
	{"net/ipv4/vs/expire_quiescent_template", "1"},
}

func ensureSysctls(log *zap.Logger, ipv6 bool) error {
	s := netlinkutil.Sysctls{Root: sysctlRoot()} // /host/proc/sys in the DaemonSet (container.go)
	all := ipvsSysctls
	if release, err := s.Get("kernel/osrelease"); err != nil {
		return err
	} else if v, set, err := netlinkutil.ConnReuseMode(release); err != nil {
		return err
	} else if set { // from kernel 5.9 the kernel's default stays (netlinkutil.ConnReuseMode)
		all = append(all, struct{ name, value string }{netlinkutil.ConnReuseModeSysctl, v})
	}
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

// run runs the proxy; warn, if not nil, is logged once at start; hooks
// may wrap the kernel handles (only in a test build).
func run(ctx context.Context, o *options, warn *configWarning, hooks kernelHookFactory) error {
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
	gcPercent := setGCPercent(os.Getenv)
	log.Info("starting ipvs-proxy", zap.String("version", version), zap.String("interface", cfg.Interface),
		zap.String("scheduler", cfg.Scheduler.Name), zap.Int("gcPercent", gcPercent))

	reg := prometheus.NewRegistry()
	hook, err := hooks.hook(log, reg)
	if err != nil {
		return err
	}
	realIPVS, err := netlinkutil.NewIPVS()
	if err != nil {
		return err
	}
	defer realIPVS.Close()
	realLinks, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	ipvs, links := hook.IPVS(realIPVS), hook.Links(realLinks)
	if err := ensureSysctls(log, cfg.IPv6); err != nil {
		return err
	}
	if err := ensureGlueSysctls(log, o.StrictARP); err != nil {
		return err
	}
	client, err := kubeClient(o.Kubeconfig)
	if err != nil {
		return err
	}
	g, closeSets, err := newGlue(ctx, o, cfg, client, links, hook, log)
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

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "ipvs-proxy", Host: cfg.NodeName})

	metrics := proxier.NewMetrics(reg)
	p := proxier.New(cfg, client, ipvs, links, recorder, metrics, log)
	if ct, err := netlinkutil.NewConntrack(); err != nil {
		log.Warn("no conntrack cleanup for removed UDP real servers", zap.Error(err))
	} else {
		p.SetConntrack(ct)
	}
	// The periodic resync reads the kernel off the sync loop, on handles
	// of its own (reads are never faulted: no wrapping).
	readIPVS, err := netlinkutil.NewIPVS()
	if err != nil {
		return err
	}
	defer readIPVS.Close()
	readLinks, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	p.SetResyncReader(readIPVS, readLinks)
	p.AddConsumer(g)
	if o.TakeoverKubeProxy {
		p.AddFinisher("take over from kube-proxy", removeKubeProxyLeftovers(links, log))
	}
	stopOps, err := serveOperations(ctx, o, cfg, p, reg, client, links, recorder, log)
	if err != nil {
		return err
	}
	defer stopOps()
	return p.Run(ctx)
}

// removeKubeProxyLeftovers is the last step of a takeover from kube-proxy's
// IPVS mode, run once the node is fully programmed: the virtual servers on
// kube-ipvs0's addresses were adopted (kept when wanted, deleted when not),
// ipvs-proxy0 holds every wanted address and the glue's rules come first
// in every hook. It removes kube-proxy's chains with the jumps to them,
// then its sets, then kube-ipvs0: the same addresses stay bound on
// ipvs-proxy0, so no VIP is ever unbound.
func removeKubeProxyLeftovers(links netlinkutil.Links, log *zap.Logger) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var removed []string
		say := func(format string, args ...any) { removed = append(removed, fmt.Sprintf(format, args...)) }
		errs := cleanupNetfilter(ctx, glue.KubeProxyChain, glue.KubeProxySet, say)
		addrs, err := links.ListAddresses(kubeProxyInterface)
		switch {
		case err != nil:
			errs = append(errs, err)
		case addrs != nil:
			if err := links.DeleteLink(kubeProxyInterface); err != nil {
				errs = append(errs, err)
			} else {
				say("interface %s: deleted (its %d addresses are on ipvs-proxy's interface or unwanted)", kubeProxyInterface, len(addrs))
			}
		}
		log.Info("took over from kube-proxy", zap.Strings("removed", removed), zap.Errors("errors", errs))
		return errors.Join(errs...)
	}
}

// defaultGCPercent is the agent's GOGC unless the environment sets one.
// The heap peaks at the cold start, when every plan, set entry and netlink
// batch is built at once, and Go's default of 100 lets it grow to twice
// what is live then; 50 lowers that peak by about a fifth at 10,000
// Services (make bench-heap) for a few more collections. An agent at rest
// allocates little, so the CPU it costs is the start-up's.
const defaultGCPercent = 50

// setGCPercent applies defaultGCPercent unless GOGC is set (the runtime
// has applied that one), and returns the percentage in force (-1: off).
func setGCPercent(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent
}
