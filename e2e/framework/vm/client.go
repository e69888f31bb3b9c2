package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// call sends one request to the agent and decodes its answer into out
// (unless nil).
func (v *VM) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	contentType := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, contentType = bytes.NewReader(b), "application/json"
	}
	return v.send(ctx, method, path, body, contentType, out)
}

// send is call with a body of any type.
func (v *VM) send(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:"+strconv.Itoa(v.hostPort)+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+v.token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return fmt.Errorf("agent %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e agentapi.ErrorResponse
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return fmt.Errorf("agent %s: %s", path, e.Error)
		}
		return fmt.Errorf("agent %s: %s: %s", path, resp.Status, tail(string(b), 500))
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("agent %s: decode answer: %w", path, err)
	}
	return nil
}

// Command is a command to run in the guest.
type Command struct {
	Argv []string
	// Env is added to the agent's environment (PATH covers /usr/local/bin,
	// /usr/sbin, ...; IPVS_PROXY_IN_VM=1).
	Env   []string
	Dir   string
	Stdin []byte
	// Timeout kills the command in the guest; 0 means ctx's deadline, or
	// the agent's default of 10 minutes.
	Timeout time.Duration
}

// Result is the outcome of a command run in the guest.
type Result struct {
	Stdout, Stderr string
	// ExitCode is -1 when a signal ended the command.
	ExitCode int
	TimedOut bool
}

// Exec runs c in the guest to completion. The error reports failures to
// run it (the agent unreachable, no such executable), not its exit status.
func (v *VM) Exec(ctx context.Context, c Command) (Result, error) {
	if len(c.Argv) == 0 {
		return Result{}, errors.New("vm: exec: empty argv")
	}
	req := agentapi.RunRequest{Argv: c.Argv, Env: c.Env, Dir: c.Dir, Stdin: c.Stdin}
	timeout := c.Timeout
	if d, ok := ctx.Deadline(); ok && (timeout <= 0 || time.Until(d) < timeout) {
		// Let the guest end the command a little before ctx does, so that
		// the caller gets its output with TimedOut rather than ctx's error.
		timeout = time.Until(d)
		if timeout > 2*time.Second {
			timeout -= time.Second
		}
	}
	if timeout > 0 {
		req.TimeoutMS = max(timeout.Milliseconds(), 1)
	}
	var resp agentapi.RunResponse
	if err := v.call(ctx, "POST", agentapi.PathRun, req, &resp); err != nil {
		return Result{}, fmt.Errorf("vm: run %q: %w", c.Argv, err)
	}
	if resp.Error != "" {
		return Result{}, fmt.Errorf("vm: run %q: %s", c.Argv, resp.Error)
	}
	return Result{Stdout: string(resp.Stdout), Stderr: string(resp.Stderr), ExitCode: resp.ExitCode, TimedOut: resp.TimedOut}, nil
}

// Run runs argv in the guest.
func (v *VM) Run(ctx context.Context, argv ...string) (Result, error) {
	return v.Exec(ctx, Command{Argv: argv})
}

// RunOK runs argv in the guest and returns its stdout; a non-zero exit
// status is an error that carries stderr.
func (v *VM) RunOK(ctx context.Context, argv ...string) (string, error) {
	r, err := v.Run(ctx, argv...)
	if err != nil {
		return r.Stdout, err
	}
	if r.ExitCode != 0 {
		what := fmt.Sprintf("exit status %d", r.ExitCode)
		if r.TimedOut {
			what = "timed out"
		}
		return r.Stdout, fmt.Errorf("vm: %q: %s: %s", argv, what, strings.TrimSpace(r.Stderr))
	}
	return r.Stdout, nil
}

// WriteFile writes a file in the guest (atomically, creating its parent
// directories).
func (v *VM) WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error {
	if err := v.call(ctx, "POST", agentapi.PathWrite, agentapi.WriteRequest{Path: path, Mode: uint32(mode.Perm()), Data: data}, nil); err != nil {
		return fmt.Errorf("vm: write %s: %w", path, err)
	}
	return nil
}

