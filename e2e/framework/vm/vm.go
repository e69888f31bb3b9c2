// Package vm boots throwaway QEMU VMs with a Debian kernel for tests that
// need a kernel with IPVS (this project's machines run one without it), and
// drives them through a small agent inside the guest.
//
// EnsureAssets fetches and caches what a VM boots from; Start boots one
// with the project's binaries packed into its initramfs; the VM's methods
// run commands in it. Tests usually call Boot, which does all three and
// skips when the test bed cannot be had (see Require).
//
// Networking never leaves the machine: the guest has one NIC on QEMU's
// user network with restrict=on, no default route, and only two forwards:
// a host port on 127.0.0.1 to the agent, and (Options.APIServerPort)
// guest 10.0.2.100:6443 to a host port on 127.0.0.1. The guest is
// 10.0.2.15/24 on eth0; tests must not use 10.0.2.0/24 for their own
// addresses.
//
// Emulation (TCG) is slow: about 5 s from Start to a ready agent, and
// kernel-side work runs several times slower than natively. Compare only
// timings measured in the same VM.
package vm

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
)

//go:embed init.sh
var initScript []byte

// APIServerGuestAddr is where the guest reaches the host's apiserver when
// Options.APIServerPort is set.
const APIServerGuestAddr = APIServerGuestIP + ":6443"

// APIServerGuestIP is the address of APIServerGuestAddr.
const APIServerGuestIP = "10.0.2.100"

// Options configure a VM.
type Options struct {
	// Assets to boot from (EnsureAssets). Required.
	Assets *Assets
	// Files maps guest paths to host files to put into the guest (their
	// modes are kept), e.g. {"/usr/local/bin/ipvs-proxy": "/tmp/x/ipvs-proxy"}.
	Files map[string]string
	// MemoryMB is the guest's memory (default 1024); CPUs its vCPUs
	// (default 2).
	MemoryMB int
	CPUs     int
	// APIServerPort, if > 0, forwards the guest's connections to
	// APIServerGuestAddr to 127.0.0.1:APIServerPort on the host.
	APIServerPort int
	// APIServerGuestPorts are more ports of APIServerGuestIP forwarded to
	// APIServerPort like 6443 (needs APIServerPort): the one-node cluster
	// forwards the apiserver's own port too, since that is the port of
	// the `kubernetes` Service's endpoint.
	APIServerGuestPorts []int
	// Layers are extra initramfs archives (EnsureLayer) unpacked after
	// the base one, before Files.
	Layers []string
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// Segment, if set, is a Hub's address: the guest gets a second NIC
	// (eth1, down and without an address until the test configures it)
	// on that private segment, with the MAC SegmentMAC (default: one
	// QEMU picks).
	Segment    string
	SegmentMAC string
	// BootTimeout bounds the boot up to the agent's first answer (default
	// 3 minutes; a boot takes seconds).
	BootTimeout time.Duration
	// Log receives progress messages (nil: none).
	Log func(format string, args ...any)
}

// VM is a running QEMU guest.
type VM struct {
	opts Options
	logf func(string, ...any)
	tmp  string // per-VM scratch directory, removed by Shutdown

	cmd     *exec.Cmd
	exited  chan struct{} // closed when QEMU has exited
	waitErr error         // QEMU's exit status, valid after exited

	hostPort int // 127.0.0.1 port forwarded to the agent
	token    string
	client   *http.Client
	ncPath   string // argv[0] of the host-side nc processes of guestfwd

	// BootTime is how long the boot took, from starting QEMU to the
	// agent's first answer.
	BootTime time.Duration

	shutdownOnce sync.Once
	shutdownErr  error
	mu           sync.Mutex
	console      string // the console log, kept by Shutdown
	down         bool
}

