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
package nodelock

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Agent is the name `run` and `cleanup` lock.
const Agent = "ipvs-proxy-agent"

// Lock is a held lock; Release frees it.
type Lock struct {
	l *net.UnixListener
}

// HeldError says the lock is held by another process; PID is that
// process's in this process's PID namespace, 0 where it cannot be seen
// (another pod's process, or one that ended meanwhile).
type HeldError struct {
	Name string
	PID  int
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = fmt.Sprintf("process %d", e.PID)
	}
	return fmt.Sprintf("%s holds the lock @%s in this network namespace: an ipvs-proxy agent (or cleanup) runs on this node", who, e.Name)
}

// Acquire takes the lock name, or returns a *HeldError when another
// process holds it.
func Acquire(name string) (*Lock, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, &HeldError{Name: name, PID: holder(name)}
	}
	if err != nil {
		return nil, fmt.Errorf("lock @%s: %w", name, err)
	}
	return &Lock{l: l}, nil
}

// Release frees the lock (ending the process does too).
func (l *Lock) Release() error {
	if err := l.l.Close(); err != nil {
		return fmt.Errorf("release lock %s: %w", l.l.Addr(), err)
	}
	return nil
}

// holder returns the PID of the process that listens on name, from the
// credentials the kernel records with the listening socket, or 0.
func holder(name string) int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: "@" + name, Net: "unix"})
	if err != nil {
		return 0
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}
