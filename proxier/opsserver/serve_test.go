package opsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeStatus is a settable proxier status.
type fakeStatus struct {
	mu sync.Mutex
	st agent.Status
}

func (f *fakeStatus) Status() agent.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fakeStatus) Set(st agent.Status) {
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
}

func ask(t *testing.T, h http.Handler) (int, healthReport) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	var r healthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return rec.Code, r
}

func TestHealthTimeouts(t *testing.T) {
	if got := healthTimeout(30 * time.Second); got != time.Minute {
		t.Errorf("healthTimeout(30s) = %v, want 1m (kube-proxy: 2 × sync period)", got)
	}
	for in, want := range map[time.Duration]time.Duration{time.Minute: 30 * time.Second, 10 * time.Second: 5 * time.Second,
		time.Second: time.Second, 10 * time.Minute: 30 * time.Second} {
		if got := probeInterval(in); got != want {
			t.Errorf("probeInterval(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestHealthz walks /healthz and /livez through kube-proxy's rules and
// ipvs-proxy's: /livez is the sync loop's liveness alone; /healthz adds
// the first sync, changes stuck past the limit and the node's eligibility,
// and reports an unreachable apiserver without failing for it.
func TestHealthz(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
	status := &fakeStatus{}
	probeErr := errors.New("Get \"https://10.0.0.1:6443/version\": connection refused")
	var apiDown bool
	api := &apiProbe{interval: time.Second, now: clock.Now, log: zap.NewNop(), check: func(context.Context) error {
		if apiDown {
			return probeErr
		}
		return nil
	}}
	h := &healthz{status: status.Status, api: api, timeout: 10 * time.Second, loopTimeout: time.Minute, now: clock.Now,
		log: zap.NewNop(), last: map[string]bool{}}
	healthzH, livezH := h.handler("healthz", endpointHealthz), h.handler("livez", endpointLivez)
	expect := func(what string, wantHealthz, wantLivez int, reason string) healthReport {
		t.Helper()
		code, r := ask(t, healthzH)
		if code != wantHealthz {
			t.Errorf("%s: /healthz %d, want %d: %+v", what, code, wantHealthz, r)
		}
		if reason != "" && !strings.Contains(strings.Join(r.Reasons, "; "), reason) {
			t.Errorf("%s: /healthz reasons %q lack %q", what, r.Reasons, reason)
		}
		if r.NodeEligible == nil {
			t.Errorf("%s: /healthz without nodeEligible", what)
		}
		if !r.CurrentTime.Equal(clock.Now()) {
			t.Errorf("%s: currentTime %v", what, r.CurrentTime)
		}
		if code, lr := ask(t, livezH); code != wantLivez {
			t.Errorf("%s: /livez %d, want %d: %+v", what, code, wantLivez, lr)
		} else if lr.NodeEligible != nil {
			t.Errorf("%s: /livez has nodeEligible", what)
		}
		return r
	}

	// Starting: the loop has not begun (the initial lists); a restart
	// would not bring them sooner.
	expect("before the first sync", 503, 200, "no successful sync yet")

	synced := clock.Now()
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true, LoopHeartbeat: synced})
	if r := expect("after the first sync", 200, 200, ""); !r.LastUpdated.Equal(clock.Now()) {
		t.Errorf("healthy lastUpdated = %v, want the current time (kube-proxy)", r.LastUpdated)
	}

	// A change waits: healthy until the timeout.
	clock.Step(time.Second)
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true, PendingSince: clock.Now(), Pending: 1, LoopHeartbeat: clock.Now()})
	clock.Step(9 * time.Second)
	expect("pending 9s", 200, 200, "")
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true, PendingSince: clock.Now().Add(-9 * time.Second),
		LastError: errors.New("injected: busy"), LoopHeartbeat: clock.Now()})
	clock.Step(time.Second)
	r := expect("pending 10s and failing", 503, 200, "changes unapplied for 10s")
	if !r.LastUpdated.Equal(synced) {
		t.Errorf("unhealthy report: lastUpdated %v, want the last sync %v", r.LastUpdated, synced)
	}
	if len(h.proxyHealthyReasons()) == 0 || h.proxyHealthy() {
		t.Errorf("proxyHealthy() with changes stuck: the health-check node ports follow kube-proxy's")
	}

	// Synced again.
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: true, LoopHeartbeat: clock.Now()})
	expect("synced again", 200, 200, "")

	// The node goes away: /healthz only.
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: false, LoopHeartbeat: clock.Now()})
	if r := expect("node not eligible", 503, 200, "node not eligible"); *r.NodeEligible {
		t.Errorf("nodeEligible true")
	}
	if !h.proxyHealthy() {
		t.Errorf("proxyHealthy() false for the node's eligibility alone (kube-proxy's health-check node ports ignore it)")
	}
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: true, LoopHeartbeat: clock.Now()})

	// The apiserver stops answering: reported, never unhealthy for that
	// alone (kube-proxy keeps answering 200 while its rules are in sync;
	// a load balancer would drain every node in a control-plane outage).
	apiDown = true
	api.probeOnce(context.Background())
	down := clock.Now()
	for _, after := range []time.Duration{5 * time.Second, 10 * time.Second, time.Hour} {
		clock.Step(after - clock.Now().Sub(down))
		status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: true, LoopHeartbeat: clock.Now()})
		api.probeOnce(context.Background())
		r := expect(fmt.Sprintf("apiserver unreachable %v", after), 200, 200, "")
		if r.APIServerUnreachableSince == nil || !r.APIServerUnreachableSince.Equal(down) {
			t.Errorf("apiserver unreachable %v: apiserverUnreachableSince %v, want %v", after, r.APIServerUnreachableSince, down)
		}
	}
	apiDown = false
	api.probeOnce(context.Background())
	if r := expect("apiserver back", 200, 200, ""); r.APIServerUnreachableSince != nil {
		t.Errorf("apiserverUnreachableSince still set: %v", r.APIServerUnreachableSince)
	}
}

