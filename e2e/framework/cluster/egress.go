package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// egressProxy is the apiserver's way into the node: an HTTP CONNECT proxy
// on a unix socket (the apiserver's "cluster" egress selection) that dials
// each target from inside the VM through the in-guest agent. The
// apiserver thus reaches the kubelet (exec, logs, port-forward) and pods
// and services (the proxy subresources) at their real addresses, which
// QEMU's user network does not forward from the host.
type egressProxy struct {
	l    net.Listener
	logf func(string, ...any)

	mu   sync.Mutex
	dial func(ctx context.Context, addr string) (net.Conn, error) // nil until the VM is up
	wg   sync.WaitGroup
}

func startEgressProxy(socket string, logf func(string, ...any)) (*egressProxy, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	p := &egressProxy{l: l, logf: logf}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// setDialer sets how targets are dialed (the VM's Dial).
func (p *egressProxy) setDialer(dial func(ctx context.Context, addr string) (net.Conn, error)) {
	p.mu.Lock()
	p.dial = dial
	p.mu.Unlock()
}

func (p *egressProxy) close() {
	p.l.Close()
	p.wg.Wait()
}

func (p *egressProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.logf("egress proxy: %v", err)
			}
			return
		}
		go p.handle(c)
	}
}

// connectTimeout bounds reading the CONNECT request and dialing.
const connectTimeout = 15 * time.Second

func (p *egressProxy) handle(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(connectTimeout))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		c.Close()
		return
	}
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
		c.Close()
		return
	}
	addr := req.RequestURI
	p.mu.Lock()
	dial := p.dial
	p.mu.Unlock()
	if dial == nil {
		fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
		c.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	target, err := dial(ctx, addr)
	cancel()
	if err != nil {
		p.logf("egress proxy: CONNECT %s: %v", addr, err)
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		c.Close()
		target.Close()
		return
	}
	nettest.Splice(c, br, target)
}
