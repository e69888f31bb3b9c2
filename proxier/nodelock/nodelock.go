// Package nodelock keeps one ipvs-proxy agent per node: `run` holds the
// lock for its whole life, and `cleanup` holds it while it removes
// things, so neither starts while the other runs.
//
// The lock is an abstract unix socket ("@ipvs-proxy-agent") bound in the
// network namespace of the node, which the agent shares (hostNetwork): a
// name, not a file, so it needs no mount, and the kernel frees it when the
// process ends however it ends (SIGKILL, OOM), leaving nothing stale. It
// does not depend on the metrics or health addresses, which may both be
// empty. Another network namespace has names of its own: agents in two
// namespaces of one host do not see each other, as they program different
// kernels' state.
//
// The holder answers whoever connects to the name with one line saying who
// it is (its pod, PID, start): a second agent in another pod cannot see
// the holder's process, so that line is how its refusal names the holder.
package nodelock

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
)

// Agent is the name `run` and `cleanup` lock.
const Agent = "ipvs-proxy-agent"

// maxWho bounds the description a holder gives of itself.
const maxWho = 256

// askTimeout bounds the wait for a holder's description: a holder that
// does not answer (an older release, a stuck process) is still named by
// its PID.
const askTimeout = time.Second

// Lock is a held lock; Release frees it. While held, it tells whoever
// connects to it who holds it (the who given to Acquire).
type Lock struct {
	l      *net.UnixListener
	served chan struct{} // closed when the answering loop has ended
}

// HeldError says the lock is held by another process; PID is that
// process's in this process's PID namespace, 0 where it cannot be seen
// (another pod's process, or one that ended meanwhile); Who is what the
// holder says of itself ("" if it said nothing).
type HeldError struct {
	Name string
	PID  int
	Who  string
}

func (e *HeldError) Error() string {
	proc := "another process"
	if e.PID > 0 {
		proc = fmt.Sprintf("process %d", e.PID)
	}
	msg := fmt.Sprintf("%s holds the lock @%s in this network namespace: an ipvs-proxy agent (or cleanup) runs on this node", proc, e.Name)
	if e.Who != "" {
		msg += fmt.Sprintf(" (the holder: %s)", e.Who)
	}
	return msg
}

// Who describes a holder for HeldError.Who: what it is (e.g. "ipvs-proxy
// run v0.3.0"), the pod it runs in when getenv knows one (POD_NAMESPACE
// and POD_NAME, set from the downward API), its PID in its own PID
// namespace and when it started.
func Who(what string, getenv func(string) string, pid int, started time.Time) string {
	parts := []string{what}
	if name := getenv("POD_NAME"); name != "" {
		parts = append(parts, "pod "+cmp.Or(getenv("POD_NAMESPACE"), "?")+"/"+name)
	}
	parts = append(parts, fmt.Sprintf("pid %d in its PID namespace", pid), "started "+started.UTC().Format(time.RFC3339))
	return strings.Join(parts, ", ")
}

// Acquire takes the lock name, or returns a *HeldError when another
// process holds it. While held, the lock answers each connection with
// who (bounded to maxWho bytes), which a refused Acquire reports.
func Acquire(name, who string) (*Lock, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if errors.Is(err, syscall.EADDRINUSE) {
		pid, said := holder(name)
		return nil, &HeldError{Name: name, PID: pid, Who: said}
	}
	if err != nil {
		return nil, fmt.Errorf("lock @%s: %w", name, err)
	}
	lock := &Lock{l: l, served: make(chan struct{})}
	go lock.answer(clean(who))
	return lock, nil
}

// answer writes who to each connection until the listener closes.
func (l *Lock) answer(who string) {
	defer close(l.served)
	for {
		c, err := l.l.AcceptUnix()
		if err != nil {
			return // closed by Release
		}
		_ = c.SetWriteDeadline(time.Now().Add(askTimeout))
		_, _ = c.Write([]byte(who + "\n"))
		_ = c.Close()
	}
}

// Release frees the lock (ending the process does too).
func (l *Lock) Release() error {
	err := l.l.Close()
	<-l.served
	if err != nil {
		return fmt.Errorf("release lock %s: %w", l.l.Addr(), err)
	}
	return nil
}

// holder returns the PID of the process that listens on name, from the
// credentials the kernel records with the listening socket, or 0; and
// what the holder says of itself, or "".
func holder(name string) (pid int, who string) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		return 0, ""
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, ""
	}
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	_ = c.SetReadDeadline(time.Now().Add(askTimeout))
	said, _ := io.ReadAll(io.LimitReader(c, maxWho+1))
	return pid, clean(string(said))
}

// clean keeps a description to one line of printable characters of at
// most maxWho bytes: it comes from another process.
func clean(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > maxWho {
		s = strings.ToValidUTF8(s[:maxWho], "")
	}
	return strings.TrimSpace(s)
}
