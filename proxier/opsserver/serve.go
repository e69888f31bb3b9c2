// Package opsserver serves the agent's operational endpoints: Prometheus
// metrics, /healthz and /livez on kube-proxy's conventions, the debug
// endpoints (/statusz, which it reads for `ipvs-proxy status`, and pprof),
// and the health-check node ports of externalTrafficPolicy Local Services.
package opsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/healthcheck"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// healthTimeout is how long changes may stay unapplied before /healthz
// fails: twice the full-resync period, as in kube-proxy (which allows 2 ×
// --sync-period between a queued change and its sync). A failed sync is
// retried with a backoff of at most one sync period, so one failed retry
// is tolerated, two are not.
func healthTimeout(syncPeriod time.Duration) time.Duration { return 2 * syncPeriod }

// loopTimeout is how long the sync loop may go without starting or
// finishing a sync before /livez fails: 3 × the sync period, at least a
// minute. Idle, the loop starts one at least every sync period (the
// periodic sync; --min-sync-period is no longer), so a sync may take
// twice the period before the loop counts as stuck.
func loopTimeout(syncPeriod time.Duration) time.Duration { return max(3*syncPeriod, time.Minute) }

// probeInterval is the period of the apiserver reachability probe: half
// the health timeout, at least 1 s and at most 30 s (one cheap GET /version
// per node per interval).
func probeInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/2, time.Second), 30*time.Second)
}

// apiProbe tracks whether the apiserver answers. The proxier's informers
// retry a lost watch silently (and a dead apiserver sends no events), so
// an outage is invisible in the proxier's status: while the apiserver
// cannot be reached, whatever changes in the cluster is pending without the
// proxier knowing. /healthz reports it (apiserverUnreachableSince).
type apiProbe struct {
	check    func(ctx context.Context) error
	interval time.Duration
	now      func() time.Time
	log      *zap.Logger

	mu           sync.Mutex
	failingSince time.Time // first failure since the last success; zero when reachable
}

// VersionCheck asks the apiserver for /version, which every authenticated
// client may read (system:public-info-viewer) and which touches no storage.
func VersionCheck(client kube.Client) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if _, err := client.ServerVersion(ctx); err != nil {
			return fmt.Errorf("GET /version: %w", err)
		}
		return nil
	}
}

func (a *apiProbe) probeOnce(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, a.interval)
	err := a.check(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil && !a.failingSince.IsZero():
		a.log.Info("apiserver reachable again", zap.Duration("after", a.now().Sub(a.failingSince)))
		a.failingSince = time.Time{}
	case err != nil && a.failingSince.IsZero():
		a.log.Warn("apiserver unreachable; the node keeps its rules, and /healthz stays healthy while they are in sync", zap.Error(err))
		a.failingSince = a.now()
	}
}

func (a *apiProbe) run(ctx context.Context) {
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.probeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// unreachableSince returns when the apiserver stopped answering (zero if
// it answers).
func (a *apiProbe) unreachableSince() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failingSince
}

// healthReport is the body of /healthz and /livez: kube-proxy's fields
// (lastUpdated, currentTime, nodeEligible on /healthz only, healthy) and
// ipvs-proxy's details. They are served without authentication on the
// node's addresses (cloud load balancers check /healthz): times and
// generic names only, never a Service, an address or a URL; the errors
// are in the log, `ipvs-proxy status` and /statusz.
type healthReport struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`

	LastSuccessfulSync        *time.Time `json:"lastSuccessfulSync,omitempty"`
	PendingSince              *time.Time `json:"pendingSince,omitempty"`
	LoopHeartbeat             *time.Time `json:"loopHeartbeat,omitempty"`
	APIServerUnreachableSince *time.Time `json:"apiserverUnreachableSince,omitempty"`
	// Failing names the node-wide parts whose last sync failed
	// (agent.Status.Failing).
	Failing []string `json:"failing,omitempty"`
	// Reasons say why the report is unhealthy.
	Reasons []string `json:"reasons,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// endpoint is what a health report is for.
type endpoint int

