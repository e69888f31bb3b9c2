package nettest

import (
	"net"
	"strings"
	"testing"
)

func TestDownloadSize(t *testing.T) {
	for _, c := range []struct {
		line string
		n    int64
		ok   bool
	}{
		{"download 10\n", 10, true},
		{"download 1\n", 1, true},
		{"download 0\n", 0, false},
		{"download -5\n", 0, false},
		{"download 1073741825\n", 0, false},
		{"download x\n", 0, false},
		{"hello\n", 0, false},
		{"downloads 10\n", 0, false},
	} {
		if n, ok := downloadSize(c.line); n != c.n || ok != c.ok {
			t.Errorf("downloadSize(%q) = %d, %v; want %d, %v", c.line, n, ok, c.n, c.ok)
		}
	}
}

// TestDownloadOverPipe: the server's conversation answers a plain line with
// its reply and "download N" with exactly N bytes, then goes on answering.
func TestDownloadOverPipe(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	reply := []byte("srv 10.0.0.1\n")
	go func() {
		defer server.Close()
		answer(server, reply)
	}()
	const size = 3*downloadChunk + 17
	res, err := download(client, size)
	if err != nil {
		t.Fatal(err)
	}
	if res.Greeting != "srv 10.0.0.1" || res.Bytes != size || res.Took <= 0 {
		t.Fatalf("download = %+v; want greeting %q and %d bytes", res, "srv 10.0.0.1", size)
	}
	// The connection still answers plain lines after a download.
	if _, err := client.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(reply))
	if _, err := client.Read(buf); err != nil || string(buf) != string(reply) {
		t.Fatalf("after the download: %q, %v; want the reply line", buf, err)
	}
}

func TestDownloadRefusesSize(t *testing.T) {
	if _, err := Download(t.Context(), DownloadConfig{Addr: "127.0.0.1:1", Size: 0}); err == nil || !strings.Contains(err.Error(), "size 0") {
		t.Fatalf("Download of 0 bytes: %v; want a size error", err)
	}
}
