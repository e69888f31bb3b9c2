package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/grafana"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/prometheus"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// monitoringJob is the one-node cluster's monitoring.job: kube-proxy's, the
// job kubernetes-mixin's Proxy dashboard selects.
const monitoringJob = "kube-proxy"

// rateInterval stands for Grafana's $__rate_interval: 4 × its default
// scrape interval (15 s), and the mixin's minimum interval (1m).
const rateInterval = "1m"

// mixinProxySource is where mixinProxy's queries come from.
const mixinProxySource = "kubernetes-monitoring/kubernetes-mixin dashboards/proxy.libsonnet at aa38e2bfa7ea6ec6870420b483046afe790a6411"

// mixinProxy are the queries of kubernetes-mixin's Proxy dashboard
// (mixinProxySource) with the mixin's default configuration
// (kubeProxySelector job="kube-proxy", clusterLabel cluster,
// grafanaIntervalVar $__rate_interval): its two variables' selectors and
// every panel's targets.
var mixinProxy = []grafana.Query{
	{Where: "variable cluster", Expr: `up{job="kube-proxy"}`},
	{Where: "variable instance", Expr: `up{job="kube-proxy", cluster="$cluster", job="kube-proxy"}`},
	{Where: "Up", Expr: `sum(up{cluster="$cluster", job="kube-proxy"})`},
	{Where: "Rules Sync Rate", Expr: `sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))`},
	{Where: "Rules Sync Latency 99th Quantile", Expr: `histogram_quantile(0.99,rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))`},
	{Where: "Network Programming Rate", Expr: `sum(rate(kubeproxy_network_programming_duration_seconds_count{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval]))`},
	{Where: "Network Programming Latency 99th Quantile", Expr: `histogram_quantile(0.99, sum(rate(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance"}[$__rate_interval])) by (instance, le))`},
	{Where: "Kube API Request Rate 2xx", Expr: `sum(rate(rest_client_requests_total{cluster="$cluster",job="kube-proxy", instance=~"$instance",code=~"2.."}[$__rate_interval]))`},
	{Where: "Kube API Request Rate 3xx", Expr: `sum(rate(rest_client_requests_total{cluster="$cluster",job="kube-proxy", instance=~"$instance",code=~"3.."}[$__rate_interval]))`},
	{Where: "Kube API Request Rate 4xx", Expr: `sum(rate(rest_client_requests_total{cluster="$cluster",job="kube-proxy", instance=~"$instance",code=~"4.."}[$__rate_interval]))`},
	{Where: "Kube API Request Rate 5xx", Expr: `sum(rate(rest_client_requests_total{cluster="$cluster",job="kube-proxy", instance=~"$instance",code=~"5.."}[$__rate_interval]))`},
	{Where: "Post Request Latency 99th Quantile", Expr: `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", job="kube-proxy",instance=~"$instance",verb="POST"}[$__rate_interval])) by (verb, le))`},
	{Where: "Get Request Latency 99th Quantile", Expr: `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", job="kube-proxy", instance=~"$instance", verb="GET"}[$__rate_interval])) by (verb, le))`},
	{Where: "Memory", Expr: `process_resident_memory_bytes{cluster="$cluster", job="kube-proxy",instance=~"$instance"}`},
	{Where: "CPU usage", Expr: `rate(process_cpu_seconds_total{cluster="$cluster", job="kube-proxy",instance=~"$instance"}[$__rate_interval])`},
	{Where: "Goroutines", Expr: `go_goroutines{cluster="$cluster", job="kube-proxy",instance=~"$instance"}`},
}

// onlyOnAPIAnswers are mixin queries that have data only once the
// apiserver has answered the agent with such a status: client-go follows
// redirects (no 3xx is counted) and a healthy apiserver answers no 5xx.
var onlyOnAPIAnswers = map[string]string{
	"Kube API Request Rate 3xx": "client-go follows redirects: no 3xx is ever counted",
	"Kube API Request Rate 5xx": "the apiserver answered no 5xx",
}

