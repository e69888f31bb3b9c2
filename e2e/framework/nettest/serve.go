package nettest

import (
	"errors"
	"fmt"
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
// "<name> <client-ip>\n", and is then closed; every UDP datagram gets the
// same line back as one datagram. The client IP is the source address the
// backend saw, so tests can tell whether traffic was masqueraded.
type Server struct {
	name string
	tcp  net.Listener
	udp  net.PacketConn
	wg   sync.WaitGroup
	once sync.Once
}

// Serve starts a backend as c says and returns once its sockets are open.
func Serve(c ServeConfig) (*Server, error) {
	if c.Name == "" || c.Port <= 0 || c.Port > 65535 || (!c.TCP && !c.UDP) {
		return nil, fmt.Errorf("serve: need a name, a port and TCP and/or UDP, got %+v", c)
	}
	s := &Server{name: c.Name}
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
		go func() {
			defer c.Close()
			var client netip.Addr
			if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				client = a.AddrPort().Addr()
			}
			_, _ = c.Write([]byte(Reply(s.name, client)))
		}()
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

// Close stops the backend and waits for its loops to end.
func (s *Server) Close() error {
	var errs []error
	s.once.Do(func() {
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
