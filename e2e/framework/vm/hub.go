package vm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Hub is a private Ethernet segment between VMs: a listener on 127.0.0.1
// that QEMU's socket netdev connects to (Options.Segment), repeating
// every frame one VM sends to every other VM, as a hub does. Frames never
// leave the hub's process: the segment exists only between the VMs'
// QEMU processes and this one.
//
// QEMU's stream socket netdev sends each frame as a 4-byte big-endian
// length and the frame.
type Hub struct {
	ln net.Listener

	mu       sync.Mutex
	ports    map[*hubPort]struct{}
	watchers map[int]func(frame []byte)
	nextID   int
	closed   bool
	wg       sync.WaitGroup
}

type hubPort struct {
	conn net.Conn
	out  chan []byte
}

// hubQueue is how many frames wait for a slow port before more are
// dropped, as a switch drops on a full queue.
const hubQueue = 512

// maxFrame bounds a frame's length (jumbo frames included).
const maxFrame = 65536

// StartHub listens on a free port of 127.0.0.1.
func StartHub() (*Hub, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("vm: hub: %w", err)
	}
	h := &Hub{ln: ln, ports: map[*hubPort]struct{}{}, watchers: map[int]func([]byte){}}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

// Addr is the address for Options.Segment.
func (h *Hub) Addr() string { return h.ln.Addr().String() }

// Ports is how many VMs are connected.
func (h *Hub) Ports() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ports)
}

// Watch calls f with every frame the hub carries (f must not keep the
// slice nor block long), until the returned function is called.
func (h *Hub) Watch(f func(frame []byte)) (stop func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.nextID
	h.nextID++
	h.watchers[id] = f
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.watchers, id)
	}
}

// Close stops the hub and disconnects every VM.
func (h *Hub) Close() error {
	h.mu.Lock()
	h.closed = true
	for p := range h.ports {
		p.conn.Close()
	}
	h.mu.Unlock()
	err := h.ln.Close()
	h.wg.Wait()
	return err
}

func (h *Hub) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		p := &hubPort{conn: c, out: make(chan []byte, hubQueue)}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.ports[p] = struct{}{}
		h.mu.Unlock()
		h.wg.Add(2)
		go h.read(p)
		go h.write(p)
	}
}

func (h *Hub) read(p *hubPort) {
	defer h.wg.Done()
	defer func() {
		h.mu.Lock()
		delete(h.ports, p)
		h.mu.Unlock()
		close(p.out)
		p.conn.Close()
	}()
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(p.conn, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > maxFrame {
			return
		}
		frame := make([]byte, 4+n)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(p.conn, frame[4:]); err != nil {
			return
		}
		h.mu.Lock()
		for _, f := range h.watchers {
			f(frame[4:])
		}
		for q := range h.ports {
			if q == p {
				continue
			}
			select {
			case q.out <- frame:
			default: // full: dropped
			}
		}
		h.mu.Unlock()
	}
}

func (h *Hub) write(p *hubPort) {
	defer h.wg.Done()
	for frame := range p.out {
		if _, err := p.conn.Write(frame); err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.conn.Close()
			}
			// Keep draining until read ends and closes out.
			for range p.out {
			}
			return
		}
	}
}
