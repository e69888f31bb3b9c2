package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/background"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/cleanup"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/ctwatch"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/nodelock"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/opsserver"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/tunnelend"
)

func newRunCommand() *cobra.Command {
	var of *config.Flags
	var hooks kernelHookFactory
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Watch Services and EndpointSlices and program IPVS",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, warn, err := of.Resolve() // --config, then the flags set
			if err != nil {
				return err
			}
			return run(cmd.Context(), o, warn, hooks)
		},
	}
	of = config.NewFlags(cmd.Flags())
	hooks = addKernelHookFlags(cmd.Flags()) // none in the released binary
	return cmd
}

// run runs the proxy; warn, if not nil, is logged once at start; hooks
// may wrap the kernel handles (only in a test build).
func run(ctx context.Context, o *config.Options, warn *config.Warning, hooks kernelHookFactory) error {
	log, err := config.NewLogger(o.LogLevel, o.LogFormat)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	// One agent per node, before anything touches the kernel.
	lock, err := nodelock.Acquire(nodelock.Agent, nodelock.Who("ipvs-proxy run "+version, os.Getenv, os.Getpid(), time.Now()))
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer func() { _ = lock.Release() }()
	config.LogWarning(log, warn)
	cfg, timeouts, err := o.ProxierConfig()
	if err != nil {
		return err
	}
	if err := cfg.OnNodeIPv6(sysctls.HasIPv6(sysctls.Root())); err != nil {
		return err
	}
	cfg.APIServer = agent.APIServerAddresses(ctx, o.Kubeconfig, log)
	log = log.With(zap.String("node", cfg.NodeName))
	cfg.Background = background.LowPriority(background.DefaultNice, log)
	// Once, before any client: klog's logger is klog's process global.
	config.BridgeKlog(log)
	gcPercent, gcFromEnv := setGCPercent(os.Getenv)
	listPercent := gcPercent
	if !gcFromEnv {
		listPercent = listGCPercent
	}
	rev := buildRevision(debug.ReadBuildInfo)
	log.Info("starting ipvs-proxy", zap.String("version", version), zap.String("revision", rev), zap.String("interface", cfg.Interface),
		zap.String("scheduler", cfg.Scheduler.Name), zap.Int("gcPercent", gcPercent), zap.Int("gcPercentDuringLists", listPercent))
	defer logStop(ctx, log)()

	reg := prometheus.NewRegistry()
	agent.RegisterBuildInfo(reg, version, rev)
	if err := agent.RegisterClientMetrics(reg); err != nil { // before any client
		return err
	}
	hook, err := hooks.hook(log, reg)
	if err != nil {
		return err
	}
	realIPVS, err := netlinkutil.NewIPVSWithSysctls(sysctls.Root())
	if err != nil {
		return err
	}
	defer realIPVS.Close()
	realLinks, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	ipvs, links := hook.IPVS(realIPVS), hook.Links(realLinks)
	client, err := agent.NewClient(o.Kubeconfig, userAgent())
	if err != nil {
		return err
	}
	// The glue syncs beside the reconciler (agent.SyncOnce) and a Links
	// is not safe for concurrent use: the glue reads the node's addresses
	// through a socket of its own.
	glueLinks, err := netlinkutil.NewLinks()
	if err != nil {
		return err
	}
	recorder, stopEvents := agent.NewEventRecorder(ctx, client, cfg.NodeName, log)
	defer stopEvents()

	metrics := agent.NewMetrics(reg)
	p := agent.New(cfg, client, ipvs, links, recorder, metrics, log)
	// The connection tracking table, every few seconds: a full one stalls
	// new connections through every Service of the node.
	stopWatch := ctwatch.New(ctwatch.NewProcReader(sysctls.Root()), clock.RealClock{}, ctwatch.DefaultPeriod,
		ctwatch.NewMetrics(reg), recorder, cfg.NodeName, log).Start(ctx)
	defer stopWatch()
	closeReaders, err := addKernelReaders(p, o.ServiceTrafficMetrics, reg, log)
	if err != nil {
		return err
	}
	defer closeReaders()
	// The kernel is prepared while the initial lists stream in (at 10,000
	// Services the lists take seconds, the preparation most of one).
	var closeSets func()
	defer func() {
		if closeSets != nil {
			closeSets()
		}
	}()
	p.SetPrepare(func(ctx context.Context) error {
		g, closeGlue, err := prepareKernel(ctx, o, cfg, timeouts, client, ipvs, links, hook.Links(glueLinks), hook, log)
		if err != nil {
			return err
		}
		closeSets = closeGlue
		p.AddConsumer(g)
		if cfg.DSR.Off == "" {
			// Direct server return: this node ends the tunnels that any
			// node's IPVS sends to its pods.
			te, err := tunnelend.Open(tunnelend.Config{}, g.Backend(), sysctls.Root(), log)
			if err != nil {
				return err
			}
			p.AddConsumer(tunnelend.Consumer{TunnelEnd: te, Ends: tunnelend.PlanEnds})
		}
		if cfg.IPv6 {
			p.AddConsumer(sysctls.NewIPv6Forwarder(sysctls.Root(), log))
		}
		return nil
	})
	if o.TakeoverKubeProxy {
		p.AddFinisher("take over from kube-proxy", cleanup.KubeProxyLeftovers(links, log))
	}
	stopOps, err := serveOperations(ctx, o, cfg, p, reg, client, links, recorder, log)
	if err != nil {
		return err
	}
	defer stopOps()
	if !gcFromEnv {
		gcDuringLists(ctx, p.Listed())
	}
	return p.Run(ctx)
}

