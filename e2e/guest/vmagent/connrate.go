package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
)

// ConnRateConfig bounds one `vmagent connrate` run: N short TCP
// connections, Workers at a time, each given Timeout, the whole run at
// most Limit.
type ConnRateConfig struct {
	Addr    string
	N       int
	Workers int
	Timeout time.Duration
	Limit   time.Duration
}

// ConnRateResult is what `vmagent connrate` prints: the connections that
// got their answer, their rate over the whole run, and the connect
// latencies (SYN to established) in seconds.
type ConnRateResult struct {
	Answered   int      `json:"answered"`
	Failed     int      `json:"failed"`
	Seconds    float64  `json:"seconds"`
	PerSecond  float64  `json:"perSecond"`
	ConnectP50 float64  `json:"connectP50"`
	ConnectP99 float64  `json:"connectP99"`
	ConnectMax float64  `json:"connectMax"`
	Errors     []string `json:"errors,omitempty"` // the first few
}

// maxErrors is how many failures a result quotes.
const maxErrors = 5

// connRateCmd: vmagent connrate --addr HOST:PORT [--n 1000] [--workers 4]
// [--timeout 2s] [--limit 2m]. Run it in a client's namespace with
// `vmagent netns exec NAME --`: every socket of the process is there.
func connRateCmd(args []string, stdout io.Writer) error {
	var c ConnRateConfig
	fs := newFlags("connrate")
	fs.StringVar(&c.Addr, "addr", "", "HOST:PORT of a vmagent serve backend (or a Service in front of some)")
	fs.IntVar(&c.N, "n", 1000, "connections in all")
	fs.IntVar(&c.Workers, "workers", 4, "connections at a time")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Second, "timeout of one connection")
	fs.DurationVar(&c.Limit, "limit", 2*time.Minute, "bound of the whole run: what is not done by then is not made")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.Addr == "" || c.N < 1 || c.Workers < 1 || c.Timeout <= 0 || c.Limit <= 0 {
		return fmt.Errorf("%w: connrate: want --addr, and --n, --workers, --timeout, --limit positive", errUsage)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return json.NewEncoder(stdout).Encode(ConnRate(ctx, c))
}

// ConnRate opens c.N short connections to c.Addr, c.Workers at a time:
// each connects, reads the backend's greeting, asks one line, reads its
// answer and closes. Connections not begun when c.Limit or ctx ends are
// not counted at all.
func ConnRate(ctx context.Context, c ConnRateConfig) ConnRateResult {
	ctx, cancel := context.WithTimeout(ctx, c.Limit)
	defer cancel()
	jobs := make(chan struct{})
	var mu sync.Mutex
	var connects []time.Duration
	var errs []string
	failed := 0
	var wg sync.WaitGroup
	start := time.Now()
	for range c.Workers {
		wg.Go(func() {
			for range jobs {
				d, err := oneRequest(ctx, c.Addr, c.Timeout)
				mu.Lock()
				if err != nil {
					failed++
					if len(errs) < maxErrors {
						errs = append(errs, err.Error())
					}
				} else {
					connects = append(connects, d)
				}
				mu.Unlock()
			}
		})
	}
	for i := 0; i < c.N && ctx.Err() == nil; i++ {
		select {
		case jobs <- struct{}{}:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	return summarize(connects, failed, errs, time.Since(start))
}

// oneRequest is one short connection: the time its connect took, or why
// it got no answer.
func oneRequest(ctx context.Context, addr string, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t0 := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	took := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	if _, err := r.ReadString('\n'); err != nil {
		return 0, fmt.Errorf("greeting from %s: %w", addr, err)
	}
	if _, err := conn.Write([]byte("again\n")); err != nil {
		return 0, fmt.Errorf("request to %s: %w", addr, err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		return 0, fmt.Errorf("answer from %s: %w", addr, err)
	}
	return took, nil
}

// summarize makes the result of a run of elapsed: connects are the
// answered connections' connect times, in any order.
func summarize(connects []time.Duration, failed int, errs []string, elapsed time.Duration) ConnRateResult {
	r := ConnRateResult{Answered: len(connects), Failed: failed, Seconds: elapsed.Seconds(), Errors: errs}
	if elapsed > 0 {
		r.PerSecond = float64(len(connects)) / elapsed.Seconds()
	}
	if len(connects) == 0 {
		return r
	}
	s := slices.Sorted(slices.Values(connects))
	at := func(q float64) float64 { return s[int(q*float64(len(s)-1))].Seconds() }
	r.ConnectP50, r.ConnectP99, r.ConnectMax = at(0.5), at(0.99), s[len(s)-1].Seconds()
	return r
}
