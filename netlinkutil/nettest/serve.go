package nettest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
)

// ServeConfig says what a test backend serves.
type ServeConfig struct {
	// Netns is the named namespace to listen in; "" is the current one.
	Netns string
	// Name is what the backend answers with, so clients can tell backends
	// apart.
	Name string
	// Port is the TCP and/or UDP port, on all addresses (IPv4 and IPv6).
	Port int
	// TCP and UDP select the protocols; at least one must be set.
	TCP, UDP bool
}

// Server is a running test backend. Every TCP connection gets one line,
// "<name> <client-ip>\n", at once and the same line again for every line
// the client sends, until the client closes (so a client can hold a
// long-lived connection), except that a line "download N" is answered
// with N bytes (see Download); every UDP datagram gets the same line back as one
// datagram. The client IP is the source address the backend saw, so tests
// can tell whether traffic was masqueraded.
type Server struct {
	name string
	tcp  net.Listener
	udp  net.PacketConn
	wg   sync.WaitGroup
	once sync.Once

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// Serve starts a backend as c says and returns once its sockets are open.
func Serve(c ServeConfig) (*Server, error) {
	if c.Name == "" || c.Port <= 0 || c.Port > 65535 || (!c.TCP && !c.UDP) {
		return nil, fmt.Errorf("serve: need a name, a port and TCP and/or UDP, got %+v", c)
	}
	s := &Server{name: c.Name, conns: map[net.Conn]bool{}}
	addr := ":" + strconv.Itoa(c.Port)
	err := Do(c.Netns, func() error {
		var err error
		if c.TCP {
			if s.tcp, err = net.Listen("tcp", addr); err != nil {
				return fmt.Errorf("serve %s: %w", c.Name, err)
			}
		}
		if c.UDP {
			if s.udp, err = net.ListenPacket("udp", addr); err != nil {
				return fmt.Errorf("serve %s: %w", c.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	if s.tcp != nil {
		s.wg.Add(1)
		go s.serveTCP()
	}
	if s.udp != nil {
		s.wg.Add(1)
		go s.serveUDP()
	}
	return s, nil
}

// Reply is the line a backend sends to a client at address client.
func Reply(name string, client netip.Addr) string {
	return name + " " + client.Unmap().WithZone("").String() + "\n"
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !s.track(c, true) {
			c.Close()
			return
		}
		go func() {
			defer s.track(c, false)
			defer c.Close()
			var client netip.Addr
			if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				client = a.AddrPort().Addr()
			}
			answer(c, []byte(Reply(s.name, client)))
		}()
	}
}

// answer is one TCP connection's conversation: the reply line at once and
// again for every line the client sends, but a line "download N" gets N
// bytes instead (see Download).
func answer(c io.ReadWriter, reply []byte) {
	if _, err := c.Write(reply); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if n, ok := downloadSize(line); ok {
			err = writeDownload(c, n)
		} else {
			_, err = c.Write(reply)
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 64*1024)
	for {
		_, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var client netip.Addr
		if a, ok := from.(*net.UDPAddr); ok {
			client = a.AddrPort().Addr()
		}
		_, _ = s.udp.WriteTo([]byte(Reply(s.name, client)), from)
	}
}

// track adds (or removes) an open TCP connection, so that Close can end
// it; it refuses new ones once the server is closing.
func (s *Server) track(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if s.conns == nil {
		return false
	}
	s.conns[c] = true
	return true
}

// Close stops the backend, ends its open connections and waits for its
// loops to end.
func (s *Server) Close() error {
	var errs []error
	s.once.Do(func() {
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.conns = nil
		s.mu.Unlock()
		if s.tcp != nil {
			errs = append(errs, s.tcp.Close())
		}
		if s.udp != nil {
			errs = append(errs, s.udp.Close())
		}
	})
	s.wg.Wait()
	return errors.Join(errs...)
}