const (
	// endpointLivez (/livez): the sync loop is alive, what a restart can
	// fix.
	endpointLivez endpoint = iota
	// endpointProxy: the loop is alive and the rules are in sync; the
	// health-check node ports follow it, as kube-proxy's follow its
	// proxier's health.
	endpointProxy
	// endpointHealthz (/healthz): endpointProxy and the node's
	// eligibility, as in kube-proxy.
	endpointHealthz
)

// healthz decides the agent's health:
//
//   - /livez: the sync loop is alive. Healthy until it begins (while the
//     initial lists come in) and as long as it starts or finishes a sync
//     within the loop timeout. Failures that a restart cannot fix (the
//     kernel, iptables, ipset, a finisher) never fail it: a liveness probe
//     would turn them into a restart loop.
//   - /healthz: the loop alive, a first sync done, and, as kube-proxy's,
//     no change waiting longer than the timeout to reach the kernel (a
//     failing node-wide part keeps changes waiting; its name is in the
//     reason) and the node eligible (its Node exists, is not being
//     deleted, has no autoscaler to-be-deleted taint). An unreachable
//     apiserver is reported, never unhealthy by itself: as kube-proxy,
//     the node keeps serving with the rules it has, and load balancers
//     that check /healthz must not drain every node in a control-plane
//     outage.
//
// When healthy, lastUpdated is the current time, for kube-proxy
// compatibility; otherwise it is the last successful sync.
type healthz struct {
	status      func() agent.Status
	api         *apiProbe // nil: not probed
	timeout     time.Duration
	loopTimeout time.Duration
	now         func() time.Time
	log         *zap.Logger

	mu   sync.Mutex
	last map[string]bool // last health per endpoint, to log changes
}

// proxyHealthy is the condition the health-check node ports use, as
// kube-proxy's do: its proxier's health, without the node's eligibility.
func (h *healthz) proxyHealthy() bool { return h.report(endpointProxy).Healthy }

func (h *healthz) report(e endpoint) healthReport {
	st := h.status()
	now := h.now()
	r := healthReport{CurrentTime: now, LastUpdated: st.LastSuccessfulSync, LastSuccessfulSync: timePtr(st.LastSuccessfulSync),
		PendingSince: timePtr(st.PendingSince), LoopHeartbeat: timePtr(st.LoopHeartbeat), Failing: st.Failing}
	r.Reasons = h.loopReasons(st, now)
	if e != endpointLivez {
		r.Reasons = append(r.Reasons, h.syncReasons(st, now)...)
	}
	if e == endpointHealthz {
		r.NodeEligible = &st.NodeEligible
		if !st.NodeEligible {
			r.Reasons = append(r.Reasons, "node not eligible: its Node is missing, being deleted or tainted "+agent.ToBeDeletedTaint)
		}
		if h.api != nil {
			r.APIServerUnreachableSince = timePtr(h.api.unreachableSince())
		}
	}
	r.Healthy = len(r.Reasons) == 0
	if r.Healthy {
		r.LastUpdated = now
	}
	return r
}

// loopReasons: the sync loop has begun and neither started nor finished a
// sync within the loop timeout.
func (h *healthz) loopReasons(st agent.Status, now time.Time) []string {
	if st.LoopHeartbeat.IsZero() || now.Sub(st.LoopHeartbeat) < h.loopTimeout {
		return nil
	}
	return []string{fmt.Sprintf("sync loop stalled for %s (limit %s)", now.Sub(st.LoopHeartbeat).Round(time.Second), h.loopTimeout)}
}

// syncReasons: no sync has succeeded, or changes have waited past the
// timeout (with the node-wide parts that fail, by name).
func (h *healthz) syncReasons(st agent.Status, now time.Time) []string {
	var out []string
	if st.LastSuccessfulSync.IsZero() {
		out = append(out, "no successful sync yet")
	}
	if !st.PendingSince.IsZero() && now.Sub(st.PendingSince) >= h.timeout {
		reason := fmt.Sprintf("changes unapplied for %s (limit %s)", now.Sub(st.PendingSince).Round(time.Second), h.timeout)
		if len(st.Failing) > 0 {
			reason += "; failing: " + strings.Join(st.Failing, ", ")
		}
		out = append(out, reason)
	}
	return out
}

