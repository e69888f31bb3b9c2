package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
)

// silentListener is a listener on 127.0.0.1 whose accept queue is full:
// the kernel drops the SYNs of new connections, as from an apiserver (or
// a path to it) that is gone without a word. serve makes it answer: it
// accepts what is queued and serves h.
type silentListener struct {
	addr  string
	l     net.Listener
	queue []net.Conn
}

func newSilentListener(t *testing.T) *silentListener {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // a queue of one
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "silent")
	l, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := &silentListener{addr: l.Addr().String(), l: l}
	t.Cleanup(func() {
		_ = l.Close()
		for _, c := range s.queue {
			_ = c.Close()
		}
	})
	// Fill the queue until a connection is no longer taken.
	for i := 0; i < 8; i++ {
		c, err := net.DialTimeout("tcp", s.addr, 300*time.Millisecond)
		if err != nil {
			return s
		}
		s.queue = append(s.queue, c)
	}
	t.Fatalf("%s took 8 connections unaccepted: its queue is not full", s.addr)
	return nil
}

func (s *silentListener) serve(h http.Handler) {
	go func() { _ = http.Serve(s.l, h) }()
}

// versionHandler answers GET /version as an apiserver does.
func versionHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"major": "1", "minor": "36", "gitVersion": "v1.36.3"})
	})
}

// TestClientGivesUpOnASilentApiserver: the agent's client (TuneClientConfig)
// gives up dialling an apiserver that drops its SYNs after dialTimeout,
// not client-go's 30 s, with an error untilReachable waits over
// (unreachable); once the apiserver answers, the next request gets through.
func TestClientGivesUpOnASilentApiserver(t *testing.T) {
	s := newSilentListener(t)
	cfg := &rest.Config{Host: "http://" + s.addr}
	TuneClientConfig(cfg, "ipvs-proxy-test")
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	_, err = client.ServerVersion(ctx)
	took := time.Since(start)
	if err == nil {
		t.Fatal("GET /version answered by a listener that accepts nothing")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !unreachable(ctx, err) {
		t.Errorf("error %v: want a dial timeout that untilReachable waits over", err)
	}
	if took < dialTimeout-time.Second || took > dialTimeout+2*time.Second {
		t.Errorf("gave up after %v, want about %v", took.Round(time.Millisecond), dialTimeout)
	}
	t.Logf("a silent apiserver: gave up after %v (%v)", took.Round(time.Millisecond), err)
	s.serve(versionHandler())
	v, err := client.ServerVersion(ctx)
	if err != nil || v.GitVersion != "v1.36.3" {
		t.Errorf("after the apiserver answers: %v, %v", v, err)
	}
}
