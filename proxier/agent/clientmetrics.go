package agent

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/metrics"
)

// restClientBuckets are kube-proxy's buckets of client-go's request and
// rate-limiter latencies (k8s.io/component-base/metrics/prometheus/restclient):
// 5 ms to 60 s.
func restClientBuckets() []float64 {
	return []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
}

// RegisterClientMetrics registers client-go's request metrics with reg,
// under the names, labels and buckets kube-proxy exports them with (its
// k8s.io/component-base/metrics/prometheus/restclient registers them in
// the legacy global registry; ipvs-proxy's registry is its own):
// rest_client_requests_total{code,method,host},
// rest_client_request_duration_seconds{verb,host},
// rest_client_rate_limiter_duration_seconds{verb,host} and
// rest_client_request_retries_total{code,verb,host}. Every client of the
// process reports to them.
//
// client-go holds its metrics in globals that metrics.Register sets once
// per process (a sync.Once): the first call wins. `ipvs-proxy run` calls
// RegisterClientMetrics once, before it builds its client; it fails when
// client-go's metrics were registered before (a second call, or a package
// such as component-base's restclient, whose init registers them into the
// legacy registry, which nothing serves), rather than leave reg's
// collectors empty.
func RegisterClientMetrics(reg prometheus.Registerer) error {
	latency := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: restClientBuckets()}, []string{"verb", "host"})
	}
	requestLatency := latency("rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.")
	rateLimiterLatency := latency("rest_client_rate_limiter_duration_seconds",
		"Client side rate limiter latency in seconds. Broken down by verb, and host.")
	requestResult := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
		Help: "Number of HTTP requests, partitioned by status code, method, and host."}, []string{"code", "method", "host"})
	requestRetry := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_request_retries_total",
		Help: "Number of request retries, partitioned by status code, verb, and host."}, []string{"code", "verb", "host"})
	opts := metrics.RegisterOpts{
		RequestLatency:     latencyAdapter{requestLatency},
		RateLimiterLatency: latencyAdapter{rateLimiterLatency},
		RequestResult:      resultAdapter{requestResult},
		RequestRetry:       retryAdapter{requestRetry},
	}
	metrics.Register(opts)
	if metrics.RequestResult != opts.RequestResult {
		return errors.New("client-go's request metrics were registered before: rest_client_* would stay empty")
	}
	for _, c := range []prometheus.Collector{requestLatency, rateLimiterLatency, requestResult, requestRetry} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register client-go's request metrics: %w", err)
		}
	}
	return nil
}

// latencyAdapter is a metrics.LatencyMetric: a latency by verb and host.
type latencyAdapter struct{ m *prometheus.HistogramVec }

func (a latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	a.m.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

// resultAdapter is a metrics.ResultMetric: a count by code, method and host.
type resultAdapter struct{ m *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.m.WithLabelValues(code, method, host).Inc()
}

// retryAdapter is a metrics.RetryMetric: a count by code, verb and host.
type retryAdapter struct{ m *prometheus.CounterVec }

func (a retryAdapter) IncrementRetry(_ context.Context, code, verb, host string) {
	a.m.WithLabelValues(code, verb, host).Inc()
}
