package nettest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestSpliceHalfClose: the side that ends first (here the target, as a
// kubelet does after an exec's last bytes) must not cut the other
// direction short, the tail of each direction arrives whole, bytes the
// caller had already read into its buffer go first, and the splice ends
// once both directions ended.
func TestSpliceHalfClose(t *testing.T) {
	for _, first := range []string{"target", "client"} {
		t.Run(first+" ends first", func(t *testing.T) {
			client, front := tcpPair(t) // client -> front: the splice's side a
			back, target := tcpPair(t)  // back -> target: the splice's side b
			_ = client.SetDeadline(time.Now().Add(10 * time.Second))
			_ = target.SetDeadline(time.Now().Add(10 * time.Second))

			// The caller read a request and a little more from a
			// (like an HTTP server before a hijack).
			if _, err := client.Write([]byte("REQUEST\nearly bytes;")); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(front)
			if line, err := br.ReadString('\n'); err != nil || line != "REQUEST\n" {
				t.Fatalf("request line %q, %v", line, err)
			}
			done := make(chan struct{})
			go func() {
				Splice(front, br, back)
				close(done)
			}()

			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, more than socket buffers
			fromTarget := append(append([]byte{}, big...), "TARGET-TAIL"...)
			fromClient := append(append([]byte{}, big...), "CLIENT-TAIL"...)
			write := func(c *net.TCPConn, b []byte) chan error {
				ch := make(chan error, 1)
				go func() {
					_, err := c.Write(b)
					if err == nil {
						err = c.CloseWrite()
					}
					ch <- err
				}()
				return ch
			}
			gotByClient := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(client)
				gotByClient <- b
			}()
			var targetDone, clientDone chan error
			if first == "target" {
				targetDone = write(target, fromTarget)
				if err := <-targetDone; err != nil {
					t.Fatal(err)
				}
				// The target has ended its side; the client still
				// talks, and its bytes must still reach the target.
				clientDone = write(client, fromClient)
			} else {
				clientDone = write(client, fromClient)
				if err := <-clientDone; err != nil {
					t.Fatal(err)
				}
				targetDone = write(target, fromTarget)
			}
			gotByTarget, err := io.ReadAll(target)
			if err != nil {
				t.Fatalf("target read: %v", err)
			}
			if want := "early bytes;" + string(fromClient); string(gotByTarget) != want {
				t.Errorf("target got %d bytes ending %q; want %d ending %q", len(gotByTarget), tail(gotByTarget), len(want), tail([]byte(want)))
			}
			if b := <-gotByClient; !bytes.Equal(b, fromTarget) {
				t.Errorf("client got %d bytes ending %q; want %d ending %q", len(b), tail(b), len(fromTarget), tail(fromTarget))
			}
			for _, ch := range []chan error{targetDone, clientDone} {
				select {
				case err := <-ch:
					if err != nil {
						t.Error(err)
					}
				default:
				}
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Splice did not return after both directions ended")
			}
		})
	}
}

func tail(b []byte) string {
	s := string(b)
	if len(s) > 16 {
		s = s[len(s)-16:]
	}
	return strings.ToValidUTF8(s, "?")
}
