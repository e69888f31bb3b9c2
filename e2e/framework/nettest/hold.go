package nettest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// HoldConfig says where to hold one long-lived TCP connection.
type HoldConfig struct {
	// Netns is the named namespace to connect from; "" is the current one.
	Netns string
	// Addr is host:port.
	Addr string
	// Interval is the pause between two questions on the connection; 0
	// means 200 ms.
	Interval time.Duration
	// Timeout bounds the connect and each answer; 0 means
	// DefaultHitTimeout.
	Timeout time.Duration
}

// Hold opens one TCP connection to c.Addr and keeps asking on it, every
// c.Interval, until ctx ends. It writes "answer N <backend> <client>" for
// every answer to out (N counts from 1) and returns nil when ctx ends with
// the connection still answering, or an error saying how the connection
// failed ("<kind>: <detail>", kinds as in HitResult.Errors), which it also
// writes to out as "error <kind>: <detail>".
func Hold(ctx context.Context, c HoldConfig, out io.Writer) error {
	interval, timeout := c.Interval, c.Timeout
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	if timeout <= 0 {
		timeout = DefaultHitTimeout
	}
	fail := func(err error) error {
		err = fmt.Errorf("%s: %w", classify(err), err)
		fmt.Fprintf(out, "error %v\n", err)
		return err
	}
	var conn net.Conn
	var dialErr error
	if err := Do(c.Netns, func() error {
		d := net.Dialer{Timeout: timeout}
		conn, dialErr = d.DialContext(ctx, "tcp", c.Addr)
		return nil
	}); err != nil {
		return err
	}
	if dialErr != nil {
		return fail(dialErr)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	for n := 1; ; n++ {
		if n > 1 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(interval):
			}
			if _, err := conn.Write([]byte("again\n")); err != nil {
				return fail(err)
			}
		}
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		line, err := r.ReadString('\n')
		if err != nil {
			if line == "" && err == io.EOF {
				err = fmt.Errorf("connection closed: %w", err)
			}
			return fail(err)
		}
		fmt.Fprintf(out, "answer %d %s\n", n, strings.TrimSpace(line))
	}
}