// logStop logs when the agent is told to stop (SIGTERM, SIGINT: ctx
// done) and, from the func it returns, deferred to the command's end,
// that it stopped and how long that took. A node that reported the
// agent's container running long after kubelet killed it, its ports
// refusing and its log silent (issue 45's soak at 2,000), left unknown
// whether the agent ever saw the signal.
func logStop(ctx context.Context, log *zap.Logger) func() {
	var asked atomic.Int64
	stopWatch := context.AfterFunc(ctx, func() {
		asked.Store(time.Now().UnixNano())
		log.Info("stopping: signalled")
	})
	return func() {
		stopWatch()
		if at := asked.Load(); at != 0 {
			log.Info("stopped", zap.Duration("took", time.Since(time.Unix(0, at))))
		} else if ctx.Err() != nil {
			log.Info("stopped")
		}
	}
}

// prepareKernel sets the sysctls and IPVS timeouts run needs, creates the
// interface and opens the iptables glue on glueLinks (hook wraps its sets;
// with --detect-local-mode NodeCIDR it waits for the Node's podCIDRs);
// closeSets releases the glue's netlink socket.
func prepareKernel(ctx context.Context, o *config.Options, cfg agent.Config, timeouts netlinkutil.Timeouts, client kube.Client,
	ipvs netlinkutil.IPVS, links, glueLinks netlinkutil.Links, hook kernelHook, log *zap.Logger) (g *glue.Glue, closeSets func(), err error) {
	if err := sysctls.Ensure(log); err != nil {
		return nil, nil, err
	}
	if err := sysctls.EnsureStrictARP(log, o.StrictARP); err != nil {
		return nil, nil, err
	}
	if err := sysctls.EnsureSloppyTCP(log, sysctls.NodeWriter(), o.SloppyTCP); err != nil {
		return nil, nil, err
	}
	gcfg, err := o.GlueConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	if o.DetectLocalMode == config.DetectNodeCIDR {
		if gcfg.ClusterCIDRs, err = agent.NodePodCIDRs(ctx, client, cfg.NodeName, log); err != nil {
			return nil, nil, err
		}
	}
	g, closeSets, err = glue.Open(gcfg, o.IPTablesBackend, glueLinks, hook.Sets, log)
	if err != nil {
		return nil, nil, err
	}
	// nf_conntrack is loaded by now: ip_vs depends on it (and preflight's
	// --load-modules loads it). A setting the kernel refuses is a warning.
	if err := sysctls.EnsureConntrack(log, o.Conntrack(), runtime.NumCPU()); err != nil {
		closeSets()
		return nil, nil, err
	}
	if timeouts != (netlinkutil.Timeouts{}) {
		if err := ipvs.SetTimeouts(timeouts); err != nil {
			closeSets()
			return nil, nil, err
		}
		log.Info("set IPVS timeouts", zap.Duration("tcp", timeouts.TCP), zap.Duration("tcpfin", timeouts.TCPFin), zap.Duration("udp", timeouts.UDP))
	}
	if err := links.EnsureDummy(cfg.Interface); err != nil {
		closeSets()
		return nil, nil, err
	}
	return g, closeSets, nil
}

