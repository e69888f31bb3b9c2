package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// ctFiller holds TCP connections open to fill the connection tracking
// table of the namespaces they cross with established (assured) entries,
// which the kernel does not evict for room.
type ctFiller struct {
	ns, addr string
	timeout  time.Duration

	mu     sync.Mutex
	conns  []net.Conn
	failed int
}

// dial opens one more connection; false when it failed.
func (f *ctFiller) dial(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var conn net.Conn
	var err error
	if nerr := nettest.Do(f.ns, func() error {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", f.addr)
		return nil
	}); nerr != nil {
		err = nerr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.failed++
		return false
	}
	f.conns = append(f.conns, conn)
	return true
}

func (f *ctFiller) held() (held, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns), f.failed
}

// fill dials with 8 workers until n are held or stop dials in a row have
// failed.
func (f *ctFiller) fill(ctx context.Context, n, stop int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	inARow := 0
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				held, _ := f.held()
				done := held >= n || inARow >= stop
				mu.Unlock()
				if done {
					return
				}
				ok := f.dial(ctx)
				mu.Lock()
				if ok {
					inARow = 0
				} else {
					inARow++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// close ends every connection with a reset (SO_LINGER 0): their entries
// go at once, no TIME_WAIT.
func (f *ctFiller) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// ctFillCmd: vmagent ctfill --netns NS --addr HOST:PORT --n N: holds up to
// N TCP connections to addr, opened until --stop dials in a row fail (the
// table is full), and prints "filled held=H failed=F"; then it tries one
// more every --every while fewer than N are held, so that the table stays
// full, until SIGTERM, when it prints "final held=H failed=F" and resets
// them all.
func ctFillCmd(args []string, stdout io.Writer) error {
	fs := newFlags("ctfill")
	f := &ctFiller{}
	fs.StringVar(&f.ns, "netns", "", "namespace to connect from (default: the root namespace)")
	fs.StringVar(&f.addr, "addr", "", "HOST:PORT of a TCP server that holds connections")
	fs.DurationVar(&f.timeout, "timeout", time.Second, "timeout of one dial")
	n := fs.Int("n", 1000, "connections to hold at most")
	stop := fs.Int("stop", 20, "dials failed in a row that end the first fill")
	every := fs.Duration("every", 200*time.Millisecond, "pause between the dials that keep the table full")
	if err := parse(fs, args); err != nil {
		return err
	}
	if f.addr == "" || *n < 1 {
		return fmt.Errorf("%w: ctfill: need --addr and --n > 0", errUsage)
	}
	// One descriptor per connection: more than the 4096 a process gets.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: uint64(*n) + 256, Max: uint64(*n) + 256}); err != nil && *n > 3000 {
		return fmt.Errorf("ctfill: room for %d connections: %w", *n, err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	defer f.close()
	f.fill(ctx, *n, *stop)
	held, failed := f.held()
	fmt.Fprintf(stdout, "filled held=%d failed=%d\n", held, failed)
	t := time.NewTicker(*every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			held, failed := f.held()
			fmt.Fprintf(stdout, "final held=%d failed=%d\n", held, failed)
			return nil
		case <-t.C:
			if held, _ := f.held(); held < *n {
				f.dial(ctx)
			}
		}
	}
}