func (h *healthz) handler(name string, e endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r := h.report(e)
		code := http.StatusOK
		if !r.Healthy {
			code = http.StatusServiceUnavailable
		}
		h.logChange(name, r)
		body, err := json.Marshal(r)
		if err != nil { // times, strings and bools: cannot fail
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_, _ = w.Write(append(body, '\n'))
	})
}

func (h *healthz) logChange(endpoint string, r healthReport) {
	h.mu.Lock()
	old, seen := h.last[endpoint]
	h.last[endpoint] = r.Healthy
	h.mu.Unlock()
	switch {
	case r.Healthy && seen && !old:
		h.log.Info("healthy again", zap.String("endpoint", endpoint))
	case !r.Healthy && (!seen || old):
		h.log.Warn("unhealthy", zap.String("endpoint", endpoint), zap.Strings("reasons", r.Reasons))
	}
}

// Config is what Start needs; fields are injected in tests.
type Config struct {
	MetricsAddr, HealthzAddr string
	// DebugAddr serves /statusz and, with Profiling, Go's pprof handlers:
	// they tell Services, addresses and internals without
	// authentication, so it is loopback unless the operator names
	// another address (then with a warning at start).
	DebugAddr  string
	Profiling  bool
	SyncPeriod time.Duration
	Registry   *prometheus.Registry
	Status     func() agent.Status
	// Problems lists the Services failing or in conflict (for /statusz);
	// nil serves none.
	Problems func() []reconciler.ServiceStatus
	// APICheck probes the apiserver; nil disables the probe.
	APICheck func(ctx context.Context) error
	// HealthCheckAddrs are the addresses of the health-check node ports
	// (empty: all).
	HealthCheckAddrs []netip.Addr
	Recorder         record.EventRecorder
	Now              func() time.Time
}

// Server is the running endpoints; Stop ends them.
type Server struct {
	health      *healthz
	healthCheck *healthcheck.Server
	addrs       map[string]net.Addr // bound address by configured address
	servers     []*http.Server
	cancel      context.CancelFunc
	done        sync.WaitGroup
	log         *zap.Logger
}

