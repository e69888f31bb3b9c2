package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 5 * time.Second

// errPortInUse marks a start failure that a retry with other ports may cure.
var errPortInUse = errors.New("address already in use")

// spawner starts child processes from one OS thread that never exits.
//
// Every child gets Pdeathsig=SIGKILL so that it dies with the test binary,
// even when that is killed with SIGKILL. Linux delivers the parent-death
// signal when the *thread* that forked the child exits, not the process. Go
// normally keeps its threads, but it does end a thread whose goroutine exits
// while locked with runtime.LockOSThread, which is what code that enters a
// network namespace (vishvananda/netns) does on purpose to throw away a
// tainted thread; if that were the thread that started etcd, etcd would die
// mid-test. Forking from a goroutine that locks its thread and
// then blocks forever rules that out. Package-level because the thread must
// outlive every control plane of the process.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

// spawn runs cmd.Start on the spawner thread.
func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: this goroutine never returns
			for r := range spawner.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd, errc}
	return <-errc
}

// process is one running child in its own process group.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has been reaped
	waitErr error         // valid once done is closed
}

// startProcess starts bin with args; stdout and stderr go to logPath.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile // *os.File: no copying goroutines
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, SIGKILL after stopGrace, and
// waits until the process has been reaped. It reports whether SIGKILL was
// needed.
func (p *process) stop() (killed bool) {
	if p.exited() {
		return false
	}
	pgid := p.pid() // the leader of its own group (Setpgid)
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return false
	case <-time.After(stopGrace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
	return true
}

// failure describes why the process could not come up, with the tail of its
// log; it wraps errPortInUse when the log says a port was taken.
func (p *process) failure(reason error) error {
	logTail := tail(readFileTail(p.logPath, 16<<10), 40)
	err := fmt.Errorf("%s: %w", p.name, reason)
	if p.exited() {
		err = fmt.Errorf("%s exited (%w): %w", p.name, exitStatus(p.waitErr), reason)
	}
	if bytes.Contains(logTail, []byte("address already in use")) {
		err = fmt.Errorf("%w (%w)", err, errPortInUse)
	}
	return fmt.Errorf("%w; last lines of %s:\n%s", err, p.logPath, logTail)
}

// errCleanExit stands for the nil error of a process that exited with
// status 0, in an error that wraps its exit status.
var errCleanExit = errors.New("exit status 0")

// exitStatus is a process's exit status (Wait's error) as an error to
// wrap: err itself, or errCleanExit for a clean exit.
func exitStatus(err error) error {
	if err == nil {
		return errCleanExit
	}
	return err
}

// readFileTail returns up to the last n bytes of a file.
func readFileTail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return []byte(err.Error())
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return b
}

// tail returns the last n lines of b.
func tail(b []byte, n int) []byte {
	b = bytes.TrimRight(b, "\n")
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			if n--; n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}