// TestPrometheusScrapesAgents: a real Prometheus server (built from the
// module e2e/tools/prometheus pins, run in the node's VM) scrapes the
// one-node cluster's agents through the scrape job the Prometheus Operator
// would generate from the chart's rendered ServiceMonitor, and loads the
// chart's rendered PrometheusRule. Every node's agent is an `up` target
// with the chart's job and node labels; after Service changes, traffic,
// a Warning Event and a churn of Services, every query of the dashboard
// the chart ships (read from its ConfigMap in the cluster) and of
// kubernetes-mixin's Proxy dashboard returns data, but those that exist
// only while something fails; every alert rule is loaded, evaluates with
// health ok, and none fires or is pending on the healthy node.
func TestPrometheusScrapesAgents(t *testing.T) {
	began := time.Now()
	c := oneNodeCluster(t)
	own := time.Now() // the test's own part, the shared cluster up
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	srv, ruleNames := startPrometheus(ctx, t, c)
	defer srv.Close()
	defer func() {
		if t.Failed() {
			t.Logf("Prometheus's log:\n%s", tailLines(srv.Log(), 60))
		}
	}()
	from := time.Now()
	targetsUp(ctx, t, c, srv)
	monitoringChanges(ctx, t, c)
	// Two scrapes after the last change.
	time.Sleep(12 * time.Second)

	shipped := chartDashboardQueries(ctx, t, c)
	vars := map[string]string{"job": monitoringJob, "instance": ".*", "__rate_interval": rateInterval}
	answered(ctx, t, srv, "the chart's dashboard", shipped, vars, from, failingOnly(shipped))
	mixinVars := map[string]string{"cluster": "", "instance": ".+", "__rate_interval": rateInterval}
	t.Logf("kubernetes-mixin's Proxy dashboard: %s", mixinProxySource)
	answered(ctx, t, srv, "kubernetes-mixin's Proxy dashboard", mixinProxy, mixinVars, from, onlyOnAPIAnswers)
	rulesLoaded(ctx, t, srv, ruleNames)
	t.Logf("TIMING whole test: %s, of which its own (the cluster up): %s", time.Since(began).Round(time.Millisecond),
		time.Since(own).Round(time.Millisecond))
}