// Start boots a VM and returns once its agent answers.
func Start(ctx context.Context, o Options) (*VM, error) {
	if o.Assets == nil {
		return nil, errors.New("vm: Options.Assets is nil (use EnsureAssets)")
	}
	if o.MemoryMB <= 0 {
		o.MemoryMB = 1024
	}
	if o.CPUs <= 0 {
		o.CPUs = 2
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = 3 * time.Minute
	}
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	removeStaleTempDirs()
	tmp, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("vm: %w", err)
	}
	v := &VM{opts: o, logf: logf, tmp: tmp}
	ok := false
	defer func() {
		if !ok {
			v.stop()
			os.RemoveAll(tmp)
		}
	}()

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("vm: token: %w", err)
	}
	v.token = hex.EncodeToString(tok)
	initrd, err := v.makeInitrd(ctx)
	if err != nil {
		return nil, fmt.Errorf("vm: initramfs: %w", err)
	}
	if o.APIServerPort > 0 {
		// QEMU runs one nc per guest connection. Busybox knows the applet
		// by the name "nc"; the directory makes its argv[0] unique, so that
		// Shutdown can find the ones that outlive QEMU.
		v.ncPath = filepath.Join(tmp, "bin", "nc")
		if err := os.Mkdir(filepath.Dir(v.ncPath), 0o755); err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
		if err := os.Symlink(o.Assets.Busybox, v.ncPath); err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
	}
	accel := accelArgs(ctx, o.Assets, logf)

	for attempt := 1; ; attempt++ {
		err = v.boot(ctx, accel, initrd)
		if err == nil || attempt == 3 || ctx.Err() != nil {
			break
		}
		if errors.Is(err, errPortTaken) {
			logf("vm: %v; trying another port", err)
			continue
		}
		if !errors.Is(err, errBootHung) {
			break
		}
		// A guest that neither answers nor exits within the boot timeout
		// (a boot takes seconds) hung under emulation: one CI run's VM
		// wrote nothing to its console in 3 minutes. A new QEMU boots.
		logf("vm: WARNING: boot attempt %d hung; booting again: %v", attempt, err)
	}
	if err != nil {
		return nil, err
	}
	// QEMU has loaded the initramfs into guest memory: free the disk.
	os.Remove(initrd)
	os.Remove(filepath.Join(tmp, "vmagent"))
	ok = true
	return v, nil
}

// makeInitrd writes the boot's initramfs: the cached base archive followed
// by a small one with /init, the agent, its token and Options.Files (Linux
// unpacks concatenated archives in order, later entries replacing earlier
// ones).
func (v *VM) makeInitrd(ctx context.Context) (string, error) {
	agent := filepath.Join(v.tmp, "vmagent")
	if err := buildAgent(ctx, filepath.Dir(v.opts.Assets.Dir), agent, v.logf); err != nil {
		return "", err
	}
	ar := newArchive()
	ar.bytes("init", initScript, 0o755)
	ar.file(agentapi.AgentPath, agent, 0o755)
	ar.bytes(agentapi.TokenPath, []byte(v.token+"\n"), 0o600)
	for guest, host := range v.opts.Files {
		if !filepath.IsAbs(guest) {
			return "", fmt.Errorf("guest path %q is not absolute", guest)
		}
		st, err := os.Stat(host)
		if err != nil {
			return "", err
		}
		ar.file(guest, host, st.Mode().Perm())
	}
	extra := filepath.Join(v.tmp, "boot.cpio")
	if err := ar.writeFile(extra); err != nil {
		return "", err
	}
	initrd := filepath.Join(v.tmp, "initrd.cpio")
	out, err := os.Create(initrd)
	if err != nil {
		return "", err
	}
	defer out.Close()
	for _, p := range append(append([]string{v.opts.Assets.Initramfs}, v.opts.Layers...), extra) {
		in, err := os.Open(p)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(out, in)
		in.Close()
		if err != nil {
			return "", err
		}
	}
	os.Remove(extra)
	return initrd, out.Close()
}

// tempPrefix starts the names of VMs' scratch directories in os.TempDir().
const tempPrefix = "ipvs-proxy-vm-"

// removeStaleTempDirs removes the scratch directories of VMs whose owning
// process is gone (killed before it could call Shutdown); each holds a
// copy of the initramfs.
func removeStaleTempDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner"))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// errPortTaken: QEMU could not bind the agent's host port (another process
// took it after freePort picked it).
var errPortTaken = errors.New("host port for the agent was taken")

// errBootHung: QEMU ran for the whole boot timeout and the guest's agent
// never answered.
var errBootHung = errors.New("the guest hung while booting")

// errCleanExit stands for QEMU's nil exit error (status 0) in an error
// that wraps its exit status.
var errCleanExit = errors.New("exit status 0")

// ExitStatus is a process's exit status (QEMU's Wait error) as an error to wrap: err
// itself, or errCleanExit for a clean exit.
func ExitStatus(err error) error {
	if err == nil {
		return errCleanExit
	}
	return err
}

