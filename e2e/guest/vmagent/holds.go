package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// holdsCmd holds --n TCP connections at once, from the source ports
// --first on, in one process (a guest with little memory runs one process,
// not one per connection). Each line of a connection is hold's, behind
// its source port: "PORT answer N ...", "PORT error ...".
func holdsCmd(args []string, stdout io.Writer) error {
	fs := newFlags("holds")
	addr := fs.String("addr", "", "HOST:PORT to connect to")
	first := fs.Int("first", 40000, "the first source port")
	n := fs.Int("n", 1, "how many connections")
	interval := fs.Duration("interval", 200*time.Millisecond, "pause between questions")
	timeout := fs.Duration("timeout", nettest.DefaultHitTimeout, "timeout of the connect and of each answer")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *addr == "" || *n < 1 || *first < 1 || *first+*n > 65536 {
		return fmt.Errorf("%w: holds: need --addr and ports --first .. --first+--n-1 within 1..65535", errUsage)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for port := *first; port < *first+*n; port++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &prefixWriter{mu: &mu, out: stdout, prefix: strconv.Itoa(port) + " "}
			c := nettest.HoldConfig{Proto: "tcp", Addr: *addr, Interval: *interval, Timeout: *timeout, SourcePort: port}
			_ = nettest.Hold(ctx, c, w) // its error is printed as the connection's last line
		}()
	}
	wg.Wait()
	return nil
}

// prefixWriter writes each Write (one line of hold's) behind a prefix,
// one writer at a time.
type prefixWriter struct {
	mu     *sync.Mutex
	out    io.Writer
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := io.WriteString(w.out, w.prefix); err != nil {
		return 0, err
	}
	return w.out.Write(p)
}
