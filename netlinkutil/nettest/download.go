package nettest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// MaxDownload bounds what one "download N" line may ask a Server for.
const MaxDownload = 1 << 30

// downloadChunk is what the server writes at a time.
const downloadChunk = 64 << 10

// downloadSize parses a client's line "download N"; ok is false for any
// other line (answered with the reply line) and for N out of 1..MaxDownload.
func downloadSize(line string) (n int64, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), "download ")
	if !found {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || n < 1 || n > MaxDownload {
		return 0, false
	}
	return n, true
}

// writeDownload writes n bytes: n-1 'd's and a newline.
func writeDownload(w io.Writer, n int64) error {
	chunk := []byte(strings.Repeat("d", downloadChunk))
	for n > 1 {
		k := min(n-1, int64(len(chunk)))
		if _, err := w.Write(chunk[:k]); err != nil {
			return err
		}
		n -= k
	}
	_, err := w.Write([]byte("\n"))
	return err
}

// DownloadConfig says what to download from a Server.
type DownloadConfig struct {
	// Netns is the named namespace to connect from; "" is the current one.
	Netns string
	// Addr is host:port.
	Addr string
	// Size is the download's size in bytes, 1..MaxDownload.
	Size int64
	// Timeout bounds the whole download; 0 means a minute.
	Timeout time.Duration
}

// DownloadResult is one download: the backend's greeting line ("<name>
// <client-ip>"), the bytes received, and the time from the request to the
// last byte.
type DownloadResult struct {
	Greeting string        `json:"greeting"`
	Bytes    int64         `json:"bytes"`
	Took     time.Duration `json:"took"`
	// MiBps is Bytes/Took in MiB/s.
	MiBps float64 `json:"mibps"`
}

// Download opens one TCP connection to c.Addr, asks the Server for
// c.Size bytes and reads them, to time a download through a virtual IP.
func Download(ctx context.Context, c DownloadConfig) (DownloadResult, error) {
	if c.Size < 1 || c.Size > MaxDownload {
		return DownloadResult{}, fmt.Errorf("download from %s: size %d out of 1..%d", c.Addr, c.Size, MaxDownload)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var conn net.Conn
	var dialErr error
	if err := Do(c.Netns, func() error {
		conn, dialErr = (&net.Dialer{}).DialContext(ctx, "tcp", c.Addr)
		return nil
	}); err != nil {
		return DownloadResult{}, fmt.Errorf("download from %s: %w", c.Addr, err)
	}
	if dialErr != nil {
		return DownloadResult{}, fmt.Errorf("download from %s: %w", c.Addr, dialErr)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	res, err := download(conn, c.Size)
	if err != nil {
		return res, fmt.Errorf("download %d bytes from %s: %w", c.Size, c.Addr, err)
	}
	return res, nil
}

// download runs the client's side of one download on conn.
func download(conn io.ReadWriter, size int64) (DownloadResult, error) {
	r := bufio.NewReaderSize(conn, downloadChunk)
	greeting, err := r.ReadString('\n')
	if err != nil {
		return DownloadResult{}, fmt.Errorf("greeting: %w", err)
	}
	res := DownloadResult{Greeting: strings.TrimSpace(greeting)}
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "download %d\n", size); err != nil {
		return res, fmt.Errorf("request: %w", err)
	}
	res.Bytes, err = io.CopyN(io.Discard, r, size)
	res.Took = time.Since(start)
	if res.Took > 0 {
		res.MiBps = float64(res.Bytes) / (1 << 20) / res.Took.Seconds()
	}
	return res, err
}
