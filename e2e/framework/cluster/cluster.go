// Package cluster runs a real one-node Kubernetes cluster in the test bed:
// the node is the bed's VM (Debian's kernel under QEMU) with kubelet
// v1.36.3, containerd and runc (Debian 12's) and the CNI bridge plugins;
// the control plane (etcd, kube-apiserver, kube-controller-manager with its
// default controllers, kube-scheduler) runs on the host on 127.0.0.1.
//
// Connectivity, every path a loopback forward of QEMU's user network
// (restrict=on):
//   - node and pods -> apiserver: the apiserver advertises 10.0.2.100 with
//     its own (random) port, and the VM forwards both 10.0.2.100:6443 and
//     10.0.2.100:<port> to it. The `kubernetes` Service's endpoint is thus
//     an address pods reach; the CNI bridge masquerades pods' traffic to it
//     (the forward answers the node's address only).
//   - apiserver -> kubelet, pods and services (exec, logs, port-forward,
//     the proxy subresources): the apiserver's "cluster" egress goes to an
//     HTTP CONNECT proxy on a unix socket of the fixture, which dials each
//     target from inside the VM through the guest agent (vm.VM.Dial), so
//     node and pod addresses stay the real ones.
//
// Images (no registry is reachable) are built here and imported into
// containerd under the names kubelet and the manifests use: the pause
// image (e2e/pause), a test server (the bed's agent), CoreDNS (e2e/coredns)
// and ipvs-proxy's.
//
// The cluster's DNS is CoreDNS behind the kube-dns Service at DNSServiceIP,
// kubelet's clusterDNS, answering cluster.local only (see dns.go); Start
// creates it. No kube-proxy runs: Services are ipvs-proxy's, deployed
// with the manifests of deploy/ (DeployIPVSProxy) by the caller, and DNS
// gets ready once they are (WaitDNS).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// Fixed names and addresses of the cluster.
const (
	NodeName     = "node-1"
	NodeIP       = "10.0.2.15"     // the VM's eth0
	PodCIDR      = "10.244.0.0/24" // the node's pods (node IPAM's first /24)
	ClusterCIDR  = "10.244.0.0/16" // every pod
	ServiceCIDR  = "10.96.0.0/16"  // IPv4 only: the node is IPv4 only
	KubernetesIP = "10.96.0.1"     // the `kubernetes` Service
)

// Options configure Start.
type Options struct {
	// Assets of the VM (vm.Require). Required.
	Assets *vm.Assets
	// Log receives progress messages.
	Log func(format string, args ...any)
	// MemoryMB and CPUs of the VM (default 3584 and 2).
	MemoryMB, CPUs int
	// ProxyImage is ipvs-proxy's image archive (make image); empty: built
	// as make image does. Imported as ProxyImage.
	ProxyImage string
	// Images are more image archives to import (a file name in the
	// guest, ending in .tar, to a host archive), e.g. the e2e suite's.
	Images map[string]string
}

// Cluster is a running one-node cluster.
type Cluster struct {
	CP     *controlplane.ControlPlane
	VM     *vm.VM
	Client kubernetes.Interface
	// Kubeconfig is a kubeconfig file for the host (admin).
	Kubeconfig string
	// NodeReady is how long Start took up to the Node's Ready condition.
	NodeReady time.Duration

	logf       func(string, ...any)
	tmp        string
	egress     *egressProxy
	containerd *vm.Proc
	kubelet    *vm.Proc
}