// TestHealthzNodeWideFailure: a node-wide part that keeps failing (the
// iptables glue, a takeover finisher that cannot remove a chain) fails
// /healthz once changes have waited past the limit, with a reason naming
// the part, and never /livez: a restart cannot fix it, and a restart loop
// would drop the health-check node ports too. No answer carries the
// errors' details (Service names, addresses, the apiserver's URL).
func TestHealthzNodeWideFailure(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	failing := func(parts ...string) agent.Status {
		return agent.Status{LastSuccessfulSync: t0, NodeEligible: true, PendingSince: t0, LoopHeartbeat: t0.Add(15 * time.Second),
			Failing: parts, LastError: errors.New("iptables glue: ipset add IPVSP-SERVICE 10.96.0.10,tcp:80 of ns/web: set is full")}
	}
	tests := []struct {
		name        string
		st          agent.Status
		after       time.Duration
		wantHealthz int
		wantReason  string
	}{
		{"glue failing, within the limit", failing("iptables glue"), 9 * time.Second, 200, ""},
		{"glue failing past the limit", failing("iptables glue"), 10 * time.Second, 503, "failing: iptables glue"},
		{"finisher failing past the limit", failing("take over from kube-proxy"), 20 * time.Second, 503, "failing: take over from kube-proxy"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: t0.Add(tc.after)}
			h := &healthz{status: func() agent.Status { return tc.st }, timeout: 10 * time.Second, loopTimeout: time.Minute,
				now: clock.Now, log: zap.NewNop(), last: map[string]bool{}}
			for _, ep := range []struct {
				path string
				h    http.Handler
				want int
			}{{"/healthz", h.handler("healthz", endpointHealthz), tc.wantHealthz}, {"/livez", h.handler("livez", endpointLivez), 200}} {
				rec := httptest.NewRecorder()
				ep.h.ServeHTTP(rec, httptest.NewRequest("GET", ep.path, nil))
				if rec.Code != ep.want {
					t.Errorf("%s %d, want %d: %s", ep.path, rec.Code, ep.want, rec.Body)
				}
				for _, secret := range []string{"10.96.0.10", "ns/web", "IPVSP-SERVICE", "set is full"} {
					if strings.Contains(rec.Body.String(), secret) {
						t.Errorf("%s tells %q: %s", ep.path, secret, rec.Body)
					}
				}
			}
			_, r := ask(t, h.handler("healthz", endpointHealthz))
			if got := strings.Join(r.Reasons, "; "); !strings.Contains(got, tc.wantReason) {
				t.Errorf("/healthz reasons %q, want one with %q", got, tc.wantReason)
			}
			if diff := cmp.Diff(tc.st.Failing, r.Failing); diff != "" {
				t.Errorf("/healthz failing (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLivezLoopStalled: /livez fails once the sync loop has neither
// started nor finished an iteration for the loop limit (a sync stuck in
// the kernel, a deadlock): what a restart can fix. /healthz fails with it.
func TestLivezLoopStalled(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	st := agent.Status{LastSuccessfulSync: t0, NodeEligible: true, LoopHeartbeat: t0}
	tests := []struct {
		after      time.Duration
		want       int
		wantReason string
	}{
		{59 * time.Second, 200, ""},
		{time.Minute, 503, "sync loop stalled for 1m0s (limit 1m0s)"},
		{time.Hour, 503, "sync loop stalled for 1h0m0s"},
	}
	for _, tc := range tests {
		clock := &fakeClock{t: t0.Add(tc.after)}
		h := &healthz{status: func() agent.Status { return st }, timeout: 10 * time.Second, loopTimeout: time.Minute,
			now: clock.Now, log: zap.NewNop(), last: map[string]bool{}}
		for _, ep := range []struct {
			name string
			kind endpoint
		}{{"livez", endpointLivez}, {"healthz", endpointHealthz}} {
			code, r := ask(t, h.handler(ep.name, ep.kind))
			if code != tc.want || !strings.Contains(strings.Join(r.Reasons, "; "), tc.wantReason) {
				t.Errorf("after %v: /%s %d %q, want %d with %q", tc.after, ep.name, code, r.Reasons, tc.want, tc.wantReason)
			}
		}
		if h.proxyHealthy() != (tc.want == 200) {
			t.Errorf("after %v: proxyHealthy() %v", tc.after, h.proxyHealthy())
		}
	}
}

// proxyHealthyReasons is a test helper: why the health-check node ports
// count no endpoint.
func (h *healthz) proxyHealthyReasons() []string { return h.report(endpointProxy).Reasons }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestStartOperations serves metrics and health on real sockets, on one
// address or two, and refuses an address in use.
func TestStartOperations(t *testing.T) {
	status := &fakeStatus{}
	reg := prometheus.NewRegistry()
	m := agent.NewMetrics(reg)
	m.VirtualServers.Set(3)
	ops, err := Start(context.Background(), Config{MetricsAddr: "127.0.0.1:0", HealthzAddr: "127.0.0.1:0",
		SyncPeriod: time.Second, Registry: reg, Status: status.Status,
		APICheck: func(context.Context) error { return nil }}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Stop()
	// "127.0.0.1:0" twice is one configured address: one server.
	base := "http://" + ops.addrs["127.0.0.1:0"].String()
	if code, _ := get(t, base+"/healthz"); code != 503 {
		t.Errorf("/healthz before any sync: %d", code)
	}
	status.Set(agent.Status{LastSuccessfulSync: time.Now(), NodeEligible: true, LoopHeartbeat: time.Now()})
	if code, body := get(t, base+"/livez"); code != 200 || !strings.Contains(body, `"healthy":true`) {
		t.Errorf("/livez after a sync: %d %s", code, body)
	}
	code, body := get(t, base+"/metrics")
	for _, want := range []string{"ipvs_proxy_virtual_servers 3", `kubeproxy_proxy_healthz_total{code="503"} 1`,
		`kubeproxy_proxy_livez_total{code="200"} 1`, "go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if ops.healthCheck == nil {
		t.Error("no health-check server")
	}

	// Separate addresses; one of them taken.
	taken := ops.addrs["127.0.0.1:0"].String()
	_, err = Start(context.Background(), Config{MetricsAddr: "127.0.0.1:0", HealthzAddr: taken,
		SyncPeriod: time.Second, Registry: prometheus.NewRegistry(), Status: status.Status}, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), taken) {
		t.Errorf("start on a taken address: %v", err)
	}

	// Disabled: nothing served.
	off, err := Start(context.Background(), Config{SyncPeriod: time.Second, Status: status.Status}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if len(off.addrs) != 0 {
		t.Errorf("served %v with both addresses empty", off.addrs)
	}
	off.Stop()
}

// TestDebugEndpoints: /statusz (the Services' errors: names, addresses) and
// pprof are served on the debug address alone, loopback unless the
// operator names another one (then with a warning), never on the metrics
// or health addresses that Prometheus and load balancers reach; `ipvs-proxy
// status` reads /statusz there.
func TestDebugEndpoints(t *testing.T) {
	status := &fakeStatus{}
	status.Set(agent.Status{LastSuccessfulSync: time.Now(), NodeEligible: true, LoopHeartbeat: time.Now(), Failing: []string{"iptables glue"},
		LastError: errors.New("iptables glue: iptables-restore: line 3 failed")})
	problems := func() []reconciler.ServiceStatus {
		return []reconciler.ServiceStatus{{Service: types.NamespacedName{Namespace: "ns", Name: "web"}, Failures: 2,
			LastError: "add-virtual-server 10.96.0.10:80/TCP mh: no such file or directory",
			NextRetry: time.Date(2026, 11, 23, 10, 0, 2, 0, time.UTC)}}
	}
	core, logs := observer.New(zap.WarnLevel)
	ops, err := Start(context.Background(), Config{MetricsAddr: "0.0.0.0:0", HealthzAddr: "127.0.0.1:0", DebugAddr: "127.0.0.2:0",
		Profiling: true, SyncPeriod: time.Second, Registry: prometheus.NewRegistry(), Status: status.Status, Problems: problems},
		zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Stop()
	if n := logs.Len(); n != 0 {
		t.Errorf("%d warnings with the debug endpoints on loopback: %v", n, logs.All())
	}
	metrics := "http://" + ops.addrs["0.0.0.0:0"].String()
	health := "http://" + ops.addrs["127.0.0.1:0"].String()
	debug := "http://" + ops.addrs["127.0.0.2:0"].String()
	for _, url := range []string{metrics + "/statusz", metrics + "/debug/pprof/heap", health + "/statusz", health + "/debug/pprof/"} {
		if code, body := get(t, url); code != 404 {
			t.Errorf("GET %s: %d %.80q, want 404 (the debug address alone serves it)", url, code, body)
		}
	}
	if code, body := get(t, debug+"/debug/pprof/heap?debug=1"); code != 200 || !strings.Contains(body, "heap profile") {
		t.Errorf("/debug/pprof/heap on the debug address with --profiling: %d %.80q", code, body)
	}
	if code, body := get(t, debug+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ index on the debug address with --profiling: %d %.80q", code, body)
	}
	if code, _ := get(t, debug+"/metrics"); code != 404 {
		t.Errorf("/metrics on the debug address: %d, want 404", code)
	}
	// /statusz, as `ipvs-proxy status` reads it.
	next := time.Date(2026, 11, 23, 10, 0, 2, 0, time.UTC)
	wantAgent := AgentStatus{Available: true, Failing: []string{"iptables glue"}, LastSyncError: "iptables glue: iptables-restore: line 3 failed",
		Services: []ServiceStatus{{Service: "ns/web", Failures: 2,
			LastError: "add-virtual-server 10.96.0.10:80/TCP mh: no such file or directory", NextRetry: &next}}}
	if diff := cmp.Diff(wantAgent, ReadAgentStatus(context.Background(), ops.addrs["127.0.0.2:0"].String())); diff != "" {
		t.Errorf("the agent's status via /statusz (-want +got):\n%s", diff)
	}
	if got := ReadAgentStatus(context.Background(), "127.0.0.1:1"); got.Available || !strings.Contains(got.Error, "does not answer") {
		t.Errorf("status of an agent that does not run: %+v", got)
	}
	if got := ReadAgentStatus(context.Background(), ""); got.Available || !strings.Contains(got.Error, "--debug-bind-address") {
		t.Errorf("status without a debug address: %+v", got)
	}

	// Profiling is off unless asked for.
	noProf, err := Start(context.Background(), Config{DebugAddr: "127.0.0.1:0", SyncPeriod: time.Second, Status: status.Status,
		Problems: problems}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer noProf.Stop()
	if code, _ := get(t, "http://"+noProf.addrs["127.0.0.1:0"].String()+"/debug/pprof/heap"); code != 404 {
		t.Errorf("/debug/pprof/heap without --profiling: %d, want 404", code)
	}

	// Asked for on every address: served, with a warning.
	core, logs = observer.New(zap.WarnLevel)
	open, err := Start(context.Background(), Config{DebugAddr: "0.0.0.0:0", SyncPeriod: time.Second, Status: status.Status},
		zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Stop()
	if code, _ := get(t, "http://"+open.addrs["0.0.0.0:0"].String()+"/statusz"); code != 200 {
		t.Errorf("/statusz on a debug address of 0.0.0.0: %d", code)
	}
	if w := logs.FilterMessageSnippet("not loopback").All(); len(w) != 1 || w[0].ContextMap()["address"] != "0.0.0.0:0" {
		t.Errorf("warnings for a debug address of 0.0.0.0: %v", logs.All())
	}
}
