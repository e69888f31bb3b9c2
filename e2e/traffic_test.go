package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestServiceTrafficMetrics: with --service-traffic-metrics the agent's
// /metrics count a Service port's connections, packets and bytes from
// IPVS's own counters: 20 connections through the clusterIP add 20 to its
// connections series, and bytes flow both ways. The agent runs with the
// bed's arguments again afterwards.
func TestServiceTrafficMetrics(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.StopAgent()
		if err := e.StartAgent(ctx); err != nil {
			t.Errorf("restart the agent with the bed's arguments: %v", err)
		}
	})
	if err := e.StartAgent(ctx, "--service-traffic-metrics"); err != nil {
		t.Fatal(err)
	}
	ns, svc, bes := e.httpService(t, "counted", 2)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", addr, names(bes))

	labels := fmt.Sprintf(`namespace=%q,port="http",protocol="tcp",service="counted"`, ns)
	series := func(name, extra string) float64 {
		t.Helper()
		code, body := e.httpGet(t, metricsURL)
		if code != 200 {
			t.Fatalf("/metrics answered %d", code)
		}
		re := regexp.MustCompile(`(?m)^` + name + `\{` + regexp.QuoteMeta(extra+labels) + `\} (\S+)$`)
		m := re.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no series %s{%s%s} on /metrics", name, extra, labels)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The kernel folds its per-CPU counters into the totals it reports
	// every 2 s (its rate estimator): wait until they stand still.
	conns := func() float64 { return series("ipvs_proxy_service_connections_total", "") }
	before := conns()
	eventually(t, 30*time.Second, func() error {
		time.Sleep(2500 * time.Millisecond)
		if now := conns(); now != before {
			before = now
			return fmt.Errorf("connections still moving: %v", now)
		}
		return nil
	})
	res := e.hit(t, "tcp", addr, 20)
	if len(res.Errors) > 0 {
		t.Fatalf("connections failed: %v", res.Errors)
	}
	eventually(t, 10*time.Second, func() error {
		start := time.Now()
		after := conns()
		t.Logf("connections %v → %v; a scrape (and its fetch from the VM) took %v", before, after, time.Since(start))
		if after-before != 20 {
			return fmt.Errorf("the connections series grew by %v for 20 connections", after-before)
		}
		return nil
	})
	for _, dir := range []string{"in", "out"} {
		if v := series("ipvs_proxy_service_bytes_total", `direction="`+dir+`",`); v <= 0 {
			t.Errorf("bytes %s = %v, want some", dir, v)
		}
		if v := series("ipvs_proxy_service_packets_total", `direction="`+dir+`",`); v < 20 {
			t.Errorf("packets %s = %v, want at least one per connection", dir, v)
		}
	}
}
