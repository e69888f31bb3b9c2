// Package bed assembles the whole test bed that e2e tests and the demo run
// on: a real control plane on the host, a QEMU VM with Debian's kernel that
// reaches it through a forward, ipvs-proxy running in the VM, a client
// network namespace, and backends ("pods") in namespaces of their own.
package bed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// Fixed names and addresses of the bed.
const (
	NodeName    = "node-1" // the node the agent runs as
	OtherNode   = "node-2" // a node with no agent, for "remote" endpoints
	Zone        = "zone-a"
	Interface   = "ipvs-proxy0"
	NodeAddr    = "10.0.2.15" // the VM's eth0
	ClientNetns = "cli"
	ClientAddr  = "10.250.0.2"
	ClientAddr6 = "fd00:250::2"
	// ClientGateway6 is the node's side of the client namespace's veth:
	// an IPv6 address of the node outside NodePortCIDR.
	ClientGateway6 = "fd00:250::1"
	BackendPort    = 8080
	GuestBinary    = "/usr/local/bin/ipvs-proxy"
	GuestKubecfg   = "/etc/ipvs-proxy/kubeconfig"
	// ClusterCIDR holds the backends' addresses (AddBackend); the client
	// namespace is outside it.
	ClusterCIDR = "10.100.0.0/14,fd00:100::/24"
	// NodePortCIDR is the node's eth0 subnet, for node ports.
	NodePortCIDR = "10.0.2.0/24"
)

// Options configure Start.
type Options struct {
	// Log receives progress (t.Logf, or a printer).
	Log func(format string, args ...any)
	// Packages are built into the guest: main packages as binaries, and
	// packages listed in TestPackages as test binaries, all into
	// /usr/local/bin (test binaries as <base>.test).
	Packages     []string
	TestPackages []string
	// AgentArgs are the arguments of `ipvs-proxy run` besides the
	// kubeconfig and the node name.
	AgentArgs []string
	// WithControllerManager also runs kube-controller-manager.
	WithControllerManager bool
	// MemoryMB of the VM (default: the vm package's).
	MemoryMB int
	// NoAgent leaves the agent stopped; start it with StartAgent.
	NoAgent bool
}

// Bed is a running test bed.
type Bed struct {
	CP     *controlplane.ControlPlane
	VM     *vm.VM
	Client kubernetes.Interface
	opts   Options
	tmp    string

	mu     sync.Mutex
	agent  *vm.Proc
	nextNs int
	// variants are the agent's test builds installed in the VM: guest
	// path -> the digest of the binary copied there.
	variants map[string]string
}

