package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/grafana"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
)

// The agent's endpoints as the bed runs it (agentArgs), reached from
// inside the VM.
const (
	healthzURL = "http://127.0.0.1:10256/healthz"
	livezURL   = "http://127.0.0.1:10256/livez"
	metricsURL = "http://127.0.0.1:10249/metrics"
	// healthLimit is 2 × the bed's --sync-period (5s): how long changes
	// may wait before /healthz fails (an unreachable apiserver never
	// fails it).
	healthLimit = 10 * time.Second
)

// httpGet GETs url inside the VM (argv: prefix, e.g. a netns exec, then
// vmagent http); code 0 means no HTTP answer at all.
func (e env) httpGet(t *testing.T, url string, prefix ...string) (code int, body string) {
	t.Helper()
	code, body, err := e.VM.HTTPGet(context.Background(), url, prefix...)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return code, body
}

// scrape reads the agent's metrics: sample (name with its labels as
// written) -> value.
func (e env) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := e.Metrics(context.Background(), metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// endpointsOn are EndpointSlice entries without processes behind them
// (for what only counts endpoints), in 10.103.0.0/24.
func endpointsOn(nodes ...string) []backend {
	var out []backend
	for i, n := range nodes {
		out = append(out, bed.Backend{Name: fmt.Sprintf("ep%d", i), Addr: fmt.Sprintf("10.103.0.%d", i+10), Node: n})
	}
	return out
}

// TestMetricsScraped: metrics scraped inside the VM change when a Service
// is added: virtual and real servers, the programming latency histogram,
// the syncs, the changes received and the time the last was queued; and
// the Grafana dashboard queries only metrics the agent exports.
func TestMetricsScraped(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	before := e.scrape(t)
	const (
		vs       = "ipvs_proxy_virtual_servers"
		rs       = "ipvs_proxy_real_servers"
		latency  = "kubeproxy_network_programming_duration_seconds_count"
		partial  = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count"
		lastSync = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
		queued   = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
		svcs     = "kubeproxy_sync_proxy_rules_service_changes_total"
		eps      = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
	)
	for _, m := range []string{vs, rs, latency, lastSync, queued, svcs, eps, "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
		"kubeproxy_sync_proxy_rules_duration_seconds_count", "ipvs_proxy_resync_duration_seconds_count",
		"ipvs_proxy_sync_errors_total", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := before[m]; !ok {
			t.Errorf("metric %s missing", m)
		}
	}
	start := time.Now()
	svc := e.createService(t, ns, "metrics", []corev1.ServicePort{tcpPort("http", 80), tcpPort("alt", 8080)})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, endpointsOn(nodeName, otherNode))
	var after map[string]float64
	eventually(t, 30*time.Second, func() error {
		after = e.scrape(t)
		switch {
		case after[vs] < before[vs]+2:
			return fmt.Errorf("%s %v -> %v, want +2", vs, before[vs], after[vs])
		case after[rs] < before[rs]+4:
			return fmt.Errorf("%s %v -> %v, want +4", rs, before[rs], after[rs])
		case after[latency] <= before[latency]:
			return fmt.Errorf("%s %v -> %v, want more", latency, before[latency], after[latency])
		case after[partial] <= before[partial]:
			return fmt.Errorf("%s %v -> %v, want more", partial, before[partial], after[partial])
		case after[lastSync] < before[lastSync] || after[lastSync] == 0:
			return fmt.Errorf("%s %v -> %v", lastSync, before[lastSync], after[lastSync])
		case after[svcs] <= before[svcs] || after[eps] <= before[eps] || after[queued] <= before[queued]:
			return fmt.Errorf("changes %s %v -> %v, %s %v -> %v, %s %v -> %v, want more", svcs, before[svcs], after[svcs],
				eps, before[eps], after[eps], queued, before[queued], after[queued])
		}
		return nil
	})
	t.Logf("after %v: %s %v->%v, %s %v->%v, %s %v->%v, %s %v->%v", time.Since(start).Round(time.Millisecond),
		vs, before[vs], after[vs], rs, before[rs], after[rs], latency, before[latency], after[latency],
		partial, before[partial], after[partial])
	e.expectTable(t, []string{"TCP  " + hostPort(svc.Spec.ClusterIP, 80) + " rr"}, nil)
	if after["ipvs_proxy_sync_errors_total"] != before["ipvs_proxy_sync_errors_total"] {
		t.Errorf("sync errors %v -> %v", before["ipvs_proxy_sync_errors_total"], after["ipvs_proxy_sync_errors_total"])
	}
	dashboardMetricsExported(t, after)
}

