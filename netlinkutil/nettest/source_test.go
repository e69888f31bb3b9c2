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

// TestHitTimesBackends: a UDP client that keeps its source port, whose
// server changes its name after two answers (a backend replaced), gets
// when each backend first and last answered; the last of the old one is
// before the first of the new. Loopback only: it runs on any machine.
func TestHitTimesBackends(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 1024)
		for n := 0; ; n++ {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			name := "be1"
			if n >= 2 {
				name = "be2"
			}
			_, _ = pc.WriteTo([]byte(Reply(name, from.(*net.UDPAddr).AddrPort().Addr())), from)
		}
	}()
	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.LocalAddr().(*net.UDPAddr).Port
	probe.Close()
	res, err := Hit(context.Background(), HitConfig{Proto: "udp", Addr: pc.LocalAddr().String(), N: 5,
		Interval: 10 * time.Millisecond, Timeout: 2 * time.Second, SourcePort: port})
	if err != nil {
		t.Fatal(err)
	}
	if res.Answers["be1"] != 2 || res.Answers["be2"] != 3 || len(res.Errors) != 0 {
		t.Fatalf("answers %v, errors %v; want be1 2, be2 3, no error", res.Answers, res.Errors)
	}
	if !(res.FirstAt["be1"] < res.LastAt["be1"] && res.LastAt["be1"] < res.FirstAt["be2"] && res.FirstAt["be2"] < res.LastAt["be2"]) {
		t.Errorf("be1 answered from %s to %s, be2 from %s to %s: want them in that order",
			res.FirstAt["be1"], res.LastAt["be1"], res.FirstAt["be2"], res.LastAt["be2"])
	}
}
