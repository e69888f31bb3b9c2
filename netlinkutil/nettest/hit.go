package nettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// Kinds of failed attempts, the prefix of each HitResult.Errors entry.
const (
	// ErrRefused: the connection was refused (TCP RST, or ICMP port
	// unreachable for UDP).
	ErrRefused = "refused"
	// ErrTimeout: no answer within the attempt's timeout.
	ErrTimeout = "timeout"
	// ErrUnreachable: no route, or the neighbour did not answer ARP/ND.
	ErrUnreachable = "unreachable"
	// ErrReset: the connection was reset after it was set up.
	ErrReset = "reset"
	// ErrClosed: the connection was closed without an answer.
	ErrClosed = "closed"
	// ErrOther: anything else.
	ErrOther = "other"
)

// DefaultHitTimeout bounds one attempt (connect and answer) when
// HitConfig.Timeout is 0.
const DefaultHitTimeout = 2 * time.Second

// HitConfig says where and how often to connect.
type HitConfig struct {
	// Netns is the named namespace to connect from; "" is the current one.
	Netns string
	// Proto is "tcp" or "udp".
	Proto string
	// Addr is host:port, e.g. 10.96.0.10:80 or [fd00::10]:80.
	Addr string
	// N is the number of attempts, one new connection (or UDP socket) each,
	// made one after the other.
	N int
	// Timeout bounds each attempt; 0 means DefaultHitTimeout.
	Timeout time.Duration
	// Interval is the pause between two attempts (0: none), for steady
	// traffic over a while rather than a burst.
	Interval time.Duration
	// SourcePort, when not 0, is the local port of every attempt: a client
	// that reuses its source port (see dialFrom).
	SourcePort int
}

// HitResult counts the answers of a Hit.
type HitResult struct {
	// Answers counts answers by backend name.
	Answers map[string]int `json:"answers"`
	// Clients counts the client addresses the backends saw.
	Clients map[string]int `json:"clients"`
	// Errors has one entry per failed attempt, "<kind>: <detail>" with kind
	// one of the Err* constants.
	Errors []string `json:"errors"`
	// Started is when Hit began (the clock of the machine that ran it);
	// FailedAt has, for each failed attempt, when it began since Started.
	Started  time.Time       `json:"started"`
	FailedAt []time.Duration `json:"failedAt,omitempty"`
	// FirstAt and LastAt have, for each backend, when the attempt of its
	// first and of its last answer began, since Started: when a Service's
	// flows moved from one backend to the next.
	FirstAt map[string]time.Duration `json:"firstAt,omitempty"`
	LastAt  map[string]time.Duration `json:"lastAt,omitempty"`
}

// Total is the number of answered attempts.
func (r HitResult) Total() int {
	n := 0
	for _, c := range r.Answers {
		n += c
	}
	return n
}

// ErrorCount is the number of failed attempts of the given kind ("" counts
// all).
func (r HitResult) ErrorCount(kind string) int {
	n := 0
	for _, e := range r.Errors {
		if kind == "" || strings.HasPrefix(e, kind+":") {
			n++
		}
	}
	return n
}

// Hit connects c.N times and counts who answered. It fails only on a bad
// configuration or a namespace it cannot enter; failed attempts are
// recorded in the result. It stops early when ctx ends.
func Hit(ctx context.Context, c HitConfig) (HitResult, error) {
	if c.Proto != "tcp" && c.Proto != "udp" {
		return HitResult{}, fmt.Errorf("hit: protocol %q: want tcp or udp", c.Proto)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return HitResult{}, fmt.Errorf("hit: address %q: %w", c.Addr, err)
	}
	return Repeat(ctx, c, func(ctx context.Context, timeout time.Duration) (string, error) {
		return attempt(ctx, c.Netns, c.Proto, c.Addr, c.SourcePort, timeout)
	})
}

// Ask is one attempt of Repeat: it returns the answer's line, "NAME
// [CLIENT]", or the attempt's error, within timeout.
type Ask func(ctx context.Context, timeout time.Duration) (string, error)