// Start binds the metrics and health addresses (an address in
// use is an error at once, e.g. kube-proxy still running), serves them, and
// starts the apiserver probe. The health-check node ports open as the
// proxier syncs: add ops.healthCheck as a consumer.
func Start(ctx context.Context, c Config, log *zap.Logger) (*Server, error) {
	log = log.With(zap.String("component", "operations"))
	if c.Now == nil {
		c.Now = time.Now
	}
	timeout := healthTimeout(c.SyncPeriod)
	ops := &Server{addrs: map[string]net.Addr{}, log: log}
	ctx, ops.cancel = context.WithCancel(ctx)
	healthzTotal := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeproxy_proxy_healthz_total", Help: "Cumulative proxy healthz HTTP status.",
	}, []string{"code"})
	livezTotal := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeproxy_proxy_livez_total", Help: "Cumulative proxy livez HTTP status.",
	}, []string{"code"})
	if c.Registry != nil {
		for _, col := range []prometheus.Collector{healthzTotal, livezTotal,
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
			if err := c.Registry.Register(col); err != nil {
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	h := &healthz{status: c.Status, timeout: timeout, loopTimeout: loopTimeout(c.SyncPeriod), now: c.Now, log: log,
		last: map[string]bool{}}
	if c.APICheck != nil {
		h.api = &apiProbe{check: c.APICheck, interval: probeInterval(timeout), now: c.Now, log: log}
	}
	ops.health = h
	ops.healthCheck = healthcheck.New(healthcheck.Config{Addresses: c.HealthCheckAddrs, ProxyHealthy: h.proxyHealthy,
		Recorder: c.Recorder}, log)

	muxes, err := routes(c, h, healthzTotal, livezTotal, log)
	if err != nil {
		return nil, err
	}
	for addr, m := range muxes {
		if err := ops.serve(addr, m, c); err != nil {
			ops.Stop()
			return nil, err
		}
	}
	if h.api != nil {
		ops.done.Add(1)
		go func() {
			defer ops.done.Done()
			h.api.run(ctx)
		}()
	}
	return ops, nil
}

// routes are the handlers to serve, by address: kube-proxy's endpoint
// names; one address may serve both.
func routes(c Config, h *healthz, healthzTotal, livezTotal *prometheus.CounterVec, log *zap.Logger) (map[string]*http.ServeMux, error) {
	muxes := map[string]*http.ServeMux{}
	mux := func(addr string) *http.ServeMux {
		if muxes[addr] == nil {
			muxes[addr] = http.NewServeMux()
		}
		return muxes[addr]
	}
	codeCounter := func(cv *prometheus.CounterVec, next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
			next.ServeHTTP(rec, r)
			cv.WithLabelValues(fmt.Sprint(rec.code)).Inc()
		})
	}
	if c.HealthzAddr != "" {
		mux(c.HealthzAddr).Handle("/healthz", codeCounter(healthzTotal, h.handler("healthz", endpointHealthz)))
		mux(c.HealthzAddr).Handle("/livez", codeCounter(livezTotal, h.handler("livez", endpointLivez)))
	}
	if c.MetricsAddr != "" {
		if c.Registry == nil {
			return nil, errors.New("metrics: no registry")
		}
		mux(c.MetricsAddr).Handle("/metrics", promhttp.HandlerFor(c.Registry, promhttp.HandlerOpts{
			Registry: c.Registry, ErrorLog: zap.NewStdLog(log), MaxRequestsInFlight: 4, Timeout: 30 * time.Second,
		}))
	}
	if c.DebugAddr != "" {
		m := mux(c.DebugAddr)
		m.Handle("/statusz", statuszHandler(c.Status, c.Problems, log))
		if c.Profiling {
			m.HandleFunc("/debug/pprof/", pprof.Index) // the named profiles: heap, allocs, goroutine...
			m.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			m.HandleFunc("/debug/pprof/profile", pprof.Profile)
			m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			m.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
	}
	return muxes, nil
}

// serve binds addr and serves m there until Stop.
func (ops *Server) serve(addr string, m *http.ServeMux, c Config) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (--metrics-bind-address / --healthz-bind-address / --debug-bind-address): %w", addr, err)
	}
	ops.addrs[addr] = ln.Addr()
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && addr == c.DebugAddr && !tcp.IP.IsLoopback() {
		ops.log.Warn("the debug endpoints (/statusz, pprof) listen on an address that is not loopback: they tell Services, addresses and internals to whoever reaches it, without authentication",
			zap.String("address", addr))
	}
	srv := &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: zap.NewStdLog(ops.log)}
	ops.servers = append(ops.servers, srv)
	ops.done.Add(1)
	go func() {
		defer ops.done.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ops.log.Error("HTTP server stopped", zap.String("address", addr), zap.Error(err))
		}
	}()
	ops.log.Info("serving", zap.String("address", ln.Addr().String()), zap.Strings("paths", muxPaths(addr, c)))
	return nil
}

func muxPaths(addr string, c Config) []string {
	var p []string
	if addr == c.HealthzAddr {
		p = append(p, "/healthz", "/livez")
	}
	if addr == c.MetricsAddr {
		p = append(p, "/metrics")
	}
	if addr == c.DebugAddr {
		p = append(p, "/statusz")
		if c.Profiling {
			p = append(p, "/debug/pprof/")
		}
	}
	return p
}

// HealthCheck is the server of the health-check node ports: a consumer of
// the proxier's plans (agent.AddConsumer).
func (ops *Server) HealthCheck() *healthcheck.Server { return ops.healthCheck }