// CopyFile copies the host file src to the guest path dst (atomically,
// creating its parent directories), with src's permissions. The content
// goes as a raw stream: use it rather than WriteFile for large files such
// as binaries.
func (v *VM) CopyFile(ctx context.Context, src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("vm: copy %s: %w", src, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("vm: copy %s: %w", src, err)
	}
	q := url.Values{"path": {dst}, "mode": {strconv.FormatUint(uint64(st.Mode().Perm()), 8)}}
	if err := v.send(ctx, "POST", agentapi.PathUpload+"?"+q.Encode(), f, "application/octet-stream", nil); err != nil {
		return fmt.Errorf("vm: copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// Hit runs `vmagent hit` in the guest and returns its counts.
func (v *VM) Hit(ctx context.Context, c nettest.HitConfig) (nettest.HitResult, error) {
	argv := []string{agentapi.AgentPath, "hit", "--proto", c.Proto, "--addr", c.Addr, "--n", strconv.Itoa(c.N)}
	if c.Netns != "" {
		argv = append(argv, "--netns", c.Netns)
	}
	if c.Timeout > 0 {
		argv = append(argv, "--timeout", c.Timeout.String())
	}
	if c.SourcePort != 0 {
		argv = append(argv, "--source-port", strconv.Itoa(c.SourcePort))
	}
	var res nettest.HitResult
	out, err := v.RunOK(ctx, argv...)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return res, fmt.Errorf("vm: hit: decode %q: %w", out, err)
	}
	return res, nil
}

// HTTPGet runs `vmagent http` in the guest, after prefix (e.g. a command
// that enters a network namespace), for one GET of url. A URL that gives
// no HTTP answer at all is no error: it gives status 0 and the reason as
// the body. The error reports failures to run the command.
func (v *VM) HTTPGet(ctx context.Context, url string, prefix ...string) (status int, body string, err error) {
	argv := append(append([]string{}, prefix...), agentapi.AgentPath, "http", "--timeout", "5s", url)
	r, err := v.Run(ctx, argv...)
	if err != nil {
		return 0, "", err
	}
	if r.ExitCode != 0 {
		return 0, strings.TrimSpace(r.Stderr), nil
	}
	var res agentapi.HTTPResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		return 0, "", fmt.Errorf("vm: http %s: decode %q: %w", url, r.Stdout, err)
	}
	return res.Status, res.Body, nil
}

// Proc is a process running in the background in the guest.
type Proc struct {
	vm   *VM
	id   int
	argv []string

	mu       sync.Mutex
	out      []byte
	next     int64
	exited   bool
	exitCode int
}

// Start starts argv in the background in the guest, in a process group of
// its own; its stdout and stderr are collected together.
func (v *VM) Start(ctx context.Context, argv ...string) (*Proc, error) {
	if len(argv) == 0 {
		return nil, errors.New("vm: start: empty argv")
	}
	var resp agentapi.StartResponse
	if err := v.call(ctx, "POST", agentapi.PathStart, agentapi.StartRequest{Argv: argv}, &resp); err != nil {
		return nil, fmt.Errorf("vm: start %q: %w", argv, err)
	}
	return &Proc{vm: v, id: resp.ID, argv: argv}, nil
}

func (p *Proc) update(st agentapi.ProcStatus) {
	if st.From > p.next {
		p.out = fmt.Appendf(p.out, "\n[... %d bytes of output dropped ...]\n", st.From-p.next)
	}
	p.out = append(p.out, st.Output...)
	p.next = st.Next
	p.exited, p.exitCode = st.Exited, st.ExitCode
}

func (p *Proc) refresh(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return nil
	}
	var st agentapi.ProcStatus
	if err := p.vm.call(ctx, "POST", agentapi.PathOutput, agentapi.OutputRequest{ID: p.id, Since: p.next}, &st); err != nil {
		return fmt.Errorf("vm: process %q: %w", p.argv, err)
	}
	p.update(st)
	return nil
}

// Output is the process's output so far (what was last seen, if the agent
// cannot be reached).
func (p *Proc) Output() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.refresh(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.out)
}

// Exited reports whether the process has ended, and its exit status (-1
// when a signal ended it).
func (p *Proc) Exited(ctx context.Context) (exited bool, code int, err error) {
	err = p.refresh(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited, p.exitCode, err
}

// Wait waits for the process to end and returns its exit status (-1 when a
// signal ended it).
func (p *Proc) Wait(ctx context.Context) (int, error) {
	for {
		exited, code, err := p.Exited(ctx)
		if err != nil || exited {
			return code, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("vm: wait for %q: %w", p.argv, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitFor waits until the process's output contains s; it fails when the
// process ends first.
func (p *Proc) WaitFor(ctx context.Context, s string) error {
	for {
		exited, code, err := p.Exited(ctx)
		if err != nil {
			return err
		}
		p.mu.Lock()
		found, out := bytes.Contains(p.out, []byte(s)), string(p.out)
		p.mu.Unlock()
		if found {
			return nil
		}
		if exited {
			return fmt.Errorf("vm: %q exited with status %d before printing %q; output:\n%s", p.argv, code, s, tail(out, 3000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm: %q did not print %q: %w; output:\n%s", p.argv, s, ctx.Err(), tail(out, 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop ends the process: SIGTERM to its process group, SIGKILL after 5 s.
// A process that has already ended is no error.
func (p *Proc) Stop() error { return p.stop(false) }

// Kill ends the process at once with SIGKILL to its process group, as a
// crash or the OOM killer would. A process that has already ended is no
// error.
func (p *Proc) Kill() error { return p.stop(true) }

func (p *Proc) stop(kill bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return nil
	}
	var st agentapi.ProcStatus
	if err := p.vm.call(ctx, "POST", agentapi.PathStop, agentapi.StopRequest{ID: p.id, Since: p.next, Kill: kill}, &st); err != nil {
		return fmt.Errorf("vm: stop %q: %w", p.argv, err)
	}
	p.update(st)
	return nil
}

// Dial connects to addr (host:port, TCP) from inside the guest through the
// agent (agentapi.PathDial): the host reaches the guest's own addresses,
// which QEMU's user network does not forward, such as the node's kubelet
// or a pod.
func (v *VM) Dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(v.hostPort))
	if err != nil {
		return nil, fmt.Errorf("vm: dial %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req := fmt.Sprintf("GET %s?%s HTTP/1.1\r\nHost: vmagent\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n",
		agentapi.PathDial, url.Values{"addr": {addr}}.Encode(), v.token, agentapi.DialUpgrade)
	br := bufio.NewReader(conn)
	var resp *http.Response
	if _, err = io.WriteString(conn, req); err == nil {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("vm: dial %s: %w", addr, err)
	}
	// A 101's body is http.NoBody (the connection itself carries the
	// stream); any other status's body is closed after conn, so that
	// closing it does not wait to drain it.
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		var e agentapi.ErrorResponse
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("vm: dial %s: %s", addr, e.Error)
		}
		return nil, fmt.Errorf("vm: dial %s: %s", addr, resp.Status)
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn is a connection whose first bytes may sit in r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection (the agent passes it on).
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
