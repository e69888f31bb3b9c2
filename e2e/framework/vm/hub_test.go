package vm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// TestHubRepeats connects three ports the way QEMU's socket netdev does
// and checks that a frame from one reaches the two others (not itself)
// and every watcher.
func TestHubRepeats(t *testing.T) {
	h, err := vm.StartHub()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var mu sync.Mutex
	var watched [][]byte
	stop := h.Watch(func(f []byte) {
		mu.Lock()
		watched = append(watched, append([]byte(nil), f...))
		mu.Unlock()
	})
	defer stop()
	ports := make([]net.Conn, 3)
	for i := range ports {
		if ports[i], err = net.Dial("tcp", h.Addr()); err != nil {
			t.Fatal(err)
		}
		defer ports[i].Close()
	}
	for deadline := time.Now().Add(5 * time.Second); h.Ports() < len(ports); {
		if time.Now().After(deadline) {
			t.Fatalf("the hub accepted %d of %d ports", h.Ports(), len(ports))
		}
		time.Sleep(10 * time.Millisecond)
	}
	frame := []byte("\xff\xff\xff\xff\xff\xff\x52\x54\x00\x00\x00\x01\x08\x06an ARP request")
	hdr := binary.BigEndian.AppendUint32(nil, uint32(len(frame)))
	if _, err := ports[0].Write(append(hdr, frame...)); err != nil {
		t.Fatal(err)
	}
	for _, p := range ports[1:] {
		_ = p.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 4+len(frame))
		if _, err := io.ReadFull(p, got); err != nil {
			t.Fatalf("port %v: %v", p.LocalAddr(), err)
		}
		if !bytes.Equal(got[4:], frame) || binary.BigEndian.Uint32(got) != uint32(len(frame)) {
			t.Errorf("port %v got %q", p.LocalAddr(), got)
		}
	}
	_ = ports[0].SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := ports[0].Read(make([]byte, 64)); err == nil {
		t.Errorf("the sender got its own frame back (%d bytes)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(watched) != 1 || !bytes.Equal(watched[0], frame) {
		t.Errorf("watcher saw %q, want the one frame", watched)
	}
}

// TestSegmentBetweenVMs boots two VMs on one hub and checks that they
// reach each other over eth1 (ping and a TCP connection) and that the hub
// carried their ARP.
func TestSegmentBetweenVMs(t *testing.T) {
	a := vm.Require(t)
	h, err := vm.StartHub()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var mu sync.Mutex
	arps := 0
	defer h.Watch(func(f []byte) {
		if len(f) >= 14 && f[12] == 0x08 && f[13] == 0x06 {
			mu.Lock()
			arps++
			mu.Unlock()
		}
	})()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Both boot at once (t.Fatal may not be called from their goroutines:
	// errors are collected).
	macs := []string{"52:54:00:12:00:01", "52:54:00:12:00:02"}
	vms, errs := make([]*vm.VM, 2), make([]error, 2)
	var wg sync.WaitGroup
	for i := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vms[i], errs[i] = vm.Start(ctx, vm.Options{Assets: a, Segment: h.Addr(), SegmentMAC: macs[i], Log: t.Logf})
		}()
	}
	wg.Wait()
	for _, v := range vms {
		if v != nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("guest console:\n%s", v.ConsoleLog())
				}
				_ = v.Shutdown()
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, v := range vms {
		mac, err := v.RunOK(ctx, "cat", "/sys/class/net/eth1/address")
		if err != nil {
			t.Fatal(err)
		}
		if want := macs[i]; strings.TrimSpace(mac) != want {
			t.Fatalf("vm %d: eth1 has MAC %q, want %s", i, mac, want)
		}
		ip := []string{"192.168.56.11/24", "192.168.56.12/24"}[i]
		if _, err := v.RunOK(ctx, "sh", "-c", "ip link set eth1 up && ip addr add "+ip+" dev eth1"); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := vms[0].RunOK(ctx, "ping", "-c", "2", "-W", "5", "192.168.56.12"); err != nil {
		t.Fatalf("ping over the segment: %v\n%s", err, out)
	}
	// A TCP connection: the second VM's agent answers on its port on
	// every address; nc from the first reaches it.
	if _, err := vms[1].Start(ctx, "nc", "-l", "-p", "7000", "-e", "echo", "hello over the segment"); err != nil {
		t.Fatal(err)
	}
	var out string
	for i := 0; i < 20; i++ {
		if out, err = vms[0].RunOK(ctx, "nc", "-w", "3", "192.168.56.12", "7000"); err == nil && strings.Contains(out, "hello over the segment") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(out, "hello over the segment") {
		t.Fatalf("TCP over the segment: %q, %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if arps < 2 {
		t.Errorf("the hub carried %d ARP frames, want the request and the reply at least", arps)
	}
}
