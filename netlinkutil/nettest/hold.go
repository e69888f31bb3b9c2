package nettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// HoldConfig says where to hold one long-lived flow.
type HoldConfig struct {
	// Netns is the named namespace to connect from; "" is the current one.
	Netns string
	// Proto is "tcp" (the default) or "udp". A UDP flow is one connected
	// socket: every datagram has the same source address and port, so the
	// kernel keeps it on one real server as it does a TCP connection.
	Proto string
	// Addr is host:port.
	Addr string
	// Interval is the pause between two questions on the flow; 0 means
	// 200 ms.
	Interval time.Duration
	// Timeout bounds the connect and each answer; 0 means
	// DefaultHitTimeout.
	Timeout time.Duration
	// SourcePort, when not 0, is the flow's local port; a TCP flow then
	// ends with a reset, leaving the port free at once (see dialFrom).
	SourcePort int
	// Reset ends a TCP connection with a reset (SO_LINGER 0) instead of a
	// FIN when ctx ends: IPVS then forgets it after its CLOSE timeout
	// (10 s) instead of the minutes of FIN_WAIT and TIME_WAIT.
	Reset bool
}

// udpResend is how long a UDP flow waits for an answer before it sends
// its question again (within Timeout), as a UDP client does: a datagram
// may be dropped where a TCP segment would be retransmitted.
const udpResend = time.Second

// Hold opens one flow to c.Addr and keeps asking on it, every c.Interval,
// until ctx ends. It writes "answer N <backend> <client>" for every answer
// to out (N counts from 1) and returns nil when ctx ends with the flow
// still answering, or an error saying how the flow failed ("<kind>:
// <detail>", kinds as in HitResult.Errors), which it also writes to out as
// "error <kind>: <detail>".
func Hold(ctx context.Context, c HoldConfig, out io.Writer) error {
	interval, timeout := c.Interval, c.Timeout
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	if timeout <= 0 {
		timeout = DefaultHitTimeout
	}
	proto := c.Proto
	if proto == "" {
		proto = "tcp"
	}
	if proto != "tcp" && proto != "udp" {
		return fmt.Errorf("hold: proto %q: want tcp or udp", c.Proto)
	}
	fail := func(err error) error {
		err = fmt.Errorf("%s: %w", classify(err), err)
		fmt.Fprintf(out, "error %v\n", err)
		return err
	}
	var conn net.Conn
	var dialErr error
	if err := Do(c.Netns, func() error {
		conn, dialErr = dialFrom(ctx, net.Dialer{Timeout: timeout}, proto, c.Addr, c.SourcePort)
		return nil
	}); err != nil {
		return err
	}
	if dialErr != nil {
		return fail(dialErr)
	}
	if tc, ok := conn.(*net.TCPConn); ok && c.Reset {
		if err := tc.SetLinger(0); err != nil {
			return fail(err)
		}
	}
	defer conn.Close()
	ask := askTCP(conn, timeout)
	if proto == "udp" {
		ask = askUDP(conn, timeout)
	}
	for n := 1; ; n++ {
		if n > 1 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(interval):
			}
		}
		line, err := ask(n == 1)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(out, "answer %d %s\n", n, strings.TrimSpace(line))
	}
}

// askTCP asks on a TCP connection: the backend answers at once when the
// connection opens, and again for every line it gets.
func askTCP(conn net.Conn, timeout time.Duration) func(first bool) (string, error) {
	r := bufio.NewReader(conn)
	return func(first bool) (string, error) {
		if !first {
			if _, err := conn.Write([]byte("again\n")); err != nil {
				return "", err
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		line, err := r.ReadString('\n')
		if err != nil {
			if line == "" && errors.Is(err, io.EOF) {
				err = fmt.Errorf("connection closed: %w", err)
			}
			return "", err
		}
		return line, nil
	}
}

// askUDP sends a datagram and waits for the answer, sending again every
// udpResend until timeout. A refusal (ICMP port unreachable) ends it at
// once. A late answer to a resent question may be read as the next
// question's: every answer of a backend is the same line, so the flow's
// record (which backend answered) stays right.
func askUDP(conn net.Conn, timeout time.Duration) func(first bool) (string, error) {
	buf := make([]byte, 64*1024)
	return func(bool) (string, error) {
		deadline := time.Now().Add(timeout)
		for {
			if _, err := conn.Write([]byte("again\n")); err != nil {
				return "", err
			}
			wait := time.Now().Add(udpResend)
			if wait.After(deadline) {
				wait = deadline
			}
			_ = conn.SetReadDeadline(wait)
			n, err := conn.Read(buf)
			if err == nil {
				return string(buf[:n]), nil
			}
			if classify(err) != ErrTimeout || !time.Now().Before(deadline) {
				return "", err
			}
		}
	}
}
