package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// labelsOf is a series' labels, name=value, sorted.
func labelsOf(m *dto.Metric) string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// TestClientMetrics: a client built as the agent builds it (NewClient,
// from a kubeconfig) reports its requests to the registry under
// kube-proxy's names, labels and buckets: a list (200), a list of a
// resource the server does not serve (404) and a list that the server
// throttles once (429, then 200).
// testClientMetrics is the registry of client-go's metrics in this test
// binary: client-go takes one registration per process.
var testClientMetrics struct {
	sync.Once
	reg *prometheus.Registry
	err error
}

func TestClientMetrics(t *testing.T) {
	var throttled atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/services":
			fmt.Fprint(w, `{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`)
		case "/api/v1/nodes":
			if !throttled.Swap(true) {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`)
				return
			}
			fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"n1"}}]}`)
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	if !strings.HasPrefix(host, "127.0.0.1:") {
		t.Fatalf("the test server listens on %s, not 127.0.0.1", host)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}

	// Once per process (client-go keeps the first registration): a run with
	// -count=2 reuses it; each run's server has its own host label.
	testClientMetrics.Do(func() {
		testClientMetrics.reg = prometheus.NewRegistry()
		testClientMetrics.err = RegisterClientMetrics(testClientMetrics.reg)
	})
	reg := testClientMetrics.reg
	if testClientMetrics.err != nil {
		t.Fatal(testClientMetrics.err)
	}
	if err := RegisterClientMetrics(prometheus.NewRegistry()); err == nil {
		t.Error("a second RegisterClientMetrics succeeded: its registry would stay empty")
	}
	client, err := NewClient(kubeconfig, "ipvs-proxy/test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.Services().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ServiceCIDRs().List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("list ServiceCIDRs of an apiserver without them: %v, want NotFound", err)
	}
	if nodes, err := client.Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("list Nodes after a 429: %v, %v", nodes, err)
	}

	fams := families(t, reg)
	// This run's series: its server's host (earlier runs' stay in reg).
	mine := func(name string) []*dto.Metric {
		var out []*dto.Metric
		for _, m := range fams[name].GetMetric() {
			if strings.Contains(labelsOf(m), "host="+host+",") {
				out = append(out, m)
			}
		}
		return out
	}
	counts := func(name string) map[string]float64 {
		out := map[string]float64{}
		for _, m := range mine(name) {
			out[labelsOf(m)] = m.GetCounter().GetValue()
		}
		return out
	}
	// client-go counts every response, the 429 too, and a retry by the
	// response to it.
	if diff := cmp.Diff(map[string]float64{
		"code=200,host=" + host + ",method=GET": 2,
		"code=404,host=" + host + ",method=GET": 1,
		"code=429,host=" + host + ",method=GET": 1,
	}, counts("rest_client_requests_total")); diff != "" {
		t.Errorf("rest_client_requests_total (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"code=200,host=" + host + ",verb=GET": 1},
		counts("rest_client_request_retries_total")); diff != "" {
		t.Errorf("rest_client_request_retries_total (-want +got):\n%s", diff)
	}
	// kube-proxy's buckets, as k8s.io/component-base/metrics/prometheus/restclient
	// (v0.36) writes them.
	kubeProxyBuckets := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}
	for name, want := range map[string]uint64{
		"rest_client_request_duration_seconds":      3, // each request, its retries included
		"rest_client_rate_limiter_duration_seconds": 4, // each attempt waits for the client's rate limiter
	} {
		ms := mine(name)
		if len(ms) != 1 || labelsOf(ms[0]) != "host="+host+",verb=GET" {
			t.Errorf("%s: series %v, want one of host=%s,verb=GET", name, ms, host)
			continue
		}
		h := ms[0].GetHistogram()
		if h.GetSampleCount() != want {
			t.Errorf("%s: %d samples, want %d", name, h.GetSampleCount(), want)
		}
		var bounds []float64
		for _, b := range h.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if diff := cmp.Diff(kubeProxyBuckets, bounds); diff != "" {
			t.Errorf("%s: buckets (-kube-proxy's +got):\n%s", name, diff)
		}
	}
}