// onlyWhileFailing are the agent's series that exist only while something
// fails (a node-wide part's failure), by their label names.
var onlyWhileFailing = map[string][]string{"ipvs_proxy_node_sync_failing": {"part"}}

// dashboardMetricsExported: every metric the Grafana dashboard
// (deploy/grafana) queries is among the agent's scraped series, with every
// label the query names (but Prometheus' own job and instance).
func dashboardMetricsExported(t *testing.T, scraped map[string]float64) {
	t.Helper()
	labels := map[string]map[string]bool{} // series name -> its label names
	labelName := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for series := range scraped {
		name, rest, _ := strings.Cut(series, "{")
		if labels[name] == nil {
			labels[name] = map[string]bool{}
		}
		for _, m := range labelName.FindAllStringSubmatch(rest, -1) {
			labels[name][m[1]] = true
		}
	}
	series := map[string][]string{}
	for name, ls := range labels {
		series[name] = slices.Sorted(maps.Keys(ls))
	}
	// Series that exist only while something fails: a healthy agent
	// exports none of them, with the labels the agent gives them.
	for name, ls := range onlyWhileFailing {
		if _, ok := series[name]; !ok {
			series[name] = ls
		}
	}
	problems, used := grafana.Check(grafana.Dashboard, series)
	for _, p := range problems {
		t.Errorf("dashboard: %s", p)
	}
	t.Logf("the dashboard's queries name %d metrics of the agent: %v", len(used), used)
}

// healthOf GETs a health endpoint and decodes its JSON.
func (e env) healthOf(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	code, body := e.httpGet(t, url)
	var m map[string]any
	if code != 0 {
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("GET %s: %d %q: %v", url, code, body, err)
		}
	}
	return code, m
}

// waitHealth waits until url answers want.
func (e env) waitHealth(t *testing.T, url string, want int, timeout time.Duration) map[string]any {
	t.Helper()
	var body map[string]any
	eventually(t, timeout, func() error {
		var code int
		code, body = e.healthOf(t, url)
		if code != want {
			return fmt.Errorf("GET %s: %d %v, want %d", url, code, body, want)
		}
		return nil
	})
	return body
}

