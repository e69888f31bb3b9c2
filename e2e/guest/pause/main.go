// Command pause is the sandbox ("pause") container of the e2e cluster's
// pods: it holds the pod's namespaces by doing nothing until SIGINT or
// SIGTERM, and reaps the orphans that the pod's PID namespace hands it
// when it is PID 1 there. The cluster fixture packs it into an image under
// the name kubelet and containerd expect (no registry is reachable).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: %v: exiting\n", s)
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
