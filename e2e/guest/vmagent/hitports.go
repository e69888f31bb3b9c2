package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// PortsResult is what `vmagent hitports` prints: for each source port, the
// backend that answered the one connection from it, or why none did.
type PortsResult struct {
	Answers map[int]string `json:"answers"`
	Errors  map[int]string `json:"errors"`
}

// hitPortsCmd: vmagent hitports --addr HOST:PORT --first P --n N
// [--timeout 2s]: one TCP connection from each source port P to P+N-1, one
// after the other (each closed with a reset, see nettest's dialFrom), and
// which backend answered each: how a hash scheduler keyed on the client's
// port maps clients.
func hitPortsCmd(args []string, stdout io.Writer) error {
	fs := newFlags("hitports")
	addr := fs.String("addr", "", "HOST:PORT to connect to")
	first := fs.Int("first", 40000, "first source port")
	n := fs.Int("n", 1, "number of source ports, one connection each")
	timeout := fs.Duration("timeout", nettest.DefaultHitTimeout, "timeout of one connection")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *first <= 0 || *n <= 0 || *first+*n-1 > 65535 {
		return fmt.Errorf("%w: hitports: ports %d to %d", errUsage, *first, *first+*n-1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	// Bound the whole run too: attempts are sequential.
	ctx, cancel2 := context.WithTimeout(ctx, time.Duration(*n+1)*(*timeout+time.Second))
	defer cancel2()
	res := PortsResult{Answers: map[int]string{}, Errors: map[int]string{}}
	for p := *first; p < *first+*n && ctx.Err() == nil; p++ {
		hit, err := nettest.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: *addr, N: 1, Timeout: *timeout, SourcePort: p})
		if err != nil {
			return fmt.Errorf("hitports: source port %d: %w", p, err)
		}
		recordPort(res, p, hit)
	}
	return json.NewEncoder(stdout).Encode(res)
}

// recordPort files one port's single attempt in res.
func recordPort(res PortsResult, port int, hit nettest.HitResult) {
	for name := range hit.Answers {
		res.Answers[port] = name
		return
	}
	res.Errors[port] = "no answer"
	if len(hit.Errors) > 0 {
		res.Errors[port] = hit.Errors[0]
	}
}