// TestHealthzFollowsAPIServer: /healthz answers kube-proxy's JSON, with no
// error text in it (it is served on every address, unauthenticated). While
// the apiserver is unreachable, for well past 2 × --sync-period, /healthz
// stays 200 and says since when (apiserverUnreachableSince), as
// kube-proxy's stays 200 while its rules are in sync: load balancers that
// check it must not drain every node in a control-plane outage; /livez
// (the sync loop alive) stays 200. When the apiserver returns the report
// clears, and the agent's watches resume.
func TestHealthzFollowsAPIServer(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	body := e.waitHealth(t, healthzURL, 200, time.Minute)
	for _, k := range []string{"lastUpdated", "currentTime", "nodeEligible", "healthy", "lastSuccessfulSync", "loopHeartbeat"} {
		if _, ok := body[k]; !ok {
			t.Errorf("/healthz body lacks %q: %v", k, body)
		}
	}
	if body["nodeEligible"] != true || body["healthy"] != true {
		t.Errorf("/healthz: %v", body)
	}
	if code, lbody := e.healthOf(t, livezURL); code != 200 || lbody["nodeEligible"] != nil {
		t.Errorf("/livez: %d %v (want 200, no nodeEligible)", code, lbody)
	}

	// The bed is shared: whatever happens, the apiserver comes back and
	// the agent is healthy before the next test.
	apiDown := false
	t.Cleanup(func() {
		if apiDown {
			if err := e.CP.StartAPIServer(context.Background()); err != nil {
				t.Errorf("restart the apiserver: %v", err)
				return
			}
			e.waitHealth(t, healthzURL, 200, 2*time.Minute)
		}
	})

	apiDown = true
	e.CP.StopAPIServer()
	stopped := time.Now()
	// The probe notices within half the limit; then /healthz stays 200 for
	// three limits more, polled every second.
	var reported time.Duration
	var unreachable map[string]any
	for hold := 3 * healthLimit; reported == 0 || time.Since(stopped) < reported+hold; time.Sleep(time.Second) {
		if code, lbody := e.healthOf(t, livezURL); code != 200 {
			t.Errorf("/livez %d %v after the apiserver stopped", code, lbody)
		}
		code, hbody := e.healthOf(t, healthzURL)
		if code != 200 {
			t.Fatalf("/healthz %d %v after the apiserver stopped, want 200 (kube-proxy's rule)", code, hbody)
		}
		if _, ok := hbody["lastError"]; ok {
			t.Errorf("/healthz tells the last error: %v", hbody)
		}
		switch {
		case hbody["apiserverUnreachableSince"] != nil && reported == 0:
			reported, unreachable = time.Since(stopped), hbody
		case reported == 0 && time.Since(stopped) > 2*healthLimit:
			t.Fatalf("/healthz without apiserverUnreachableSince %v after the apiserver stopped: %v", time.Since(stopped), hbody)
		}
	}
	if unreachable["healthy"] != true || unreachable["reasons"] != nil {
		t.Errorf("/healthz while the apiserver is unreachable: %v", unreachable)
	}

	restart := time.Now()
	if err := e.CP.StartAPIServer(context.Background()); err != nil {
		t.Fatalf("restart the apiserver: %v", err)
	}
	apiDown = false
	apiBack := time.Since(restart)
	eventually(t, 2*time.Minute, func() error {
		if code, b := e.healthOf(t, healthzURL); code != 200 || b["apiserverUnreachableSince"] != nil {
			return fmt.Errorf("/healthz %d %v after the apiserver's restart", code, b)
		}
		return nil
	})
	cleared := time.Since(restart)

	// The agent's watches resume: a new Service is programmed.
	svc := e.createService(t, ns, "after-outage", []corev1.ServicePort{tcpPort("http", 80)})
	created := time.Now()
	eventually(t, 2*time.Minute, func() error {
		if out := e.ipvsadm(t); !strings.Contains(out, hostPort(svc.Spec.ClusterIP, 80)) {
			return fmt.Errorf("%s not programmed after the apiserver came back", hostPort(svc.Spec.ClusterIP, 80))
		}
		return nil
	})
	t.Logf("apiserver unreachable reported %v after its stop, /healthz and /livez 200 throughout %v of outage (limit %v); "+
		"apiserver ready %v after restart, reported reachable after %v; a new Service programmed %v after its creation",
		reported.Round(time.Millisecond), restart.Sub(stopped).Round(time.Second), healthLimit,
		apiBack.Round(time.Millisecond), cleared.Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
}

// TestHealthCheckNodePort: a LoadBalancer Service with
// externalTrafficPolicy Local gets a health-check node port on the node:
// 200 with the count of this node's endpoints, 503 when it has none,
// closed when the Service goes.
func TestHealthCheckNodePort(t *testing.T) {
	e := setup(t)
	ns := e.namespace(t)
	svc := e.createService(t, ns, "local", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		t.Fatalf("the apiserver allocated no healthCheckNodePort: %+v", svc.Spec)
	}
	url := fmt.Sprintf("http://%s/", hostPort(nodeAddr, port))
	eps := endpointsOn(nodeName, nodeName, otherNode)

	type answer struct {
		Service struct {
			Namespace, Name string
		} `json:"service"`
		LocalEndpoints int `json:"localEndpoints"`
	}
	expect := func(want, wantCount int, prefix ...string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			code, body := e.httpGet(t, url, prefix...)
			if code != want {
				return fmt.Errorf("GET %s: %d %s, want %d", url, code, body, want)
			}
			if want == 0 {
				return nil
			}
			var a answer
			if err := json.Unmarshal([]byte(body), &a); err != nil {
				return fmt.Errorf("GET %s: %q: %w", url, body, err)
			}
			if a.LocalEndpoints != wantCount || a.Service.Namespace != ns || a.Service.Name != "local" {
				return fmt.Errorf("GET %s: %s, want %d local endpoints of %s/local", url, body, wantCount, ns)
			}
			return nil
		})
	}

	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, eps)
	expect(200, 2)
	// As a load balancer's probe would come: from outside the node's
	// namespace.
	expect(200, 2, "vmagent", "netns", "exec", bed.ClientNetns, "--")

	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, eps[2:])
	expect(503, 0)

	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, eps[:1])
	expect(200, 1)

	if err := e.Client.CoreV1().Services(ns).Delete(context.Background(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(0, 0)
}