func (v *VM) boot(ctx context.Context, accel []string, initrd string) error {
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	v.hostPort = port
	a := v.opts.Assets
	netdev := fmt.Sprintf("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:%d-%s:%d", port, agentapi.GuestAddr, agentapi.Port)
	if v.opts.APIServerPort > 0 {
		netdev += fmt.Sprintf(",guestfwd=tcp:%s-cmd:%s 127.0.0.1 %d", APIServerGuestAddr, v.ncPath, v.opts.APIServerPort)
		for _, p := range v.opts.APIServerGuestPorts {
			netdev += fmt.Sprintf(",guestfwd=tcp:%s:%d-cmd:%s 127.0.0.1 %d", APIServerGuestIP, p, v.ncPath, v.opts.APIServerPort)
		}
	}
	console := filepath.Join(v.tmp, "console.log")
	args := append([]string{}, accel...)
	for _, d := range a.FirmwareDirs {
		args = append(args, "-L", d)
	}
	args = append(args,
		"-M", "q35", "-m", strconv.Itoa(v.opts.MemoryMB), "-smp", strconv.Itoa(v.opts.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "file:"+console,
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile=",
	)
	if v.opts.Segment != "" {
		// On a later PCI slot than eth0's NIC, so that the guest names
		// it eth1.
		dev := "virtio-net-pci,netdev=s0,romfile=,addr=0x10"
		if v.opts.SegmentMAC != "" {
			dev += ",mac=" + v.opts.SegmentMAC
		}
		args = append(args, "-netdev", "socket,id=s0,connect="+v.opts.Segment, "-device", dev)
	}
	args = append(args,
		"-kernel", a.Kernel, "-initrd", initrd,
		"-append", strings.Join(append([]string{"console=ttyS0", "quiet", "panic=-1"}, v.opts.KernelArgs...), " "),
	)
	qemuLog, err := os.Create(filepath.Join(v.tmp, "qemu.log"))
	if err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	defer qemuLog.Close()
	cmd := exec.Command(a.QEMU, args...)
	cmd.Env = a.qemuEnv()
	cmd.Stdout, cmd.Stderr = qemuLog, qemuLog
	// Own process group (Shutdown kills it whole); killed when this process
	// dies, pass or fail.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	// Pdeathsig fires when the THREAD that started QEMU ends, and Go ends
	// a thread when a goroutine exits while locked to it. So QEMU is
	// started from a goroutine that keeps its thread locked for as long as
	// QEMU lives: no other goroutine can end that thread meanwhile.
	started := make(chan error)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		v.waitErr = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("vm: start qemu: %w", err)
	}
	v.cmd, v.exited = cmd, exited
	v.client = &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}}
	v.logf("vm: qemu pid %d: %s %s", cmd.Process.Pid, a.QEMU, strings.Join(args, " "))

	if err := v.waitReady(ctx, start); err != nil {
		v.stop()
		qlog, _ := os.ReadFile(qemuLog.Name())
		if strings.Contains(string(qlog), "host forwarding rule") {
			return fmt.Errorf("%w: port %d: %s", errPortTaken, port, tail(string(qlog), 500))
		}
		return fmt.Errorf("vm: boot: %w\nqemu: %s\nconsole:\n%s", err, tail(string(qlog), 2000), tail(v.ConsoleLog(), 4000))
	}
	return nil
}

