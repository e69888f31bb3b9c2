package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
)

// churnDuration is how long TestChaosEndpointChurn churns: $CHAOS_CHURN
// (a Go duration), else 60 s (CI's).
func churnDuration(t *testing.T) time.Duration {
	t.Helper()
	return envDuration(t, "CHAOS_CHURN", 60*time.Second, 30*time.Second)
}

// envDuration is the Go duration in the environment variable name, at
// least least, else def when it is not set.
func envDuration(t *testing.T, name string, def, least time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < least {
		t.Fatalf("%s=%q: want a duration of at least %v", name, s, least)
	}
	return d
}

// quantiles returns the median and the maximum of ds.
func quantiles(ds []time.Duration) (p50, top time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1]
}

// setSliceEndpoints replaces the endpoints of svc's IPv4 slice, from the
// slice last written (*last, updated), and returns the API's error.
func (c chaosEnv) setSliceEndpoints(svc *corev1.Service, last **discoveryv1.EndpointSlice, addrs []string) error {
	eps := slice(svc, addrs)
	eps.ResourceVersion = (*last).ResourceVersion
	out, err := c.fast.DiscoveryV1().EndpointSlices(svc.Namespace).Update(context.Background(), eps, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	*last = out
	return nil
}

// TestChaosEndpointChurn: 20 Services whose endpoints change 5 times a
// second (300 changes a minute) for CHAOS_CHURN, with live traffic to a
// Service that does not change. Every 3 s a probe Service's endpoint
// changes and the time until the kernel has it is measured: the median
// and the maximum of the first third and of the last third of the churn
// stay alike (the agent keeps up); the agent's RSS stays flat; at the end
// the kernel is exactly the API's state; no connection fails.
func TestChaosEndpointChurn(t *testing.T) {
	c := chaosSetup(t)
	peaks := startPeaks(context.Background(), t, c.bedVM())
	dur := churnDuration(t)
	ns, live, bulk := c.scaled(t, 21)
	churn, probe := bulk[:20], bulk[20]
	last := make([]*discoveryv1.EndpointSlice, len(bulk))
	for i, s := range bulk {
		var err error
		if last[i], err = c.fast.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), s.Name+"-ipv4", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rss := func() float64 { return c.scrape(t)["process_resident_memory_bytes"] / (1 << 20) }
	lt := c.startLiveTraffic(t, live, 2)
	mark := c.logMark()
	rssStart := rss()

	// The churn: one Service's endpoints every 200 ms, one of its two
	// endpoints replaced each time.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var changes, churnErrs int
	var churnErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			i := k % len(churn)
			addrs := []string{fakeEndpoints(i, 1)[0], fakeEndpoints(1000+k, 1)[0]}
			if err := c.setSliceEndpoints(churn[i], &last[i], addrs); err != nil {
				churnErrs++
				churnErr = err
				continue
			}
			changes++
		}
	}()

	// The probes.
	type sample struct {
		at   time.Duration
		took time.Duration
	}
	var samples []sample
	began := time.Now()
	probeVS := hostPort(probe.Spec.ClusterIP, 80)
	for k := 0; time.Since(began) < dur; k++ {
		addr := fakeEndpoints(30000+k, 1)[0]
		at := time.Since(began)
		if err := c.setSliceEndpoints(probe, &last[20], []string{addr}); err != nil {
			t.Fatalf("probe change: %v", err)
		}
		sent := time.Now()
		for {
			out, err := c.VM.RunOK(context.Background(), "ipvsadm", "-Ln", "-t", probeVS)
			if err == nil && strings.Contains(out, "-> "+hostPort(addr, backendPort)) {
				break
			}
			if time.Since(sent) > time.Minute {
				t.Fatalf("probe %d: %s not in the kernel after a minute:\n%s", k, addr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		samples = append(samples, sample{at, time.Since(sent)})
		time.Sleep(time.Until(sent.Add(3 * time.Second)))
	}
	close(stop)
	wg.Wait()
	churned := time.Since(began)
	rssEnd := rss()
	took, d := c.converge(t, "after the churn", c.expected(t, ns), 2*time.Minute)
	attempted, failed, errs := lt.stop(t)
	if failed > 0 {
		t.Errorf("%d of %d connections failed: %q", failed, attempted, errs)
	}
	if churnErrs > 0 {
		t.Errorf("%d of the churn's updates failed, the last: %v", churnErrs, churnErr)
	}

	var early, late []time.Duration
	for _, s := range samples {
		switch {
		case s.at < dur/3:
			early = append(early, s.took)
		case s.at >= dur*2/3:
			late = append(late, s.took)
		}
	}
	e50, emax := quantiles(early)
	l50, lmax := quantiles(late)
	perMin := float64(changes) / churned.Minutes()
	t.Logf("%d endpoint changes in %v (%.0f/min); change latency early p50 %v max %v, late p50 %v max %v (%d probes); RSS %.1f -> %.1f MiB",
		changes, churned.Round(time.Second), perMin, e50, emax, l50, lmax, len(samples), rssStart, rssEnd)
	if perMin < 200 {
		t.Errorf("only %.0f endpoint changes per minute", perMin)
	}
	// Flat: under emulation on a shared machine single probes stray, so
	// medians are compared, with a second of slack.
	if l50 > 3*e50+time.Second {
		t.Errorf("the change latency grew: median %v early, %v late", e50, l50)
	}
	if rssEnd > 1.5*rssStart+20 {
		t.Errorf("the agent's RSS grew from %.1f to %.1f MiB", rssStart, rssEnd)
	}
	peaks.record(t, chaos.Row{Case: "endpoint-churn", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: syncWrites(c.logSince(mark)), ConvergeSeconds: seconds(took), Leaks: len(d.Leaks),
		Notes: fmt.Sprintf("%d endpoint changes over %.0f s (%.0f/min) on 20 Services; change latency p50/max early %.2f/%.2f s, "+
			"late %.2f/%.2f s; agent RSS %.0f -> %.0f MiB", changes, churned.Seconds(), perMin,
			e50.Seconds(), emax.Seconds(), l50.Seconds(), lmax.Seconds(), rssStart, rssEnd)})
}
