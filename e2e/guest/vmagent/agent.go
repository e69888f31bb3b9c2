package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

const (
	// defaultRunTimeout bounds a RunRequest without a timeout, so that a
	// forgotten command cannot hang a test run forever.
	defaultRunTimeout = 10 * time.Minute
	defaultStopGrace  = 5 * time.Second
	// waitDelay is how long a finished command's pipes may stay open
	// (held by a child it left behind) before the agent stops reading.
	waitDelay = 2 * time.Second
	// keepOutput is how much output of a background process is kept.
	keepOutput = 8 << 20
)

// agent serves the host's requests inside the VM.
type agent struct {
	token string

	mu     sync.Mutex
	procs  map[int]*proc
	nextID int
}

func runAgent(listen, tokenFile string) error {
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("agent: read token: %w", err)
	}
	a := &agent{token: strings.TrimSpace(string(tok)), procs: map[int]*proc{}}
	if a.token == "" {
		return fmt.Errorf("agent: empty token in %s", tokenFile)
	}
	if err := os.Setenv(agentapi.EnvInVM, "1"); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentapi.PathPing, a.handlePing)
	mux.HandleFunc("POST "+agentapi.PathRun, a.handleRun)
	mux.HandleFunc("POST "+agentapi.PathStart, a.handleStart)
	mux.HandleFunc("POST "+agentapi.PathOutput, a.handleOutput)
	mux.HandleFunc("POST "+agentapi.PathStop, a.handleStop)
	mux.HandleFunc("POST "+agentapi.PathWrite, a.handleWrite)
	mux.HandleFunc("POST "+agentapi.PathUpload, a.handleUpload)
	mux.HandleFunc("POST "+agentapi.PathPoweroff, a.handlePoweroff)
	mux.HandleFunc("GET "+agentapi.PathDial, a.handleDial)

	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	log.Printf("vmagent: listening on %s", l.Addr())
	srv := &http.Server{Handler: a.auth(mux), ReadHeaderTimeout: 30 * time.Second}
	return srv.Serve(l)
}

func (a *agent) auth(next http.Handler) http.Handler {
	want := []byte("Bearer " + a.token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, http.StatusUnauthorized, errors.New("bad or missing token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Printf("vmagent: write response: %v", err)
	}
}

func writeError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(agentapi.ErrorResponse{Error: err.Error()})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("decode request: %w", err))
		return false
	}
	return true
}

func (a *agent) handlePing(w http.ResponseWriter, _ *http.Request) {
	var resp agentapi.PingResponse
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		f := strings.Fields(string(b))
		if len(f) > 0 {
			resp.Uptime, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		resp.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile(agentapi.InitErrorsPath); err == nil {
		resp.InitErrors = string(b)
	}
	writeJSON(w, resp)
}

// command makes an exec.Cmd in its own process group, so that stopping it
// stops whatever it started too.
func command(ctx context.Context, argv, env []string, dir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	return cmd
}

// exitCode is the status of a finished command, -1 when a signal ended it.
func exitCode(cmd *exec.Cmd) int {
	if cmd.ProcessState == nil {
		return -1
	}
	return cmd.ProcessState.ExitCode()
}

func (a *agent) handleRun(w http.ResponseWriter, r *http.Request) {
	var req agentapi.RunRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.Argv) == 0 {
		writeError(w, http.StatusBadRequest, errors.New("run: empty argv"))
		return
	}
	timeout := defaultRunTimeout
	if req.TimeoutMS > 0 {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	// r.Context ends when the host gives up (closes the connection), which
	// kills the command.
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := command(ctx, req.Argv, req.Env, req.Dir)
	cmd.Stdin = bytes.NewReader(req.Stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	resp := agentapi.RunResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: exitCode(cmd)}
	var exitErr *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay), errors.As(err, &exitErr):
	case cmd.ProcessState == nil:
		resp.Error = err.Error()
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Context().Err() == nil {
		resp.TimedOut = true
	}
	writeJSON(w, resp)
}

// proc is a background process started by the host.
type proc struct {
	cmd  *exec.Cmd
	out  outputBuffer
	done chan struct{} // closed when the process has exited
	code int           // valid after done
}

// outputBuffer keeps the last keepOutput bytes of a process's output.
type outputBuffer struct {
	mu    sync.Mutex
	buf   []byte
	start int64 // offset of buf[0] in the whole output
}

func (b *outputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 2*keepOutput {
		drop := len(b.buf) - keepOutput
		b.buf = append([]byte(nil), b.buf[drop:]...)
		b.start += int64(drop)
	}
	return len(p), nil
}

func (b *outputBuffer) since(off int64) (data []byte, from, next int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	end := b.start + int64(len(b.buf))
	from = min(max(off, b.start), end)
	return append([]byte(nil), b.buf[from-b.start:]...), from, end
}

