// Package execcount counts execs whose output went missing: it runs a
// command that prints a fresh random token N times through an exec
// endpoint (the apiserver's pods/exec or a kubelet's /exec) and sorts the
// answers into those that carry the token, empty ones, runs of NUL bytes
// and others.
package execcount

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
)

// Result counts the answers of N execs.
type Result struct {
	N, OK, Empty, NUL, Other int
	// WrongStatus counts execs that did not end with the command's exit
	// status 1 (WantStatus).
	WrongStatus int
	// Samples are the first few wrong answers (output and error).
	Samples []string
}

// Lost is how many answers lacked their token.
func (r Result) Lost() int { return r.N - r.OK }

func (r Result) String() string {
	return fmt.Sprintf("%d/%d lost (empty %d, NUL %d, other %d; wrong status %d) %q", r.Lost(), r.N, r.Empty, r.NUL, r.Other, r.WrongStatus, r.Samples)
}

// Argv is the command run in the container for token: the bed's agent
// image prints its failed GET's URL, token included, to stderr and exits
// at once with status 1.
func Argv(token string) []string {
	return []string{"/vmagent", "http", "--timeout", "1s", "http://127.0.0.1:1/" + token}
}

// WantStatus is how an exec of Argv ends, in the words of client-go's
// executors (ctr's exit is reported the same way by the caller).
const WantStatus = "exit code 1"

// ExecFunc runs argv once and returns stdout and stderr together.
type ExecFunc func(ctx context.Context, argv []string) (string, error)

// Count runs n execs through exec.
func Count(ctx context.Context, n int, exec ExecFunc) Result {
	var res Result
	for i := 0; i < n; i++ {
		tok := make([]byte, 6)
		_, _ = rand.Read(tok)
		token := hex.EncodeToString(tok)
		out, err := exec(ctx, Argv(token))
		res.N++
		if err == nil || !strings.Contains(err.Error(), WantStatus) {
			res.WrongStatus++
		}
		switch {
		case strings.Contains(out, token):
			res.OK++
			continue
		case out == "":
			res.Empty++
		case strings.Trim(out, "\x00") == "":
			res.NUL++
		default:
			res.Other++
		}
		if len(res.Samples) < 5 {
			res.Samples = append(res.Samples, fmt.Sprintf("%.100q %v", out, err))
		}
	}
	return res
}

// Kubelet execs through a kubelet's own endpoint, base being
// https://HOST:10250/exec/NS/POD/CONTAINER (TLS not verified: the bed's
// kubelet serves a self-signed certificate).
func Kubelet(base string, ws bool) ExecFunc {
	return func(ctx context.Context, argv []string) (string, error) {
		u, err := url.Parse(base)
		if err != nil {
			return "", fmt.Errorf("exec %s: %w", base, err)
		}
		q := url.Values{"output": {"1"}, "error": {"1"}, "command": argv}
		u.RawQuery = q.Encode()
		cfg := &rest.Config{Host: u.Scheme + "://" + u.Host, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
		return Stream(ctx, cfg, u, ws)
	}
}

// Stream runs one exec at u with cfg's credentials and transport, with
// client-go's SPDY or WebSocket executor.
func Stream(ctx context.Context, cfg *rest.Config, u *url.URL, ws bool) (string, error) {
	var ex remotecommand.Executor
	var err error
	if ws {
		ex, err = remotecommand.NewWebSocketExecutor(cfg, "GET", u.String())
	} else {
		ex, err = remotecommand.NewSPDYExecutor(cfg, "POST", u)
	}
	if err != nil {
		return "", fmt.Errorf("exec %s: %w", u.Redacted(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	return out.String(), err
}
