package main

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// TestConnRateCountsAnsweredConnections runs connrate against a real
// backend on loopback: every connection is answered and counted once,
// with a rate and latencies in order.
func TestConnRateCountsAnsweredConnections(t *testing.T) {
	port := freePort(t)
	s, err := nettest.Serve(nettest.ServeConfig{Name: "be1", Port: port, TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := ConnRate(context.Background(), ConnRateConfig{Addr: "127.0.0.1:" + strconv.Itoa(port), N: 50, Workers: 3, Timeout: 2 * time.Second, Limit: time.Minute})
	if r.Answered != 50 || r.Failed != 0 {
		t.Fatalf("answered %d, failed %d (%q), want 50 and 0", r.Answered, r.Failed, r.Errors)
	}
	if r.PerSecond <= 0 || r.ConnectP50 <= 0 || r.ConnectP50 > r.ConnectP99 || r.ConnectP99 > r.ConnectMax {
		t.Errorf("rate %v/s, connect p50 %v, p99 %v, max %v: want positive and in order", r.PerSecond, r.ConnectP50, r.ConnectP99, r.ConnectMax)
	}
}

// TestConnRateRefused: nothing listens, so every connection fails, and
// the result says why (and quotes at most maxErrors of them).
func TestConnRateRefused(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	r := ConnRate(context.Background(), ConnRateConfig{Addr: addr, N: 8, Workers: 2, Timeout: time.Second, Limit: time.Minute})
	if r.Answered != 0 || r.Failed != 8 || len(r.Errors) != maxErrors || !strings.Contains(r.Errors[0], "refused") {
		t.Errorf("answered %d, failed %d, errors %q: want 0, 8 and %d refusals", r.Answered, r.Failed, r.Errors, maxErrors)
	}
}

// TestSummarizeQuantiles: p50 and p99 by nearest rank below, over the
// answered connections only; the rate over the whole run.
func TestSummarizeQuantiles(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	r := summarize(d, 3, nil, 2*time.Second)
	if r.Answered != 100 || r.Failed != 3 || r.PerSecond != 50 {
		t.Errorf("answered %d, failed %d, rate %v: want 100, 3, 50/s", r.Answered, r.Failed, r.PerSecond)
	}
	if r.ConnectP50 != 0.05 || r.ConnectP99 != 0.099 || r.ConnectMax != 0.1 {
		t.Errorf("p50 %v, p99 %v, max %v: want 0.05, 0.099, 0.1", r.ConnectP50, r.ConnectP99, r.ConnectMax)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