func (p *proc) status(since int64) agentapi.ProcStatus {
	var st agentapi.ProcStatus
	select {
	case <-p.done:
		st.Exited, st.ExitCode = true, p.code
	default:
	}
	// Output after the exit check, so that an exited status comes with all
	// of the output.
	st.Output, st.From, st.Next = p.out.since(since)
	return st
}

func (a *agent) handleStart(w http.ResponseWriter, r *http.Request) {
	var req agentapi.StartRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.Argv) == 0 {
		writeError(w, http.StatusBadRequest, errors.New("start: empty argv"))
		return
	}
	p := &proc{done: make(chan struct{})}
	p.cmd = command(context.Background(), req.Argv, req.Env, req.Dir)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("start %q: %w", req.Argv, err))
		return
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = exitCode(p.cmd)
		close(p.done)
	}()
	a.mu.Lock()
	a.nextID++
	id := a.nextID
	a.procs[id] = p
	a.mu.Unlock()
	log.Printf("vmagent: started #%d pid %d: %q", id, p.cmd.Process.Pid, req.Argv)
	writeJSON(w, agentapi.StartResponse{ID: id})
}

func (a *agent) proc(w http.ResponseWriter, id int) *proc {
	a.mu.Lock()
	p := a.procs[id]
	a.mu.Unlock()
	if p == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("no process #%d", id))
	}
	return p
}

func (a *agent) handleOutput(w http.ResponseWriter, r *http.Request) {
	var req agentapi.OutputRequest
	if !decode(w, r, &req) {
		return
	}
	if p := a.proc(w, req.ID); p != nil {
		writeJSON(w, p.status(req.Since))
	}
}

func (a *agent) handleStop(w http.ResponseWriter, r *http.Request) {
	var req agentapi.StopRequest
	if !decode(w, r, &req) {
		return
	}
	p := a.proc(w, req.ID)
	if p == nil {
		return
	}
	grace := defaultStopGrace
	if req.GraceMS > 0 {
		grace = time.Duration(req.GraceMS) * time.Millisecond
	}
	if req.Kill {
		grace = 0
	}
	pgid := p.cmd.Process.Pid
	select {
	case <-p.done:
	default:
		if grace > 0 {
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(waitDelay + 3*time.Second):
				writeError(w, http.StatusInternalServerError, fmt.Errorf("process #%d did not end after SIGKILL", req.ID))
				return
			}
		}
	}
	// Leave nothing of its process group behind either.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	writeJSON(w, p.status(req.Since))
}

func (a *agent) handleWrite(w http.ResponseWriter, r *http.Request) {
	var req agentapi.WriteRequest
	if !decode(w, r, &req) {
		return
	}
	if err := writeFile(req.Path, bytes.NewReader(req.Data), os.FileMode(req.Mode)); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, struct{}{})
}

// handleUpload writes the request's raw body to the file named by the
// query (path, mode in octal): large files without JSON's base64.
func (a *agent) handleUpload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, err := strconv.ParseUint(q.Get("mode"), 8, 32)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("mode %q: %w", q.Get("mode"), err))
		return
	}
	if err := writeFile(q.Get("path"), r.Body, os.FileMode(mode)); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, struct{}{})
}

// writeFile writes through a temporary file and a rename, so that
// replacing a running binary works and readers never see half a file.
func writeFile(path string, data io.Reader, mode os.FileMode) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("write %q: need an absolute path", path)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode.Perm()); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func (a *agent) handlePoweroff(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, struct{}{})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	go func() {
		log.Printf("vmagent: powering off")
		time.Sleep(100 * time.Millisecond) // let the answer go out
		unix.Sync()
		if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
			log.Printf("vmagent: power off: %v", err)
		}
	}()
}

// dialTimeout bounds a PathDial's connection attempt.
const dialTimeout = 10 * time.Second

// handleDial connects to ?addr= and, once connected, turns the request's
// connection into a pipe to it (see agentapi.PathDial).
func (a *agent) handleDial(w http.ResponseWriter, r *http.Request) {
	addr := r.URL.Query().Get("addr")
	if !strings.EqualFold(r.Header.Get("Upgrade"), agentapi.DialUpgrade) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("dial: want Upgrade: %s", agentapi.DialUpgrade))
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	target, err := d.DialContext(r.Context(), "tcp", addr)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("dial %q: %w", addr, err))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		target.Close()
		writeError(w, http.StatusInternalServerError, fmt.Errorf("dial %q: hijack: %w", addr, err))
		return
	}
	_ = conn.SetDeadline(time.Time{}) // the server's header timeout no longer applies
	_, err = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + agentapi.DialUpgrade + "\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		conn.Close()
		target.Close()
		return
	}
	// brw.Reader may already hold the client's first bytes.
	nettest.Splice(conn, brw.Reader, target)
}