// addKernelReaders gives the proxier its conntrack handle (without one,
// removed UDP real servers keep their entries), the handles of its
// periodic resync, which reads the kernel off the sync loop on handles of
// its own (reads are never faulted: no wrapping), and with traffic the
// handle its per-Service traffic series read at each scrape;
// closeReaders closes them.
func addKernelReaders(p *agent.Proxier, traffic bool, reg prometheus.Registerer, log *zap.Logger) (closeReaders func(), err error) {
	if ct, err := netlinkutil.NewConntrack(); err != nil {
		log.Warn("no conntrack cleanup for removed UDP real servers", zap.Error(err))
	} else {
		p.SetConntrack(ct)
	}
	readIPVS, err := netlinkutil.NewIPVS()
	if err != nil {
		return nil, err
	}
	readLinks, err := netlinkutil.NewLinks()
	if err != nil {
		readIPVS.Close()
		return nil, err
	}
	p.SetResyncReader(readIPVS, readLinks)
	if !traffic {
		return readIPVS.Close, nil
	}
	statsIPVS, err := netlinkutil.NewIPVS()
	if err == nil {
		err = p.EnableServiceTraffic(statsIPVS.(netlinkutil.StatsReader), reg)
	}
	if err != nil {
		readIPVS.Close()
		return nil, fmt.Errorf("per-Service traffic metrics: %w", err)
	}
	return func() { readIPVS.Close(); statsIPVS.Close() }, nil
}

// serveOperations starts the operational endpoints of `ipvs-proxy run` and
// adds the health-check node ports to the proxier; the returned function
// stops them.
func serveOperations(ctx context.Context, o *config.Options, cfg agent.Config, p *agent.Proxier, reg *prometheus.Registry,
	client kube.Client, links netlinkutil.Links, recorder record.EventRecorder, log *zap.Logger) (func(), error) {
	ops, err := opsserver.Start(ctx, opsserver.Config{
		MetricsAddr: strings.TrimSpace(o.MetricsBindAddress), HealthzAddr: strings.TrimSpace(o.HealthzBindAddress),
		DebugAddr: strings.TrimSpace(o.DebugBindAddress), Profiling: o.Profiling,
		SyncPeriod: cfg.SyncPeriod, Registry: reg, Status: p.Status, Problems: p.ServiceProblems, APICheck: opsserver.VersionCheck(client),
		HealthCheckAddrs: opsserver.HealthCheckAddresses(links, cfg, log), Recorder: recorder,
	}, log)
	if err != nil {
		return nil, err
	}
	p.AddConsumer(ops.HealthCheck())
	return ops.Stop, nil
}

// defaultGCPercent is the agent's GOGC unless the environment sets one.
// The heap peaks at the cold start, when every plan, set entry and netlink
// batch is built at once, and Go's default of 100 lets it grow to twice
// what is live then; 50 lowers that peak by about a fifth at 10,000
// Services (make bench-heap) for a few more collections. An agent at rest
// allocates little, so the CPU it costs is the start-up's.
const defaultGCPercent = 50

// listGCPercent is the agent's GOGC while the initial lists stream in,
// unless the environment sets one. Most of what the start allocates then
// is the decoded objects that model.Compact drops, and what is live is
// still small: collecting at every 50% of growth took about a sixth of
// the lists' time at 10,000 Services (make bench-heap -cpuprofile) and
// lowers no peak, which comes with the first sync's plans, after the
// lists (at 200, the heap during the lists stays under three times the
// informers' caches, 14 MiB at 10,000 Services).
const listGCPercent = 200

// gcDuringLists sets listGCPercent until listed is closed (or ctx ends),
// then defaultGCPercent.
func gcDuringLists(ctx context.Context, listed <-chan struct{}) {
	debug.SetGCPercent(listGCPercent)
	go func() {
		select {
		case <-listed:
		case <-ctx.Done():
		}
		debug.SetGCPercent(defaultGCPercent)
	}()
}

// setGCPercent applies defaultGCPercent unless GOGC is set (the runtime
// has applied that one, fromEnv), and returns the percentage in force
// (-1: off).
func setGCPercent(getenv func(string) string) (percent int, fromEnv bool) {
	if getenv("GOGC") != "" {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p, true
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent, false
}