// startPrometheus builds Prometheus and starts it in the node's VM with
// the scrape job translated from the chart's ServiceMonitor and the
// chart's alert rules; it returns the server and the rules' names.
func startPrometheus(ctx context.Context, t *testing.T, c *cluster.Cluster) (*prometheus.Server, []string) {
	t.Helper()
	t0 := time.Now()
	jobs, err := prometheus.ScrapeConfigs(c.ChartMonitoring, prometheus.GuestKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || !strings.HasPrefix(jobs[0].JobName, "serviceMonitor/") {
		t.Fatalf("the chart's monitors give %d scrape jobs, want the ServiceMonitor's one: %+v", len(jobs), jobs)
	}
	rules, names, err := prometheus.RuleFile(c.ChartMonitoring)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := prometheus.Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(t0)
	cfg := prometheus.Config{Global: prometheus.Global{ScrapeInterval: "5s", EvaluationInterval: "5s"}, ScrapeConfigs: jobs}
	if y, err := cfg.YAML(); err == nil {
		t.Logf("Prometheus's configuration, from the chart's ServiceMonitor:\n%s", y)
	}
	srv, err := prometheus.Start(ctx, c.VM, prometheus.Options{Binary: bin, Config: cfg, Rules: rules,
		Kubeconfig: c.CP.KubeconfigFor("https://" + vm.APIServerGuestAddr)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING Prometheus built in %s, copied, started and ready in %s", built.Round(time.Millisecond), (time.Since(t0) - built).Round(time.Millisecond))
	return srv, names
}

// targetsUp waits until every Node of the cluster has exactly one active
// target, up, with the chart's job and the node's name, and no other
// target is active.
func targetsUp(ctx context.Context, t *testing.T, c *cluster.Cluster, srv *prometheus.Server) {
	t.Helper()
	t0 := time.Now()
	var targets []prometheus.Target
	waitWithin(ctx, t, 3*time.Minute, "every node's agent an up target", func() (bool, string) {
		var err error
		targets, err = srv.Targets(ctx)
		if err != nil {
			return false, err.Error()
		}
		up := map[string]int{}
		for _, tg := range targets {
			if tg.Health == "up" && tg.Labels["job"] == monitoringJob {
				up[tg.Labels["node"]]++
			}
		}
		for _, n := range c.Nodes {
			if up[n.Name] != 1 {
				return false, fmt.Sprintf("node %s: %d up targets; targets: %+v", n.Name, up[n.Name], targets)
			}
		}
		return len(targets) == len(c.Nodes), fmt.Sprintf("%d targets for %d nodes: %+v", len(targets), len(c.Nodes), targets)
	})
	var slowest float64
	for _, tg := range targets {
		slowest = max(slowest, tg.LastScrapeDuration)
		t.Logf("target %s: %s, labels %v, last scrape %.3f s", tg.ScrapeURL, tg.Health, tg.Labels, tg.LastScrapeDuration)
	}
	t.Logf("FIGURE targets up: %d/%d nodes' agents after %s; slowest last scrape %.3f s", len(targets), len(c.Nodes),
		time.Since(t0).Round(time.Millisecond), slowest)
}

// monitoringChanges gives the agent something to show: a Service with a
// pod behind it (endpoints, network programming latency) hit from the
// node, a Service with an unknown scheduler (a Warning Event: a POST), a
// namespace deleted while its bad Service's Event is due (the Event may be
// refused, a 4xx), 20 s of Services created and deleted back to back
// (changes waiting for a sync, partial syncs), and one more bad Service (a
// second POST).
func monitoringChanges(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	t0 := time.Now()
	cs := c.Client
	const ns = "monitoring"
	clusterNamespace(ctx, t, cs, ns)
	server := agentPod("server", []string{"/vmagent", "serve", "--name", "server", "--port", "8080", "--tcp"})
	server.Labels = map[string]string{"app": "server"}
	runPods(ctx, t, c, ns, server)
	svc := monitoringService("web", map[string]string{"app": "server"}, nil)
	created, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := created.Spec.ClusterIP + ":80"
	waitFor(ctx, t, "Service web in IPVS with its pod", func() (bool, string) {
		out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", vip)
		return err == nil && strings.Contains(out, ":8080"), out + fmt.Sprint(err)
	})
	if hit, err := c.VM.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: vip, N: 5}); err != nil || hit.Answers["server"] != 5 {
		t.Errorf("the node -> %s: %+v, %v; want 5 answers from server", vip, hit, err)
	}
	bad := monitoringService("bad-scheduler", nil, map[string]string{"ipvs-proxy.io/scheduler": "no-such-scheduler"})
	if _, err := cs.CoreV1().Services(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	goneNamespace(ctx, t, c)
	// Changes back to back for 20 s: one arrives within milliseconds of
	// each sync, and waits at least minSyncPeriod (1 s) for the next, so
	// every scrape meanwhile (four at 5 s) sees a change waiting.
	churn := 0
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); churn++ {
		name := fmt.Sprintf("churn-%d", churn)
		if _, err := cs.CoreV1().Services(ns).Create(ctx, monitoringService(name, nil, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if churn > 0 {
			if err := cs.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("churn-%d", churn-1), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d Services created and deleted in 20 s", churn)
	// A second Warning Event, a POST that the rate of POSTs sees: the
	// first created the series, whose first value rate() cannot count.
	bad2 := monitoringService("bad-scheduler-2", nil, map[string]string{"ipvs-proxy.io/scheduler": "no-such-scheduler"})
	if _, err := cs.CoreV1().Services(ns).Create(ctx, bad2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING Service changes, traffic and churn: %s", time.Since(t0).Round(time.Millisecond))
}

// goneNamespace creates a namespace with a Service the agent warns about
// and deletes the namespace at once: the agent's Event for it comes while
// the namespace terminates.
func goneNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	const ns = "monitoring-gone"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := monitoringService("bad-scheduler", nil, map[string]string{"ipvs-proxy.io/scheduler": "no-such-scheduler"})
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// monitoringService is a TCP ClusterIP Service of port 80 to 8080.
func monitoringService(name string, selector, annotations map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: corev1.ServiceSpec{Selector: selector,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
}

// chartDashboardQueries reads the dashboard from the ConfigMap the chart
// rendered (dashboards.enabled) in the cluster and returns its queries.
func chartDashboardQueries(ctx context.Context, t *testing.T, c *cluster.Cluster) []grafana.Query {
	t.Helper()
	cm, err := c.Client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "ipvs-proxy-dashboards", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's dashboards ConfigMap: %v", err)
	}
	qs, err := grafana.Queries([]byte(cm.Data["ipvs-proxy.json"]))
	if err != nil {
		t.Fatal(err)
	}
	// The chart writes the file as a YAML block scalar that keeps no
	// final newline.
	if strings.TrimSuffix(string(grafana.Dashboard), "\n") != cm.Data["ipvs-proxy.json"] {
		t.Error("the chart's dashboards ConfigMap does not hold deploy/grafana/ipvs-proxy.json")
	}
	return qs
}

// failingOnly are the queries of qs that select only series that exist
// while something fails (onlyWhileFailing), with that reason.
func failingOnly(qs []grafana.Query) map[string]string {
	out := map[string]string{}
	for _, q := range qs {
		sels, err := grafana.Selectors(q.Expr)
		if err != nil || len(sels) == 0 {
			continue
		}
		if !slices.ContainsFunc(sels, func(s grafana.Selector) bool { _, ok := onlyWhileFailing[s.Metric]; return !ok }) {
			out[q.Where] = "its series exist only while a node-wide part fails"
		}
	}
	return out
}

// answered evaluates every query (its Grafana variables filled from vars)
// from `from` until now every 5 s, as a time series panel does, and wants
// a number (not NaN) among its samples, but for the queries in excused
// (by their Where, with the reason), which it reports either way.
func answered(ctx context.Context, t *testing.T, srv *prometheus.Server, what string, qs []grafana.Query, vars map[string]string, from time.Time, excused map[string]string) {
	t.Helper()
	n, excusedEmpty := 0, 0
	for _, q := range qs {
		expr, err := grafana.Expand(q.Expr, vars)
		if err != nil {
			t.Errorf("%s: %s: %v", what, q.Where, err)
			continue
		}
		res, err := srv.QueryRange(ctx, expr, from, time.Now(), 5*time.Second)
		if err != nil {
			t.Errorf("%s: %s: %v", what, q.Where, err)
			continue
		}
		numbers := 0
		for _, s := range res {
			numbers += s.Numbers()
		}
		reason, ok := excused[q.Where]
		switch {
		case numbers > 0:
			n++
			t.Logf("%s: %s: %d series, %d samples: %s", what, q.Where, len(res), numbers, expr)
		case ok:
			excusedEmpty++
			t.Logf("%s: %s: no data, as expected (%s): %s", what, q.Where, reason, expr)
		default:
			t.Errorf("%s: %s: no data (%d series, all NaN or none): %s", what, q.Where, len(res), expr)
		}
	}
	t.Logf("FIGURE %s: queries answered %d/%d (%d without data as expected)", what, n, len(qs), excusedEmpty)
}

// rulesLoaded: Prometheus has loaded exactly the chart's rules, from the
// rule file the bed wrote, each evaluated with health ok, none pending
// or firing.
func rulesLoaded(ctx context.Context, t *testing.T, srv *prometheus.Server, want []string) {
	t.Helper()
	var loaded map[string][]prometheus.Rule
	waitWithin(ctx, t, time.Minute, "every rule evaluated", func() (bool, string) {
		var err error
		loaded, err = srv.Rules(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, r := range loaded[prometheus.GuestRules] {
			if r.Health == "unknown" {
				return false, fmt.Sprintf("rule %s not evaluated yet", r.Name)
			}
		}
		return len(loaded[prometheus.GuestRules]) > 0, fmt.Sprintf("rules %+v", loaded)
	})
	var names []string
	for file, rules := range loaded {
		for _, r := range rules {
			names = append(names, r.Name)
			if file != prometheus.GuestRules || r.Health != "ok" || r.LastError != "" || r.State != "inactive" {
				t.Errorf("rule %s (%s): health %q %q, state %q; want ok, inactive, from %s", r.Name, file, r.Health, r.LastError, r.State, prometheus.GuestRules)
			}
		}
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(names))); diff != "" {
		t.Errorf("rules loaded (-the chart's +Prometheus's):\n%s", diff)
	}
	t.Logf("FIGURE rules: %d of the chart's loaded, health ok, inactive: %v", len(names), names)
}