// Start builds the binaries, starts the control plane and the VM, creates
// the Nodes and the client namespace, and starts the agent.
func Start(ctx context.Context, assets *vm.Assets, opts Options) (_ *Bed, err error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	b := &Bed{opts: opts}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if b.tmp, err = os.MkdirTemp("", "ipvs-proxy-bed-"); err != nil {
		return nil, fmt.Errorf("bed: temp dir: %w", err)
	}
	files := map[string]string{}
	for _, pkg := range append([]string{"github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy"}, opts.Packages...) {
		out := filepath.Join(b.tmp, filepath.Base(pkg))
		if err := vm.BuildGoBinary(ctx, pkg, out); err != nil {
			return nil, err
		}
		files["/usr/local/bin/"+filepath.Base(out)] = out
	}
	for _, pkg := range opts.TestPackages {
		out := filepath.Join(b.tmp, filepath.Base(pkg)+".test")
		if err := vm.BuildTestBinary(ctx, pkg, out); err != nil {
			return nil, err
		}
		files["/usr/local/bin/"+filepath.Base(out)] = out
	}
	if b.CP, err = controlplane.Start(ctx, controlplane.Options{Log: opts.Log, WithControllerManager: opts.WithControllerManager}); err != nil {
		return nil, err
	}
	b.Client = b.CP.Client
	if b.VM, err = vm.Start(ctx, vm.Options{Assets: assets, Files: files, APIServerPort: b.CP.APIServerPort,
		MemoryMB: opts.MemoryMB, Log: opts.Log}); err != nil {
		return nil, err
	}
	opts.Log("VM ready after %v", b.VM.BootTime.Round(time.Millisecond))
	if err := b.VM.WriteFile(ctx, GuestKubecfg, b.CP.KubeconfigFor("https://"+vm.APIServerGuestAddr), 0o600); err != nil {
		return nil, err
	}
	if _, err := b.VM.RunOK(ctx, "vmagent", "netns", "add", ClientNetns, "--veth-host-addr", "10.250.0.1/24",
		"--addr", ClientAddr+"/24", "--veth-host-addr6", ClientGateway6+"/64", "--addr6", ClientAddr6+"/64"); err != nil {
		return nil, fmt.Errorf("bed: client namespace: %w", err)
	}
	for _, n := range []string{NodeName, OtherNode} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelTopologyZone: Zone}}}
		created, err := b.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("bed: create node %s: %w", n, err)
		}
		if n != NodeName {
			continue
		}
		// The address a kubelet would report (kube-proxy waits 30 s for
		// one at its start).
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeAddr}}
		if _, err := b.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("bed: set the address of node %s: %w", n, err)
		}
	}
	if !opts.NoAgent {
		if err := b.StartAgent(ctx); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// StartAgent starts `ipvs-proxy run` in the VM, with Options.AgentArgs and
// then extra, and waits for its first full sync.
func (b *Bed) StartAgent(ctx context.Context, extra ...string) error {
	return b.StartAgentBinary(ctx, GuestBinary, extra...)
}

// StartAgentBinary is StartAgent with another build of the agent, at a
// path in the guest (see InstallAgentVariant).
func (b *Bed) StartAgentBinary(ctx context.Context, binary string, extra ...string) error {
	p, err := b.startAgent(ctx, binary, extra)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := p.WaitFor(wctx, `"kind":"full"`); err != nil {
		out := p.Output()
		_ = p.Stop()
		return fmt.Errorf("bed: the agent did not complete a first sync: %w\n%s", err, out)
	}
	b.mu.Lock()
	b.agent = p
	b.mu.Unlock()
	return nil
}

func (b *Bed) startAgent(ctx context.Context, binary string, extra []string) (*vm.Proc, error) {
	argv := append([]string{binary, "run", "--kubeconfig", GuestKubecfg, "--hostname-override", NodeName}, b.opts.AgentArgs...)
	return b.VM.Start(ctx, append(argv, extra...)...)
}

// LaunchAgent starts the agent as StartAgent does but returns at once,
// before its first sync (to interrupt that sync); the agent counts as
// running from then on.
func (b *Bed) LaunchAgent(ctx context.Context, extra ...string) (*vm.Proc, error) {
	p, err := b.startAgent(ctx, GuestBinary, extra)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.agent = p
	b.mu.Unlock()
	return p, nil
}

// KillAgent ends the agent with SIGKILL, as a crash or the OOM killer
// would, if it runs.
func (b *Bed) KillAgent() error { return b.endAgent((*vm.Proc).Kill) }

// InstallAgentVariant builds the agent with build tags (a test build, e.g.
// "faultinject"), cached by its inputs (vm.BuildVariant), copies it into
// the running VM unless the same binary is there already, and returns its
// path in the guest, GuestBinary-<tags>.
func (b *Bed) InstallAgentVariant(ctx context.Context, tags ...string) (string, error) {
	bin, err := vm.BuildVariant(ctx, vm.CacheDir(), "github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy", tags, b.opts.Log)
	if err != nil {
		return "", err
	}
	f, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("bed: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("bed: read %s: %w", bin, err)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	guest := GuestBinary + "-" + strings.Join(tags, "-")
	b.mu.Lock()
	have := b.variants[guest] == digest
	b.mu.Unlock()
	if have {
		return guest, nil
	}
	if err := b.VM.CopyFile(ctx, bin, guest); err != nil {
		return "", err
	}
	b.mu.Lock()
	if b.variants == nil {
		b.variants = map[string]string{}
	}
	b.variants[guest] = digest
	b.mu.Unlock()
	return guest, nil
}

// StopAgent stops the agent (SIGTERM) if it runs.
func (b *Bed) StopAgent() error { return b.endAgent((*vm.Proc).Stop) }

// endAgent forgets the running agent, if any, and ends it with end.
func (b *Bed) endAgent(end func(*vm.Proc) error) error {
	b.mu.Lock()
	p := b.agent
	b.agent = nil
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	return end(p)
}

// AgentRunning reports whether the bed's agent runs (StartAgent, and no
// StopAgent since).
func (b *Bed) AgentRunning() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.agent != nil
}

// AgentOutput is the running agent's log so far.
func (b *Bed) AgentOutput() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.agent == nil {
		return ""
	}
	return b.agent.Output()
}

