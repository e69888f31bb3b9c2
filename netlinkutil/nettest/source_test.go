package nettest

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestDialFromReusesSourcePort: consecutive dials from one source port
// succeed at once (no TIME_WAIT holds the port) and come from that port.
// Loopback only: it runs on any machine.
func TestDialFromReusesSourcePort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan int, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			seen <- c.RemoteAddr().(*net.TCPAddr).Port
			// Wait for the client's close (a reset): closing first
			// would leave this side's TIME_WAIT on the same four
			// addresses, which may refuse the next dial's SYN.
			go func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	// A free port, found by binding one and letting it go.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := dialFrom(ctx, net.Dialer{}, "tcp", ln.Addr().String(), port)
		cancel()
		if err != nil {
			t.Fatalf("dial %d from port %d: %v", i+1, port, err)
		}
		if got := conn.LocalAddr().(*net.TCPAddr).Port; got != port {
			t.Errorf("dial %d: local port %d, want %d", i+1, got, port)
		}
		if got := <-seen; got != port {
			t.Errorf("dial %d: the server saw port %d, want %d", i+1, got, port)
		}
		conn.Close()
	}
}