func (v *VM) waitReady(parent context.Context, start time.Time) error {
	ctx, cancel := context.WithTimeout(parent, v.opts.BootTimeout)
	defer cancel()
	for {
		// Short attempts: a connection made before the guest listens can
		// hang in slirp's SYN retransmission for seconds.
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		var ping agentapi.PingResponse
		err := v.call(pctx, "GET", agentapi.PathPing, nil, &ping)
		pcancel()
		if err == nil {
			v.BootTime = time.Since(start)
			v.logf("vm: ready in %v (guest uptime %.2fs, kernel %s)", v.BootTime.Round(10*time.Millisecond), ping.Uptime, ping.Kernel)
			if ping.InitErrors != "" {
				v.logf("vm: WARNING: /init reported:\n%s", ping.InitErrors)
			}
			return nil
		}
		select {
		case <-v.exited:
			return fmt.Errorf("qemu exited before the agent answered: %w", ExitStatus(v.waitErr))
		case <-ctx.Done():
			if parent.Err() == nil {
				return fmt.Errorf("%w: agent did not answer within %v (last error: %w)", errBootHung, v.opts.BootTimeout, err)
			}
			return fmt.Errorf("agent did not answer within %v: %w (last error: %w)", v.opts.BootTimeout, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PID is QEMU's process id (also its process group id).
func (v *VM) PID() int { return v.cmd.Process.Pid }

// Exited reports whether QEMU has exited (the guest crashed, powered off
// or was killed), and QEMU's exit status then.
func (v *VM) Exited() (bool, error) {
	select {
	case <-v.exited:
		return true, v.waitErr
	default:
		return false, nil
	}
}

// ConsoleLog is the guest's serial console so far (kernel messages, /init,
// the agent's log), also after Shutdown.
func (v *VM) ConsoleLog() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.down {
		return v.console
	}
	b, _ := os.ReadFile(filepath.Join(v.tmp, "console.log"))
	return string(b)
}

// Shutdown powers the guest off through the agent, waits for QEMU to exit
// (killing it after a timeout), kills what is left of its process group
// and its guestfwd nc processes, and removes the VM's temporary files. It
// returns an error if QEMU had already stopped by itself (a guest crash or
// the agent dying). It is safe to call more than once.
func (v *VM) Shutdown() error {
	v.shutdownOnce.Do(func() { v.shutdownErr = v.shutdown() })
	return v.shutdownErr
}

func (v *VM) shutdown() error {
	var err error
	select {
	case <-v.exited:
		err = fmt.Errorf("vm: %w: %w; console:\n%s", errExitedBeforeShutdown, ExitStatus(v.waitErr), tail(v.ConsoleLog(), 3000))
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if perr := v.call(ctx, "POST", agentapi.PathPoweroff, struct{}{}, nil); perr != nil {
			v.logf("vm: poweroff through the agent: %v", perr)
		}
		cancel()
		select {
		case <-v.exited:
		case <-time.After(30 * time.Second):
			v.logf("vm: guest did not power off in 30s; killing qemu")
		}
	}
	v.stop()
	v.client.CloseIdleConnections()
	v.mu.Lock()
	b, _ := os.ReadFile(filepath.Join(v.tmp, "console.log"))
	v.console, v.down = string(b), true
	v.mu.Unlock()
	if rerr := os.RemoveAll(v.tmp); rerr != nil && err == nil {
		err = fmt.Errorf("vm: %w", rerr)
	}
	return err
}

// errExitedBeforeShutdown: QEMU had stopped by itself when Shutdown came.
var errExitedBeforeShutdown = errors.New("qemu had exited before Shutdown")

// PowerLoss ends the guest at once, as a power cut does: QEMU's process
// group gets SIGKILL, so the guest runs, flushes and sends nothing more
// (its NICs fall silent mid-frame). Then what Shutdown releases is
// released (the guestfwd nc processes, the scratch directory); the
// console log stays readable, and a later Shutdown does nothing.
func (v *VM) PowerLoss() error {
	if err := syscall.Kill(-v.PID(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("vm: power loss: kill qemu (pid %d): %w", v.PID(), err)
	}
	select {
	case <-v.exited:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("vm: power loss: qemu (pid %d) still runs 30s after SIGKILL", v.PID())
	}
	if err := v.Shutdown(); err != nil && !errors.Is(err, errExitedBeforeShutdown) {
		return fmt.Errorf("vm: power loss: %w", err)
	}
	return nil
}

// stop makes sure QEMU and everything it started are gone.
func (v *VM) stop() {
	if v.cmd != nil && v.cmd.Process != nil {
		pgid := v.cmd.Process.Pid
		select {
		case <-v.exited:
		default:
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-v.exited:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-v.exited
			}
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // stragglers of the group
	}
	if v.ncPath != "" {
		killByArgv0(v.ncPath)
	}
}

// killByArgv0 kills the processes whose argv[0] is argv0 and waits (up to
// 5 s) until they are gone. The guestfwd nc processes need it: QEMU starts
// them in sessions of their own, so they are not in its process group.
func killByArgv0(argv0 string) {
	pids := pidsByArgv0(argv0)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(5 * time.Second); len(pids) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		pids = pidsByArgv0(argv0)
	}
}

// pidsByArgv0 lists the live processes whose argv[0] is argv0 (a zombie has
// no command line, so it is not listed).
func pidsByArgv0(argv0 string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if first, _, _ := strings.Cut(string(b), "\x00"); first == argv0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ForwardPIDs lists the host-side processes that serve this VM's guest
// forward to the apiserver (one per open guest connection).
func (v *VM) ForwardPIDs() []int {
	if v.ncPath == "" {
		return nil
	}
	return pidsByArgv0(v.ncPath)
}

// accelArgs picks the accelerator: KVM when it works here, else TCG (the
// only one that works on this project's machines, whose /dev/kvm is a
// nested kvm-pvm that aborts QEMU). IPVS_PROXY_VM_ACCEL=tcg|kvm overrides.
func accelArgs(ctx context.Context, a *Assets, logf func(string, ...any)) []string {
	tcg := []string{"-accel", "tcg", "-cpu", "max"}
	kvm := []string{"-accel", "kvm", "-cpu", "host"}
	switch os.Getenv("IPVS_PROXY_VM_ACCEL") {
	case "tcg":
		return tcg
	case "kvm":
		return kvm
	}
	accelProbe.once.Do(func() { accelProbe.kvm = probeKVM(ctx, a, logf) })
	if accelProbe.kvm {
		return kvm
	}
	return tcg
}

var accelProbe struct {
	once sync.Once
	kvm  bool
}

// probeKVM tells whether KVM works here. It needs a readable /dev/kvm, a
// CPU with VMX or SVM, and no kvm_pvm (the paravirtual nested KVM of this
// project's machines, under which QEMU hangs or aborts). Then it boots the
// kernel without an initramfs: it panics at once for want of a root file
// system and, with panic=-1 and -no-reboot, QEMU exits 0 within a second
// or two where KVM works. The answer is cached next to the assets, per host
// kernel.
func probeKVM(ctx context.Context, a *Assets, logf func(string, ...any)) bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		logf("vm: no usable /dev/kvm (%v): using TCG", err)
		return false
	}
	f.Close()
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		logf("vm: /dev/kvm is kvm_pvm (nested, QEMU hangs on it): using TCG")
		return false
	}
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	if !regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`).Match(cpuinfo) {
		logf("vm: the CPU has no VMX/SVM: using TCG")
		return false
	}
	var uts syscall.Utsname
	_ = syscall.Uname(&uts)
	release := make([]byte, 0, len(uts.Release))
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		release = append(release, byte(c))
	}
	cache := filepath.Join(a.Dir, "accel-"+shortHash(string(release)))
	if b, err := os.ReadFile(cache); err == nil {
		return strings.TrimSpace(string(b)) == "kvm"
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	args := []string{"-accel", "kvm", "-cpu", "host", "-M", "q35", "-m", "256"}
	for _, d := range a.FirmwareDirs {
		args = append(args, "-L", d)
	}
	args = append(args, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "none",
		"-kernel", a.Kernel, "-append", "panic=-1 quiet")
	cmd := exec.CommandContext(ctx, a.QEMU, args...)
	cmd.Env = a.qemuEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	verdict := "tcg"
	if err == nil {
		verdict = "kvm"
	}
	logf("vm: KVM probe took %v: %s (%v %s)", time.Since(start).Round(10*time.Millisecond), verdict, err, tail(string(out), 300))
	_ = os.WriteFile(cache, []byte(verdict+"\n"), 0o644)
	return err == nil
}

// kernelStallMarks are what the guest kernel prints when a CPU has made
// no progress for tens of seconds: the soft-lockup watchdog and RCU's
// stall detector. Under software emulation on a busy 2-core host a guest
// has been seen to stop in this state for good (both vCPUs stuck in the
// kernel right after the kubelet's first iptables calls), never to answer
// again; see KernelStall.
var kernelStallMarks = []string{"BUG: soft lockup", "self-detected stall on CPU", "detected stalls on CPUs/tasks"}

// KernelStall returns the first console line that reports a stalled
// CPU, or "" when there is none.
func KernelStall(console string) string {
	for _, line := range strings.Split(console, "\n") {
		for _, m := range kernelStallMarks {
			if strings.Contains(line, m) {
				return strings.TrimSpace(line)
			}
		}
	}
	return ""
}