// Close stops everything; it is safe on a partly started bed.
func (b *Bed) Close() {
	if b.VM != nil {
		_ = b.StopAgent()
		if err := b.VM.Shutdown(); err != nil {
			b.opts.Log("bed: shut down the VM: %v", err)
		}
	}
	if b.CP != nil {
		b.CP.Stop()
	}
	if b.tmp != "" {
		_ = os.RemoveAll(b.tmp)
	}
}

// Backend is a test "pod": a network namespace serving TCP and UDP on
// BackendPort, answering with its name and the client address it saw.
type Backend struct {
	Name  string
	Addr  string
	Addr6 string
	Node  string
	stop  func() error
}

// Stop stops the backend and removes its namespace.
func (be Backend) Stop() error { return be.stop() }

// AddBackend starts a backend in a fresh namespace and subnet, as an
// endpoint of node.
func (b *Bed) AddBackend(ctx context.Context, node string) (Backend, error) {
	b.mu.Lock()
	b.nextNs++
	k := b.nextNs
	b.mu.Unlock()
	be := Backend{
		Name:  fmt.Sprintf("b%d", k),
		Addr:  fmt.Sprintf("10.%d.%d.2", 100+k/250, k%250),
		Addr6: fmt.Sprintf("fd00:%x::2", 0x100+k),
		Node:  node,
	}
	host := strings.TrimSuffix(be.Addr, "2") + "1"
	host6 := strings.TrimSuffix(be.Addr6, "2") + "1"
	if _, err := b.VM.RunOK(ctx, "vmagent", "netns", "add", be.Name, "--veth-host-addr", host+"/24", "--addr", be.Addr+"/24",
		"--veth-host-addr6", host6+"/64", "--addr6", be.Addr6+"/64"); err != nil {
		return be, fmt.Errorf("bed: backend %s: %w", be.Name, err)
	}
	p, err := b.VM.Start(ctx, "vmagent", "serve", "--netns", be.Name, "--name", be.Name, "--port", fmt.Sprint(BackendPort))
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err = p.WaitFor(wctx, "READY"); err != nil {
			err = fmt.Errorf("%w\n%s", err, p.Output())
		}
		cancel()
	}
	be.stop = func() error {
		var errs []error
		if p != nil {
			errs = append(errs, p.Stop())
		}
		_, e := b.VM.RunOK(context.Background(), "vmagent", "netns", "del", be.Name)
		return errors.Join(append(errs, e)...)
	}
	if err != nil {
		_ = be.stop()
		return be, fmt.Errorf("bed: serve %s: %w", be.Name, err)
	}
	return be, nil
}

// Hit connects n times from the client namespace to addr.
func (b *Bed) Hit(ctx context.Context, proto, addr string, n int) (nettest.HitResult, error) {
	return b.VM.Hit(ctx, nettest.HitConfig{Netns: ClientNetns, Proto: proto, Addr: addr, N: n, Timeout: 2 * time.Second})
}

// IPVSTable returns `ipvsadm -Ln ARGS...` of the VM.
func (b *Bed) IPVSTable(ctx context.Context, args ...string) (string, error) {
	return b.VM.RunOK(ctx, append([]string{"ipvsadm", "-Ln"}, args...)...)
}

// Metrics GETs a Prometheus text endpoint inside the VM (url as seen from
// the VM's root namespace) and returns its samples: the name with its
// labels as written -> value.
func (b *Bed) Metrics(ctx context.Context, url string) (map[string]float64, error) {
	return ScrapeMetrics(ctx, b.VM, url)
}

// ScrapeMetrics is Bed.Metrics for any VM: url's Prometheus text,
// fetched from inside v, as series name (with labels) to value.
func ScrapeMetrics(ctx context.Context, v *vm.VM, url string) (map[string]float64, error) {
	code, body, err := v.HTTPGet(ctx, url)
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("bed: GET %s: %d %s", url, code, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}