// Repeat makes c.N attempts with ask, c.Interval apart, and counts them
// as Hit does (c.Proto, c.Addr and c.SourcePort are ask's business): a
// client of another protocol over the same loop (a DNS query).
func Repeat(ctx context.Context, c HitConfig, ask Ask) (HitResult, error) {
	res := HitResult{Answers: map[string]int{}, Clients: map[string]int{}, Errors: []string{}, Started: time.Now(),
		FirstAt: map[string]time.Duration{}, LastAt: map[string]time.Duration{}}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultHitTimeout
	}
	for i := 0; i < c.N; i++ {
		if i > 0 && c.Interval > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(c.Interval):
			}
		}
		if err := ctx.Err(); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: stopped after %d of %d attempts: %v", ErrOther, i, c.N, err))
			break
		}
		began := time.Since(res.Started)
		line, err := ask(ctx, timeout)
		if err != nil && ctx.Err() != nil {
			// Cut short by the stop: not a failed connection.
			res.Errors = append(res.Errors, fmt.Sprintf("%s: stopped after %d of %d attempts: %v", ErrOther, i, c.N, ctx.Err()))
			break
		}
		if err != nil {
			var nsErr *netnsError
			if errors.As(err, &nsErr) {
				return res, nsErr.err
			}
			res.Errors = append(res.Errors, classify(err)+": "+err.Error())
			res.FailedAt = append(res.FailedAt, began)
			continue
		}
		res.count(strings.TrimSpace(line), began)
	}
	return res, nil
}

// count records an answer "NAME [CLIENT]" of the attempt begun at began.
func (r *HitResult) count(line string, began time.Duration) {
	name, client, _ := strings.Cut(line, " ")
	if r.Answers[name] == 0 {
		r.FirstAt[name] = began
	}
	r.LastAt[name] = began
	r.Answers[name]++
	if client != "" {
		r.Clients[client]++
	}
}

// netnsError marks a failure to enter the namespace, which ends Hit.
type netnsError struct{ err error }

func (e *netnsError) Error() string { return e.err.Error() }

func attempt(ctx context.Context, ns, proto, addr string, sourcePort int, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn net.Conn
	var dialErr error
	if err := Do(ns, func() error {
		conn, dialErr = dialFrom(ctx, net.Dialer{}, proto, addr, sourcePort)
		return nil
	}); err != nil {
		return "", &netnsError{err}
	}
	if dialErr != nil {
		return "", dialErr
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	if proto == "udp" {
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return "", err
		}
		buf := make([]byte, 1024)
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && line == "" {
			return "", fmt.Errorf("connection to %s closed without an answer: %w", addr, err)
		}
		if !errors.Is(err, io.EOF) {
			return "", err
		}
	}
	return line, nil
}

func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrRefused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return ErrUnreachable
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ErrReset
	case errors.Is(err, io.EOF):
		return ErrClosed
	}
	return ErrOther
}

// dialFrom dials from a fixed local port when sourcePort is not 0: the
// socket has SO_REUSEADDR, and a TCP connection is closed with a reset
// (SO_LINGER 0), so that no TIME_WAIT holds the port and the next dial from
// it reaches the same 4-tuple again at once, as a client that reuses its
// source ports does. Port 0 dials as usual.
func dialFrom(ctx context.Context, d net.Dialer, proto, addr string, sourcePort int) (net.Conn, error) {
	if sourcePort == 0 {
		return d.DialContext(ctx, proto, addr)
	}
	if proto == "udp" {
		d.LocalAddr = &net.UDPAddr{Port: sourcePort}
	} else {
		d.LocalAddr = &net.TCPAddr{Port: sourcePort}
	}
	d.Control = func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
		}); err != nil {
			return err
		}
		return serr
	}
	conn, err := d.DialContext(ctx, proto, addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		if err := tc.SetLinger(0); err != nil {
			conn.Close()
			return nil, fmt.Errorf("set SO_LINGER 0: %w", err)
		}
	}
	return conn, nil
}
