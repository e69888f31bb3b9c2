package nettest

import (
	"context"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// envInVM is agentapi.EnvInVM, which the guest agent sets to "1" for
// everything it runs. (nettest is a module of its own, which the agent's
// netlinkutil tests require, so it imports nothing of the bed's.)
const envInVM = "IPVS_PROXY_IN_VM"

// These tests change the network of the machine they run on, so they run
// only inside the test VM (vm.TestSmoke builds and runs them there).
func inVM(t *testing.T) {
	t.Helper()
	if os.Getenv(envInVM) != "1" {
		t.Skipf("runs only inside the test VM (%s=1); see e2e/framework/vm", envInVM)
	}
}

func addNetns(t *testing.T, name string, c NetnsConfig) {
	t.Helper()
	if err := AddNetns(name, c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := DelNetns(name); err != nil {
			t.Error(err)
		}
	})
}

func TestServeAndHitAcrossNamespaces(t *testing.T) {
	inVM(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	addNetns(t, "ntsrv", NetnsConfig{
		HostAddr: netip.MustParsePrefix("10.20.1.1/24"), Addr: netip.MustParsePrefix("10.20.1.2/24"),
		HostAddr6: netip.MustParsePrefix("fd00:20:1::1/64"), Addr6: netip.MustParsePrefix("fd00:20:1::2/64"),
	})
	addNetns(t, "ntcli", NetnsConfig{
		HostAddr: netip.MustParsePrefix("10.20.2.1/24"), Addr: netip.MustParsePrefix("10.20.2.2/24"),
		HostAddr6: netip.MustParsePrefix("fd00:20:2::1/64"), Addr6: netip.MustParsePrefix("fd00:20:2::2/64"),
	})
	s, err := Serve(ServeConfig{Netns: "ntsrv", Name: "srv", Port: 9000, TCP: true, UDP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	ctx := context.Background()
	for _, tc := range []struct {
		proto, addr, client string
	}{
		{"tcp", "10.20.1.2:9000", "10.20.2.2"},
		{"udp", "10.20.1.2:9000", "10.20.2.2"},
		{"tcp", "[fd00:20:1::2]:9000", "fd00:20:2::2"},
		{"udp", "[fd00:20:1::2]:9000", "fd00:20:2::2"},
	} {
		res, err := Hit(ctx, HitConfig{Netns: "ntcli", Proto: tc.proto, Addr: tc.addr, N: 3})
		if err != nil {
			t.Fatal(err)
		}
		if res.Answers["srv"] != 3 || res.Clients[tc.client] != 3 || len(res.Errors) != 0 {
			t.Errorf("%s %s: %+v, want 3 answers from srv seeing %s", tc.proto, tc.addr, res, tc.client)
		}
	}

	// From the root namespace the backend sees the root-side veth address.
	res, err := Hit(ctx, HitConfig{Proto: "tcp", Addr: "10.20.1.2:9000", N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Clients["10.20.1.1"] != 1 {
		t.Errorf("from the root namespace: %+v, want client 10.20.1.1", res)
	}

	for _, proto := range []string{"tcp", "udp"} {
		res, err := Hit(ctx, HitConfig{Netns: "ntcli", Proto: proto, Addr: "10.20.1.2:9001", N: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.ErrorCount(ErrRefused) != 2 || res.Total() != 0 {
			t.Errorf("%s to a closed port: %+v, want 2 refused", proto, res)
		}
	}
	start := time.Now()
	res, err = Hit(ctx, HitConfig{Netns: "ntcli", Proto: "udp", Addr: "10.20.1.2:9000", N: 1, Timeout: 200 * time.Millisecond})
	if err != nil || res.Total() != 1 {
		t.Fatalf("udp with a short timeout: %+v, %v", res, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A closed UDP port answers with ICMP: refused, not a timeout.
	res, err = Hit(ctx, HitConfig{Netns: "ntcli", Proto: "udp", Addr: "10.20.1.2:9000", N: 1, Timeout: 500 * time.Millisecond})
	if err != nil || res.ErrorCount(ErrRefused) != 1 {
		t.Errorf("udp after Close: %+v, %v; want refused", res, err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("short timeouts took %v", time.Since(start))
	}
}

// TestHold: one connection (TCP) or one flow of datagrams from one source
// port (UDP) answers again and again, and Hold reports how it ended when
// the backend goes away.
func TestHold(t *testing.T) {
	inVM(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	addNetns(t, "nhsrv", NetnsConfig{HostAddr: netip.MustParsePrefix("10.21.1.1/24"), Addr: netip.MustParsePrefix("10.21.1.2/24")})
	addNetns(t, "nhcli", NetnsConfig{HostAddr: netip.MustParsePrefix("10.21.2.1/24"), Addr: netip.MustParsePrefix("10.21.2.2/24")})
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			s, err := Serve(ServeConfig{Netns: "nhsrv", Name: "srv", Port: 9000, TCP: proto == "tcp", UDP: proto == "udp"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out strings.Builder
			var mu sync.Mutex
			done := make(chan error, 1)
			go func() {
				done <- Hold(ctx, HoldConfig{Netns: "nhcli", Proto: proto, Addr: "10.21.1.2:9000", Interval: 20 * time.Millisecond},
					lockedWriter{&mu, &out})
			}()
			read := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(read(), "answer 5 srv 10.21.2.2") {
				if time.Now().After(deadline) {
					t.Fatalf("no fifth answer on one flow:\n%s", read())
				}
				time.Sleep(20 * time.Millisecond)
			}
			// Close ends the open connection (TCP) or makes the port
			// refuse (UDP): Hold says so.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil || !strings.Contains(read(), "error ") {
					t.Errorf("Hold after the backend closed: %v, output:\n%s", err, read())
				}
				if proto == "udp" && !strings.Contains(read(), "error "+ErrRefused+":") {
					t.Errorf("a UDP flow to a closed port: want %q, output:\n%s", ErrRefused, read())
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Hold did not notice the closed backend:\n%s", read())
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestNetnsErrors(t *testing.T) {
	inVM(t)
	if err := AddNetns("a-name-too-long", NetnsConfig{}); err == nil {
		t.Error("AddNetns accepted a name too long for the veth")
	}
	if err := Do("no-such-ns", func() error { return nil }); err == nil {
		t.Error("Do entered a namespace that does not exist")
	}
	if _, err := Hit(context.Background(), HitConfig{Netns: "no-such-ns", Proto: "tcp", Addr: "10.0.0.1:1", N: 1}); err == nil {
		t.Error("Hit from a namespace that does not exist did not fail")
	}
	if err := DelNetns("no-such-ns"); err != nil {
		t.Errorf("DelNetns of a missing namespace: %v", err)
	}
}
