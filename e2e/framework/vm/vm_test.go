package vm_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// TestSmoke boots a VM and checks the test bed end to end: IPVS tools,
// namespaces, backends, TCP and UDP virtual servers with real traffic,
// error classification, a Go test binary run inside, and a clean shutdown.
func TestSmoke(t *testing.T) {
	start := time.Now()
	a := vm.Require(t)
	t.Logf("assets ready in %v: kernel %s, %s", time.Since(start).Round(time.Millisecond), a.KernelABI, a.Dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// nettest's own tests run inside the guest (they skip on the host).
	nettestBin := filepath.Join(t.TempDir(), "nettest.test")
	if err := vm.BuildTestBinary(ctx, "github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest", nettestBin); err != nil {
		t.Fatal(err)
	}

	// A stand-in for the apiserver on the host's loopback: one line per
	// connection; it closes the connection when the client has finished,
	// except for "hold" connections (those stay open until the test ends,
	// to show that Shutdown kills the host-side nc).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testDone := make(chan struct{})
	defer close(testDone)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte("hello from the host\n"))
				b, _ := io.ReadAll(c)
				if strings.HasPrefix(string(b), "hold") {
					<-testDone
				}
			}()
		}
	}()

	bootStart := time.Now()
	v := vm.Boot(t, vm.Options{
		Assets:        a,
		Files:         map[string]string{"/usr/local/bin/nettest.test": nettestBin},
		APIServerPort: l.Addr().(*net.TCPAddr).Port,
	})
	t.Logf("boot to ready: %v (Start total %v)", v.BootTime.Round(time.Millisecond), time.Since(bootStart).Round(time.Millisecond))
	pid := v.PID()

	run := func(argv ...string) string {
		t.Helper()
		out, err := v.RunOK(ctx, argv...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := run("ipvsadm", "-Ln"); !strings.Contains(out, "IP Virtual Server version") {
		t.Fatalf("ipvsadm -Ln: %q", out)
	}
	run("cat", "/proc/net/ip_vs")

	// Backends be1, be2 and a client, each in a namespace behind a veth.
	agent := agentapi.AgentPath
	run(agent, "netns", "add", "be1", "--veth-host-addr", "10.1.1.1/24", "--addr", "10.1.1.2/24")
	run(agent, "netns", "add", "be2", "--veth-host-addr", "10.1.2.1/24", "--addr", "10.1.2.2/24")
	run(agent, "netns", "add", "cli", "--veth-host-addr", "10.1.3.1/24", "--addr", "10.1.3.2/24", "--addr6", "fd00:1:3::2/64")
	if out := run(agent, "netns", "exec", "cli", "--", "ip", "addr", "show", "eth0"); !strings.Contains(out, "10.1.3.2/24") || !strings.Contains(out, "fd00:1:3::2/64") {
		t.Fatalf("addresses in netns cli: %s", out)
	}
	if out := run("ip", "addr", "show", nettest.HostVeth("cli")); !strings.Contains(out, "10.1.3.1/24") || !strings.Contains(out, "fd00:1:3::1/64") {
		t.Fatalf("addresses of the root side of netns cli: %s", out)
	}
	var servers []*vm.Proc
	for _, be := range []string{"be1", "be2"} {
		p, err := v.Start(ctx, agent, "serve", "--netns", be, "--name", be, "--port", "8080", "--tcp", "--udp")
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, p)
		if err := p.WaitFor(ctx, "READY"); err != nil {
			t.Fatal(err)
		}
	}

	// A kube-proxy style VIP on a dummy interface, TCP and UDP services.
	run("ip", "link", "add", "kube-ipvs0", "type", "dummy")
	run("ip", "addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0")
	run("sysctl", "-w", "net.ipv4.ip_forward=1")
	for _, proto := range []string{"-t", "-u"} {
		run("ipvsadm", "-A", proto, "10.96.0.10:80", "-s", "rr")
		run("ipvsadm", "-a", proto, "10.96.0.10:80", "-r", "10.1.1.2:8080", "-m")
		run("ipvsadm", "-a", proto, "10.96.0.10:80", "-r", "10.1.2.2:8080", "-m")
	}
	t.Logf("ipvsadm -Ln:\n%s", run("ipvsadm", "-Ln"))

	for _, proto := range []string{"tcp", "udp"} {
		res, err := v.Hit(ctx, nettest.HitConfig{Netns: "cli", Proto: proto, Addr: "10.96.0.10:80", N: 6})
		if err != nil {
			t.Fatal(err)
		}
		if res.Answers["be1"] != 3 || res.Answers["be2"] != 3 || len(res.Errors) != 0 {
			t.Errorf("%s via 10.96.0.10:80 from cli: %+v, want be1=3 be2=3", proto, res)
		}
		if res.Clients["10.1.3.2"] != 6 {
			t.Errorf("%s: backends saw clients %v, want 10.1.3.2 (no masquerading)", proto, res.Clients)
		}
	}

	// Failures are classified: no service on port 81 of a local address is
	// refused (RST, or ICMP port unreachable); an address that never
	// answers ARP times out.
	for _, proto := range []string{"tcp", "udp"} {
		res, err := v.Hit(ctx, nettest.HitConfig{Netns: "cli", Proto: proto, Addr: "10.96.0.10:81", N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if res.ErrorCount(nettest.ErrRefused) != 1 {
			t.Errorf("%s to 10.96.0.10:81: %+v, want refused", proto, res)
		}
	}
	res, err := v.Hit(ctx, nettest.HitConfig{Proto: "tcp", Addr: "10.1.3.99:80", N: 1, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorCount(nettest.ErrTimeout) != 1 {
		t.Errorf("tcp to 10.1.3.99:80: %+v, want timeout", res)
	}

	for _, p := range servers {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
		if exited, _, err := p.Exited(ctx); err != nil || !exited {
			t.Errorf("server still running after Stop (err %v); output: %s", err, p.Output())
		}
	}

	// Files and commands: stdin, exit codes, timeouts.
	if err := v.WriteFile(ctx, "/tmp/x/hello", []byte("hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := run("stat", "-c", "%a %s", "/tmp/x/hello"); strings.TrimSpace(out) != "600 3" {
		t.Errorf("stat of written file: %q", out)
	}
	// CopyFile streams a host file, with its permissions.
	src := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(src, bytes.Repeat([]byte("0123456789abcdef"), 1<<16), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := v.CopyFile(ctx, src, "/tmp/y/blob"); err != nil {
		t.Fatal(err)
	}
	if out := run("sh", "-c", "stat -c '%a %s' /tmp/y/blob; md5sum </tmp/y/blob"); out != fmt.Sprintf("750 %d\n%x  -\n", 1<<20, md5.Sum(bytes.Repeat([]byte("0123456789abcdef"), 1<<16))) {
		t.Errorf("copied file: %q", out)
	}
	// Kill does not wait for a process that ignores SIGTERM.
	stubborn, err := v.Start(ctx, "sh", "-c", "trap '' TERM; echo READY; sleep 600")
	if err != nil {
		t.Fatal(err)
	}
	if err := stubborn.WaitFor(ctx, "READY"); err != nil {
		t.Fatal(err)
	}
	killStart := time.Now()
	if err := stubborn.Kill(); err != nil {
		t.Fatal(err)
	}
	if exited, code, err := stubborn.Exited(ctx); err != nil || !exited || code != -1 || time.Since(killStart) > 3*time.Second {
		t.Errorf("after Kill (%v): exited %v code %d err %v", time.Since(killStart), exited, code, err)
	}

	r, err := v.Exec(ctx, vm.Command{Argv: []string{"sh", "-c", "cat; echo oops >&2; exit 3"}, Stdin: []byte("in")})
	if err != nil || r.Stdout != "in" || r.Stderr != "oops\n" || r.ExitCode != 3 {
		t.Errorf("exec with stdin: %+v, %v", r, err)
	}
	r, err = v.Exec(ctx, vm.Command{Argv: []string{"sleep", "10"}, Timeout: 200 * time.Millisecond})
	if err != nil || !r.TimedOut || r.ExitCode != -1 {
		t.Errorf("exec with timeout: %+v, %v", r, err)
	}

	// nettest's tests, inside the guest.
	out, err := v.RunOK(ctx, "/usr/local/bin/nettest.test", "-test.v", "-test.count=1")
	t.Logf("nettest inside the VM:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "SKIP") || !strings.Contains(out, "PASS") {
		t.Errorf("nettest did not run inside the VM")
	}

	// The guest reaches the host's "apiserver", once per connection, and
	// nothing else: no default route, and slirp's host alias is closed.
	for i := 0; i < 2; i++ {
		if out := run("sh", "-c", "echo | nc 10.0.2.100 6443"); out != "hello from the host\n" {
			t.Errorf("guestfwd connection %d: %q", i, out)
		}
	}
	if r, err := v.Exec(ctx, vm.Command{Argv: []string{"nc", "-w", "2", "10.0.2.2", "22"}}); err != nil || r.ExitCode == 0 {
		t.Errorf("guest reached 10.0.2.2:22: %+v, %v", r, err)
	}
	if r, err := v.Exec(ctx, vm.Command{Argv: []string{"nc", "-w", "2", "192.0.2.1", "80"}}); err != nil || !strings.Contains(r.Stderr, "unreachable") {
		t.Errorf("guest reached an outside address: %+v, %v", r, err)
	}
	// A connection still open at Shutdown leaves a host-side nc that QEMU
	// does not take along; Shutdown must.
	if _, err := v.Start(ctx, "sh", "-c", "echo hold | nc 10.0.2.100 6443; sleep 600"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(v.ForwardPIDs()) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if len(v.ForwardPIDs()) == 0 {
		t.Error("no host-side nc for the open guest connection")
	}

	if err := v.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if pids := v.ForwardPIDs(); len(pids) > 0 {
		t.Errorf("guestfwd nc processes left after Shutdown: %v", pids)
	}
	if err := v.Shutdown(); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("qemu (pid %d) still there after Shutdown: kill 0 = %v", pid, err)
	}
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("qemu's process group %d still has members after Shutdown: kill 0 = %v", pid, err)
	}
	if !strings.Contains(v.ConsoleLog(), "vm-init: starting vmagent") {
		t.Errorf("console log lacks /init's output:\n%s", v.ConsoleLog())
	}
	t.Logf("whole test: %v", time.Since(start).Round(time.Millisecond))
}
