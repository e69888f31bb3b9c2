package nettest

import (
	"io"
	"net"
)

// Splice copies both ways between a (read through r, which may hold bytes
// already read from a) and b until both directions end, passing
// half-closes on, then closes both. The guest agent's dial endpoint and
// the cluster's egress proxy join connections with it.
func Splice(a net.Conn, r io.Reader, b net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, r)
		closeWrite(b)
		close(done)
	}()
	_, _ = io.Copy(a, b)
	closeWrite(a)
	<-done
	a.Close()
	b.Close()
}

// closeWrite half-closes c where it can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
