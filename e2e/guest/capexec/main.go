// Command capexec runs a command with only some capabilities, as a
// container runtime would start an unprivileged container's process:
//
//	capexec --caps NET_ADMIN,NET_RAW -- COMMAND [ARG...]
//
// It drops every other capability from the bounding set (a root process
// then gets only those at exec), clears the inheritable and ambient sets,
// sets no_new_privs, and execs COMMAND. The end-to-end tests copy it into
// the VM to run ipvs-proxy with the DaemonSet's capabilities.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// capNames are the capabilities by name (linux/capability.h).
var capNames = map[string]uintptr{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
	"SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11,
	"NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17,
	"SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20, "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23,
	"SYS_RESOURCE": 24, "SYS_TIME": 25, "SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29,
	"AUDIT_CONTROL": 30, "SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
	"BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "capexec:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 3 || args[0] != "--caps" || args[2] != "--" || len(args) < 4 {
		return fmt.Errorf("usage: capexec --caps CAP,CAP -- COMMAND [ARG...]")
	}
	keep := map[uintptr]bool{}
	for _, c := range strings.Split(args[1], ",") {
		n, ok := capNames[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(c)), "CAP_")]
		if !ok {
			return fmt.Errorf("unknown capability %q", c)
		}
		keep[n] = true
	}
	argv := args[3:]
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	for c := uintptr(0); c <= 63; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if err == unix.EINVAL { // past the kernel's last capability
				break
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return syscall.Exec(path, argv, os.Environ())
}