// Start builds what the node needs, starts the control plane and the VM,
// makes the VM a node and returns once the Node is Ready. ctx bounds the
// start-up; call Close, e.g. from t.Cleanup.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	began := time.Now()
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if opts.Assets == nil {
		return nil, errors.New("cluster: Options.Assets is nil")
	}
	if opts.MemoryMB <= 0 {
		opts.MemoryMB = 3584
	}
	c := &Cluster{logf: logf}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.tmp, err = os.MkdirTemp("", "ipvs-proxy-cluster-"); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	cache := controlplane.CacheDir()

	// The node's parts.
	t := time.Now()
	layer, err := vm.EnsureLayer(ctx, cache, runtimeLayer, logf)
	if err != nil {
		return nil, err
	}
	kubeletDir, err := controlplane.EnsureKubelet(ctx, cache)
	if err != nil {
		return nil, fmt.Errorf("cluster: kubelet: %w", err)
	}
	images := map[string]string{} // guest path -> host archive
	pause, err := staticImage(ctx, cache, c.tmp, "github.com/ipvs-proxy/ipvs-proxy/e2e/pause", "pause", PauseImage)
	if err != nil {
		return nil, err
	}
	server, err := staticImage(ctx, cache, c.tmp, vm.AgentPackage, "vmagent", ServerImage)
	if err != nil {
		return nil, err
	}
	dns, err := dnsImage(ctx, cache)
	if err != nil {
		return nil, err
	}
	proxy := opts.ProxyImage
	if proxy == "" {
		if proxy, err = proxyImage(ctx, cache, c.tmp, logf); err != nil {
			return nil, err
		}
	}
	for name, p := range map[string]string{"pause.tar": pause, "vmagent.tar": server, "ipvs-proxy.tar": proxy, "coredns.tar": dns} {
		images[guestImages+"/"+name] = p
	}
	for name, p := range opts.Images {
		images[guestImages+"/"+name] = p
	}
	logf("cluster: node's runtime, kubelet and images ready after %s", time.Since(t).Round(time.Millisecond))

	// The control plane, reaching the node through the egress proxy.
	socket := filepath.Join(c.tmp, "egress.sock")
	if c.egress, err = startEgressProxy(socket, logf); err != nil {
		return nil, err
	}
	c.CP, err = controlplane.Start(ctx, controlplane.Options{
		Log:         logf,
		ServiceCIDR: ServiceCIDR,
		Cluster: &controlplane.ClusterOptions{
			AdvertiseAddress: vm.APIServerGuestIP,
			EgressSocket:     socket,
			ClusterCIDR:      ClusterCIDR,
		},
	})
	if err != nil {
		return nil, err
	}
	c.Client, c.Kubeconfig = c.CP.Client, c.CP.Kubeconfig

	// The VM, made a node. A VM lost on the way (QEMU exited, its agent
	// stopped answering, its kernel reported a stalled CPU, or the Node
	// was not Ready in time: the bed's failure, before anything of the
	// cluster's runs on the node) is booted again, up to bootAttempts in
	// all, and said so.
	files := map[string]string{guestKubelet: filepath.Join(kubeletDir, controlplane.BinKubelet)}
	for g, h := range images {
		files[g] = h
	}
	vmOpts := vm.Options{
		Assets: opts.Assets, Files: files, Layers: []string{layer},
		MemoryMB: opts.MemoryMB, CPUs: opts.CPUs,
		APIServerPort: c.CP.APIServerPort, APIServerGuestPorts: []int{c.CP.APIServerPort},
		Log: logf,
	}
	for attempt := 1; ; attempt++ {
		err = c.bootNode(ctx, vmOpts)
		var lost *nodeLostError
		if err == nil || !errors.As(err, &lost) || attempt == bootAttempts {
			break
		}
		logf("cluster: the node's VM was lost while it came up (attempt %d of %d); booting it again: %v", attempt, bootAttempts, err)
		c.dropVM(ctx)
	}
	if err != nil {
		return nil, err
	}
	c.NodeReady = time.Since(began)
	logf("cluster: node %s Ready after %s", NodeName, c.NodeReady.Round(time.Millisecond))
	if err := deployDNS(ctx, c.Client); err != nil {
		return nil, err
	}
	return c, nil
}

