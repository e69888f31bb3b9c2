package opsserver

import (
	"context"
	"encoding/json"
	"errors"
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

// TestHealthz walks /healthz and /livez through kube-proxy's rules.
func TestHealthz(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}
	status := &fakeStatus{}
	probeErr := errors.New("connection refused")
	var apiDown bool
	api := &apiProbe{interval: time.Second, now: clock.Now, log: zap.NewNop(), check: func(context.Context) error {
		if apiDown {
			return probeErr
		}
		return nil
	}}
	h := &healthz{status: status.Status, api: api, timeout: 10 * time.Second, now: clock.Now, log: zap.NewNop(), last: map[string]bool{}}
	healthzH, livezH := h.handler("healthz", true), h.handler("livez", false)
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

	expect("before the first sync", 503, 503, "no successful sync yet")

	synced := clock.Now()
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true})
	if r := expect("after the first sync", 200, 200, ""); !r.LastUpdated.Equal(clock.Now()) {
		t.Errorf("healthy lastUpdated = %v, want the current time (kube-proxy)", r.LastUpdated)
	}

	// A change waits: healthy until the timeout.
	clock.Step(time.Second)
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true, PendingSince: clock.Now(), Pending: 1})
	clock.Step(9 * time.Second)
	expect("pending 9s", 200, 200, "")
	status.Set(agent.Status{LastSuccessfulSync: synced, NodeEligible: true, PendingSince: clock.Now().Add(-9 * time.Second),
		LastError: errors.New("injected: busy")})
	clock.Step(time.Second)
	r := expect("pending 10s and failing", 503, 503, "changes unapplied for 10s")
	if r.LastError != "injected: busy" || !r.LastUpdated.Equal(synced) {
		t.Errorf("unhealthy report: lastError %q lastUpdated %v, want the error and the last sync %v", r.LastError, r.LastUpdated, synced)
	}
	if len(h.proxyHealthyReasons()) == 0 || h.proxyHealthy() {
		t.Errorf("proxyHealthy() with changes stuck")
	}

	// Synced again.
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: true})
	expect("synced again", 200, 200, "")

	// The node goes away: /healthz only.
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: false})
	if r := expect("node not eligible", 503, 200, "node not eligible"); *r.NodeEligible {
		t.Errorf("nodeEligible true")
	}
	status.Set(agent.Status{LastSuccessfulSync: clock.Now(), NodeEligible: true})

	// The apiserver stops answering: /healthz fails after the timeout.
	apiDown = true
	api.probeOnce(context.Background())
	clock.Step(5 * time.Second)
	api.probeOnce(context.Background())
	if r := expect("apiserver unreachable 5s", 200, 200, ""); r.APIServerUnreachableSince == nil {
		t.Errorf("apiserverUnreachableSince not reported")
	}
	clock.Step(5 * time.Second)
	expect("apiserver unreachable 10s", 503, 200, "apiserver unreachable for 10s")
	apiDown = false
	api.probeOnce(context.Background())
	if r := expect("apiserver back", 200, 200, ""); r.APIServerUnreachableSince != nil {
		t.Errorf("apiserverUnreachableSince still set: %v", r.APIServerUnreachableSince)
	}
}

// proxyHealthyReasons is a test helper: why /livez fails.
func (h *healthz) proxyHealthyReasons() []string { return h.report(false).Reasons }

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
		APICheck: func(context.Context) error { return nil }, Problems: func() []reconciler.ServiceStatus {
			return []reconciler.ServiceStatus{{Service: types.NamespacedName{Namespace: "ns", Name: "web"}, Failures: 2,
				LastError: "add-virtual-server 10.96.0.10:80/TCP mh: no such file or directory",
				NextRetry: time.Date(2026, 11, 23, 10, 0, 2, 0, time.UTC)}}
		}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Stop()
	// "127.0.0.1:0" twice is one configured address: one server.
	base := "http://" + ops.addrs["127.0.0.1:0"].String()
	if code, _ := get(t, base+"/healthz"); code != 503 {
		t.Errorf("/healthz before any sync: %d", code)
	}
	status.Set(agent.Status{LastSuccessfulSync: time.Now(), NodeEligible: true})
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
	// /statusz, as `ipvs-proxy status` reads it.
	next := time.Date(2026, 11, 23, 10, 0, 2, 0, time.UTC)
	wantAgent := AgentStatus{Available: true, Services: []ServiceStatus{{Service: "ns/web", Failures: 2,
		LastError: "add-virtual-server 10.96.0.10:80/TCP mh: no such file or directory", NextRetry: &next}}}
	if diff := cmp.Diff(wantAgent, ReadAgentStatus(context.Background(), ops.addrs["127.0.0.1:0"].String())); diff != "" {
		t.Errorf("the agent's status via /statusz (-want +got):\n%s", diff)
	}
	// Profiling is off unless asked for.
	if code, _ := get(t, base+"/debug/pprof/heap"); code != 404 {
		t.Errorf("/debug/pprof/heap without --profiling: %d, want 404", code)
	}
	prof, err := Start(context.Background(), Config{MetricsAddr: "127.0.0.1:0", Profiling: true,
		SyncPeriod: time.Second, Registry: prometheus.NewRegistry(), Status: status.Status}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer prof.Stop()
	pbase := "http://" + prof.addrs["127.0.0.1:0"].String()
	if code, body := get(t, pbase+"/debug/pprof/heap?debug=1"); code != 200 || !strings.Contains(body, "heap profile") {
		t.Errorf("/debug/pprof/heap with --profiling: %d %.80q", code, body)
	}
	if code, body := get(t, pbase+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ index with --profiling: %d %.80q", code, body)
	}
	if got := ReadAgentStatus(context.Background(), "127.0.0.1:1"); got.Available || !strings.Contains(got.Error, "does not answer") {
		t.Errorf("status of an agent that does not run: %+v", got)
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