// Stop shuts the HTTP servers down (in-flight requests get 2 s), closes
// the health-check node ports and stops the probe.
func (ops *Server) Stop() {
	ops.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range ops.servers {
		if err := s.Shutdown(ctx); err != nil {
			_ = s.Close()
		}
	}
	if ops.healthCheck != nil {
		if err := ops.healthCheck.Close(); err != nil {
			ops.log.Warn("close health checks", zap.Error(err))
		}
	}
	ops.done.Wait()
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// HealthCheckAddresses are the addresses the health-check node ports
// listen on: with --nodeport-addresses, per family, the node's addresses in
// those CIDRs (read once at start, as kube-proxy does), and the whole of a
// family the CIDRs do not name; without it, every address.
func HealthCheckAddresses(links netlinkutil.Links, cfg agent.Config, log *zap.Logger) []netip.Addr {
	if len(cfg.NodePortAddresses) == 0 {
		return nil
	}
	all, err := links.NodeAddresses(netlinkutil.ProxyInterfaces(cfg.Interface)...)
	if err != nil {
		log.Warn("cannot read the node's addresses; health-check node ports listen on every address", zap.Error(err))
		return nil
	}
	addrs, fallback := model.HealthCheckListen(all, cfg.NodePortAddresses, cfg.IPv4, cfg.IPv6)
	if len(fallback) > 0 {
		log.Warn("no node address matches --nodeport-addresses in these families; their health-check node ports listen on every address",
			zap.Strings("families", fallback))
	}
	return addrs
}

// ServiceStatus is one Service's status as the agent serves it on
// /statusz (and `ipvs-proxy status` reads it).
type ServiceStatus struct {
	Service   string     `json:"service"`
	Failures  int        `json:"failures,omitempty"`
	LastError string     `json:"lastError,omitempty"`
	NextRetry *time.Time `json:"nextRetry,omitempty"`
	Conflicts []string   `json:"conflicts,omitempty"`
}

// statuszBody is the body of /statusz: the node-wide parts whose last
// sync failed and the last sync's error, and the Services whose writes
// fail or that lost a conflict, as of the agent's last sync.
type statuszBody struct {
	Failing       []string        `json:"failing,omitempty"`
	LastSyncError string          `json:"lastSyncError,omitempty"`
	Services      []ServiceStatus `json:"services"`
}

func statuszHandler(status func() agent.Status, problems func() []reconciler.ServiceStatus, log *zap.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		body := statuszBody{Services: []ServiceStatus{}}
		if status != nil {
			st := status()
			body.Failing = st.Failing
			if st.LastError != nil {
				body.LastSyncError = st.LastError.Error()
			}
		}
		if problems != nil {
			for _, st := range problems() {
				a := ServiceStatus{Service: st.Service.String(), Failures: st.Failures, LastError: st.LastError,
					NextRetry: timePtr(st.NextRetry)}
				for _, c := range st.Conflicts {
					a.Conflicts = append(a.Conflicts, c.String())
				}
				body.Services = append(body.Services, a)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(body); err != nil {
			log.Debug("write /statusz", zap.Error(err))
		}
	})
}

// AgentStatus is what the agent on this node says of its syncs and
// Services.
type AgentStatus struct {
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
	// Failing names the node-wide parts whose last sync failed;
	// LastSyncError is the last sync's error.
	Failing       []string `json:"failing,omitempty"`
	LastSyncError string   `json:"lastSyncError,omitempty"`
	// Services are those whose writes fail or that lost a conflict.
	Services []ServiceStatus `json:"services,omitempty"`
}

// ReadAgentStatus reads the agent's /statusz on its debug address.
func ReadAgentStatus(ctx context.Context, debugAddr string) AgentStatus {
	if strings.TrimSpace(debugAddr) == "" {
		return AgentStatus{Error: "no --debug-bind-address: the agent's status is not served"}
	}
	host, port, err := net.SplitHostPort(strings.TrimSpace(debugAddr))
	if err != nil {
		return AgentStatus{Error: fmt.Sprintf("--debug-bind-address %q: %v", debugAddr, err)}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/statusz", nil)
	if err != nil {
		return AgentStatus{Error: err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return AgentStatus{Error: fmt.Sprintf("the agent does not answer: %v", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return AgentStatus{Error: fmt.Sprintf("the agent's /statusz answered %s", resp.Status)}
	}
	var body statuszBody
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&body); err != nil {
		return AgentStatus{Error: fmt.Sprintf("the agent's /statusz: %v", err)}
	}
	return AgentStatus{Available: true, Failing: body.Failing, LastSyncError: body.LastSyncError, Services: body.Services}
}