// startNode prepares the VM, starts containerd, imports the images and
// starts the kubelet.
func (c *Cluster) startNode(ctx context.Context) error {
	v := c.VM
	for path, data := range map[string]string{
		guestSetup:          string(nodeSetup),
		guestContainerdConf: containerdConfig(PauseImage),
		guestCNIConf:        cniConfig(PodCIDR),
		guestKubeletConfig:  kubeletConfig(),
		guestKubeconfig:     string(c.CP.KubeconfigFor("https://" + vm.APIServerGuestAddr)),
	} {
		if err := v.WriteFile(ctx, path, []byte(data), 0o600); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	t := time.Now()
	if _, err := v.RunOK(ctx, "sh", guestSetup); err != nil {
		return fmt.Errorf("cluster: node setup: %w", err)
	}
	var err error
	if _, err := v.RunOK(ctx, "modprobe", "overlay"); err != nil {
		return fmt.Errorf("cluster: load overlay for containerd's snapshotter: %w", err)
	}
	if c.containerd, err = v.Start(ctx, "containerd", "--config", guestContainerdConf); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := c.waitContainerd(ctx); err != nil {
		return err
	}
	logf := c.logf
	logf("cluster: containerd up after %s", time.Since(t).Round(time.Millisecond))
	t = time.Now()
	// The overlayfs snapshotter (see containerdConfig).
	r, err := v.Exec(ctx, vm.Command{Argv: []string{"sh", "-c",
		"for f in " + guestImages + "/*.tar; do ctr -n k8s.io images import --no-unpack=false \"$f\" || exit 1; done; ctr -n k8s.io images ls -q"},
		Env: []string{"CONTAINERD_SNAPSHOTTER=overlayfs", "CONTAINERD_ADDRESS=" + containerdSock}})
	if err != nil {
		return fmt.Errorf("cluster: import images: %w", err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("cluster: import images: exit status %d: %s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	logf("cluster: images imported in %s: %s", time.Since(t).Round(time.Millisecond), strings.Join(strings.Fields(r.Stdout), " "))
	c.kubelet, err = v.Start(ctx, guestKubelet,
		"--config="+guestKubeletConfig,
		"--kubeconfig="+guestKubeconfig,
		"--hostname-override="+NodeName,
		"--node-ip="+NodeIP,
		"--root-dir=/var/lib/kubelet",
		"--cert-dir=/var/lib/kubelet/pki",
		"--v=1")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

func (c *Cluster) waitContainerd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		r, err := c.VM.Exec(ctx, vm.Command{Argv: []string{"ctr", "--address", containerdSock, "version"}})
		if err == nil && r.ExitCode == 0 {
			return nil
		}
		if exited, code, _ := c.containerd.Exited(ctx); exited {
			return fmt.Errorf("cluster: containerd exited with status %d:\n%s", code, tailString(c.containerd.Output(), 3000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: containerd not up: %w\n%s", ctx.Err(), tailString(c.containerd.Output(), 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// bootNode starts the VM and makes it a node (containerd, images,
// kubelet), returning once the Node is Ready.
func (c *Cluster) bootNode(ctx context.Context, opts vm.Options) error {
	var err error
	if c.VM, err = vm.Start(ctx, opts); err != nil {
		return err
	}
	c.egress.setDialer(c.VM.Dial)
	c.logf("cluster: VM ready after %v", c.VM.BootTime.Round(time.Millisecond))
	// A guest whose kernel reports a stalled CPU ends the bring-up at
	// once: such a guest has not been seen to recover.
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := c.watchKernelStall(bctx, cancel)
	err = c.startNode(bctx)
	if err == nil {
		err = c.waitNodeReady(bctx)
	}
	stopWatch()
	var lost *nodeLostError
	if cause := context.Cause(bctx); err != nil && errors.As(cause, &lost) {
		err = &nodeLostError{fmt.Errorf("%w (bring-up stopped at: %v)", cause, err)}
	}
	if dead, qerr := c.VM.Exited(); err != nil && dead {
		if !errors.As(err, &lost) {
			err = &nodeLostError{fmt.Errorf("%w (the VM's QEMU had exited: %v; console:\n%s)", err, qerr, tailString(c.VM.ConsoleLog(), 4000))}
		}
	}
	return err
}

// dropVM shuts a lost VM down (its console is in the error already) and
// deletes the Node its kubelet may have registered, so that the next
// boot's wait sees the new kubelet's Ready condition, not a stale one.
func (c *Cluster) dropVM(ctx context.Context) {
	if c.VM != nil {
		_ = c.VM.Shutdown()
	}
	c.VM, c.containerd, c.kubelet = nil, nil, nil
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Client.CoreV1().Nodes().Delete(ctx, NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		c.logf("cluster: delete the lost node's Node %s: %v", NodeName, err)
	}
}

// watchKernelStall reads the guest's console every two seconds and
// cancels ctx with a nodeLostError when the kernel reports a stalled CPU.
// The returned function stops the watch and waits for it.
func (c *Cluster) watchKernelStall(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	v := c.VM
	go func() {
		defer close(done)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			console := v.ConsoleLog()
			if line := vm.KernelStall(console); line != "" {
				cancel(&nodeLostError{fmt.Errorf("cluster: the VM's kernel reports a stalled CPU before node %s was Ready: %q\nconsole:\n%s",
					NodeName, line, tailString(console, 4000))})
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// bootAttempts is how many times the node's VM is booted before the
// cluster gives up on it.
const bootAttempts = 3

// nodeLostError is a node whose VM died, whose agent stopped answering or
// whose kernel stalled, or that was not Ready in time, while it came up.
type nodeLostError struct{ err error }

func (e *nodeLostError) Error() string { return e.err.Error() }
func (e *nodeLostError) Unwrap() error { return e.err }

// agentLostAfter is how long the guest agent may go unanswered while the
// node comes up before the VM counts as lost.
const agentLostAfter = time.Minute

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	last := "not registered"
	var unanswered time.Time // since when the agent has not answered
	for {
		if dead, qerr := c.VM.Exited(); dead {
			return &nodeLostError{fmt.Errorf("cluster: the VM's QEMU exited (%v) before node %s was Ready (%s)\nkubelet:\n%s\nconsole:\n%s",
				qerr, NodeName, last, tailString(c.kubelet.Output(), 3000), tailString(c.VM.ConsoleLog(), 4000))}
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		}
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		exited, code, aerr := c.kubelet.Exited(actx)
		acancel()
		if exited {
			return fmt.Errorf("cluster: kubelet exited with status %d:\n%s", code, tailString(c.kubelet.Output(), 5000))
		}
		switch {
		case aerr == nil:
			unanswered = time.Time{}
		case ctx.Err() != nil:
		case unanswered.IsZero():
			unanswered = time.Now()
		case time.Since(unanswered) > agentLostAfter:
			return &nodeLostError{fmt.Errorf("cluster: the VM's agent has not answered for %s before node %s was Ready (%s): %w\nkubelet (last seen):\n%s\nconsole:\n%s",
				agentLostAfter, NodeName, last, aerr, tailString(c.kubelet.Output(), 3000), tailString(c.VM.ConsoleLog(), 4000))}
		}
		select {
		case <-ctx.Done():
			// Counted as the VM's loss: nothing of the cluster runs on the
			// node yet, so a fresh boot loses nothing.
			return &nodeLostError{fmt.Errorf("cluster: node %s not Ready (%s): %w\nkubelet:\n%s\ncontainerd:\n%s\nconsole:\n%s", NodeName, last, ctx.Err(),
				tailString(c.kubelet.Output(), 5000), tailString(c.containerd.Output(), 3000), tailString(c.VM.ConsoleLog(), 3000))}
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// ExecCtr runs argv in a container with containerd's own client in the
// VM (no CRI, no kubelet, no apiserver): containerID is the pod status's
// ID without its "containerd://", execID any name unique among the
// container's execs. It returns stdout and stderr together, and an error
// for an exit status other than 0.
func (c *Cluster) ExecCtr(ctx context.Context, containerID, execID string, argv ...string) (string, error) {
	r, err := c.VM.Exec(ctx, vm.Command{Argv: append([]string{"ctr", "--address", containerdSock, "-n", "k8s.io",
		"task", "exec", "--exec-id", execID, containerID}, argv...)})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("ctr: command terminated with exit code %d", r.ExitCode)
	}
	return r.Stdout + r.Stderr, err
}

// KubeletLog and ContainerdLog are the output of the node's daemons so
// far (for failure messages).
func (c *Cluster) KubeletLog() string    { return procOutput(c.kubelet) }
func (c *Cluster) ContainerdLog() string { return procOutput(c.containerd) }

func procOutput(p *vm.Proc) string {
	if p == nil {
		return ""
	}
	return p.Output()
}

// Close stops the kubelet and containerd, the VM, the control plane and
// the egress proxy, and removes the temporary files. It may be called more
// than once.
func (c *Cluster) Close() {
	if c.kubelet != nil {
		_ = c.kubelet.Stop()
	}
	if c.VM != nil {
		if err := c.VM.Shutdown(); err != nil {
			c.logf("cluster: %v", err)
		}
	}
	if c.CP != nil {
		c.CP.Stop()
	}
	if c.egress != nil {
		c.egress.close()
		c.egress = nil
	}
	if c.tmp != "" {
		os.RemoveAll(c.tmp)
	}
}

// APIServerAddr is the apiserver's address as the node and pods reach it
// (the `kubernetes` Service's endpoint).
func (c *Cluster) APIServerAddr() string {
	return vm.APIServerGuestIP + ":" + strconv.Itoa(c.CP.APIServerPort)
}

func tailString(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
