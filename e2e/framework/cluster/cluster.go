// Package cluster runs a real one-node Kubernetes cluster in the test bed:
// the node is the bed's VM (Debian's kernel under QEMU) with kubelet
// v1.36.3, containerd and crun (Debian 12's) and the CNI bridge plugins;
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
// image (e2e/guest/pause), a test server (the bed's agent), CoreDNS (e2e/tools/coredns)
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
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// Fixed names and addresses of the cluster.
const (
	NodeName     = "node-1"        // the first node's name; node k is "node-k"
	NodeIP       = "10.0.2.15"     // the node's address on a one-node cluster: the VM's eth0
	ClusterCIDR  = "10.244.0.0/16" // every pod (node IPAM gives each node a /24 of it)
	ServiceCIDR  = "10.96.0.0/16"  // the Service range (IPv4; and ServiceCIDR6 on a dual-stack cluster)
	KubernetesIP = "10.96.0.1"     // the `kubernetes` Service

	// A dual-stack cluster (Options.DualStack) also has these IPv6
	// ranges (node IPAM gives each node a /64 of ClusterCIDR6).
	ClusterCIDR6 = "fd00:10:244::/56"
	ServiceCIDR6 = "fd00:10:96::/112"

	// On several nodes, the nodes share a private segment (a vm.Hub)
	// on their eth1: node k is SegmentAddr(10+k), the outside host
	// OutsideIP. Tests take their LoadBalancer and external addresses
	// on the segment from SegmentAddr(200) to SegmentAddr(254).
	SegmentCIDR = segmentPrefix + "0/24"
	OutsideIP   = segmentPrefix + "100"
	// On a dual-stack cluster every host on the segment also has
	// SegmentAddr6 of the same number: node k SegmentAddr6(10+k), the
	// outside host OutsideIP6.
	SegmentCIDR6 = segmentPrefix6 + "/64"
	OutsideIP6   = segmentPrefix6 + "100"
	// SegmentIface is the segment's interface in every VM on it.
	SegmentIface = "eth1"

	segmentPrefix  = "192.168.56."
	segmentPrefix6 = "fd00:192:168:56::"
)

// SegmentAddr is host number i of SegmentCIDR.
func SegmentAddr(i int) string { return segmentPrefix + strconv.Itoa(i) }

// SegmentAddr6 is host number i of SegmentCIDR6 (written in decimal
// digits, as SegmentAddr's: host 11 is ...::11).
func SegmentAddr6(i int) string { return segmentPrefix6 + strconv.Itoa(i) }

// segmentMAC is the MAC of the segment NIC of the VM at SegmentAddr(i).
func segmentMAC(i int) string { return fmt.Sprintf("52:54:00:38:00:%02x", i) }

// Options configure Start.
type Options struct {
	// Assets of the VM (vm.Require). Required.
	Assets *vm.Assets
	// Log receives progress messages.
	Log func(format string, args ...any)
	// Nodes is how many nodes (VMs) the cluster has (default 1). With
	// more than one, the nodes share a private segment (see SegmentCIDR)
	// and route each other's pod CIDRs over it.
	Nodes int
	// Outside boots one more VM on the segment (needs Nodes > 1): a host
	// that is not a node, at OutsideIP, for clients from outside the
	// cluster (Cluster.Outside).
	Outside bool
	// MemoryMB and CPUs of each node's VM (default 3584 and 2).
	MemoryMB, CPUs int
	// ProxyImage is ipvs-proxy's image archive (make image); empty: built
	// as make image does. Its image is named ProxyImage (make image names
	// it so).
	ProxyImage string
	// Images are more image archives to import (a file name in the
	// guest, ending in .tar, to a host archive), e.g. the e2e suite's.
	Images map[string]string
	// DualStack gives the cluster IPv6 too (several nodes only): Service
	// and pod ranges of both families (IPv4 first, the primary), nodes
	// and the outside host with an IPv6 address on the segment
	// (SegmentAddr6), each node's IPv6 pod range routed to it.
	DualStack bool
}

// Cluster is a running cluster.
type Cluster struct {
	CP *controlplane.ControlPlane
	// VM is the first node's VM (Nodes[0].VM).
	VM     *vm.VM
	Client kubernetes.Interface
	// Kubeconfig is a kubeconfig file for the host (admin).
	Kubeconfig string
	// NodeReady is how long Start took up to every Node's Ready condition.
	NodeReady time.Duration
	// Nodes are the cluster's nodes, node-1 first.
	Nodes []*Node
	// Hub is the nodes' segment (nil on one node); Outside the host on it
	// that is not a node (nil unless Options.Outside).
	Hub     *vm.Hub
	Outside *vm.VM
	// ChartMonitoring are the Prometheus Operator's objects (a
	// ServiceMonitor, PodMonitor, PrometheusRule) of the last
	// DeployIPVSProxyChart's rendering: not applied, the bed has no
	// Operator; a test gives them to its own Prometheus.
	ChartMonitoring []*unstructured.Unstructured

	logf      func(string, ...any)
	tmp       string
	dualStack bool
	vmOpts    vm.Options // every node's VM's, for RebootNode
	egress    *egressProxy
	mu        sync.Mutex // guards the Nodes' VM and PodCIDR while they boot
}

// Node is one node of the cluster: a VM with containerd and the kubelet.
type Node struct {
	Name string
	// IP is the kubelet's --node-ip: NodeIP on one node, the node's
	// address on the segment on several.
	IP string
	// IP6 is the node's IPv6 address on the segment (dual-stack only).
	IP6 string
	// PodCIDR is the Node's spec.podCIDR (node IPAM's), known once the
	// kubelet has registered it; its pods' CNI range. PodCIDRs are all
	// of them (IPv4 first; two on a dual-stack cluster).
	PodCIDR  string
	PodCIDRs []string
	VM       *vm.VM

	mac        string // of the segment NIC
	containerd *vm.Proc
	kubelet    *vm.Proc
}

// KubeletLog is the output of n's kubelet so far (for failure messages).
func (n *Node) KubeletLog() string { return procOutput(n.kubelet) }

// ContainerdLog is the output of n's containerd so far (for failure
// messages).
func (n *Node) ContainerdLog() string { return procOutput(n.containerd) }

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
	if opts.Nodes <= 0 {
		opts.Nodes = 1
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
	pause, err := staticImage(ctx, cache, c.tmp, "github.com/ipvs-proxy/ipvs-proxy/e2e/guest/pause", "pause", PauseImage)
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
	serviceCIDR, clusterCIDR := ServiceCIDR, ClusterCIDR
	if opts.DualStack {
		if opts.Nodes < 2 {
			return nil, errors.New("cluster: Options.DualStack needs more than one node")
		}
		serviceCIDR, clusterCIDR = ServiceCIDR+","+ServiceCIDR6, ClusterCIDR+","+ClusterCIDR6
	}
	c.dualStack = opts.DualStack
	c.CP, err = controlplane.Start(ctx, controlplane.Options{
		Log:         logf,
		ServiceCIDR: serviceCIDR,
		Cluster: &controlplane.ClusterOptions{
			AdvertiseAddress: vm.APIServerGuestIP,
			EgressSocket:     socket,
			ClusterCIDR:      clusterCIDR,
		},
	})
	if err != nil {
		return nil, err
	}
	c.Client, c.Kubeconfig = c.CP.Client, c.CP.Kubeconfig

	// The VMs, made nodes, all at once. A VM lost on the way (QEMU
	// exited, its agent stopped answering, its kernel reported a stalled
	// CPU, or the Node was not Ready in time: the bed's failure, before
	// anything of the cluster's runs on the node) is booted again, up to
	// bootAttempts in all, and said so.
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
	if opts.Nodes > 1 {
		if c.Hub, err = vm.StartHub(); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		logf("cluster: %d nodes on the segment %s (hub %s)", opts.Nodes, SegmentCIDR, c.Hub.Addr())
	}
	for k := 1; k <= opts.Nodes; k++ {
		n := &Node{Name: fmt.Sprintf("node-%d", k), IP: NodeIP}
		if opts.Nodes > 1 {
			n.IP, n.mac = SegmentAddr(10+k), segmentMAC(10+k)
		}
		if opts.DualStack {
			n.IP6 = SegmentAddr6(10 + k)
		}
		c.Nodes = append(c.Nodes, n)
	}
	c.egress.setDialer(c.dialInCluster)
	c.vmOpts = vmOpts
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.startNodeRetrying(ctx, n, vmOpts, false)
		}()
	}
	wg.Wait()
	c.VM = c.Nodes[0].VM
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := c.routePodCIDRs(ctx); err != nil {
		return nil, err
	}
	if opts.Outside {
		if err := c.startOutside(ctx, opts); err != nil {
			return nil, err
		}
	}
	c.NodeReady = time.Since(began)
	logf("cluster: %d node(s) Ready after %s", len(c.Nodes), c.NodeReady.Round(time.Millisecond))
	if err := deployDNS(ctx, c.Client); err != nil {
		return nil, err
	}
	return c, nil
}

// startNodeRetrying boots n's VM and makes it a node, booting again
// while the VM is lost (nodeLostError), up to bootAttempts in all. A lost
// attempt's Node is deleted unless keepNode (a reboot: the Node and its
// pods stay).
func (c *Cluster) startNodeRetrying(ctx context.Context, n *Node, opts vm.Options, keepNode bool) error {
	opts.SegmentMAC = n.mac
	if c.Hub != nil {
		opts.Segment = c.Hub.Addr()
	}
	for attempt := 1; ; attempt++ {
		err := c.bootNode(ctx, n, opts)
		var lost *nodeLostError
		if err == nil || !errors.As(err, &lost) || attempt == bootAttempts {
			return err
		}
		c.logf("cluster: %s: the VM was lost while it came up (attempt %d of %d); booting it again: %v", n.Name, attempt, bootAttempts, err)
		c.dropVM(ctx, n, keepNode)
	}
}

// startNode prepares n's VM, starts containerd, imports the images and
// starts the kubelet.
func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	v := n.VM
	for path, data := range map[string]string{
		guestSetup:          string(nodeSetup),
		guestContainerdConf: containerdConfig(PauseImage),
		guestKubeletConfig:  kubeletConfig(),
		guestKubeconfig:     string(c.CP.KubeconfigFor("https://" + vm.APIServerGuestAddr)),
	} {
		if err := v.WriteFile(ctx, path, []byte(data), 0o600); err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
	}
	t := time.Now()
	segment, segment6 := "", ""
	if n.mac != "" {
		segment = n.IP + "/24"
	}
	if n.IP6 != "" {
		segment6 = n.IP6 + "/64"
	}
	if _, err := v.RunOK(ctx, "sh", guestSetup, ClusterCIDR, SegmentIface, n.mac, segment, segment6); err != nil {
		return fmt.Errorf("cluster: %s: node setup: %w", n.Name, err)
	}
	var err error
	if _, err := v.RunOK(ctx, "modprobe", "overlay"); err != nil {
		return fmt.Errorf("cluster: %s: load overlay for containerd's snapshotter: %w", n.Name, err)
	}
	if n.containerd, err = v.Start(ctx, joinUnit("containerd", "containerd", "--config", guestContainerdConf)...); err != nil {
		return fmt.Errorf("cluster: %s: %w", n.Name, err)
	}
	if err := waitContainerd(ctx, n); err != nil {
		return err
	}
	logf := c.logf
	logf("cluster: %s: containerd up after %s", n.Name, time.Since(t).Round(time.Millisecond))
	t = time.Now()
	// The overlayfs snapshotter (see containerdConfig).
	r, err := v.Exec(ctx, vm.Command{Argv: []string{"sh", "-c",
		"for f in " + guestImages + "/*.tar; do ctr -n k8s.io images import --no-unpack=false \"$f\" || exit 1; done; ctr -n k8s.io images ls -q"},
		Env: []string{"CONTAINERD_SNAPSHOTTER=overlayfs", "CONTAINERD_ADDRESS=" + containerdSock}})
	if err != nil {
		return fmt.Errorf("cluster: %s: import images: %w", n.Name, err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("cluster: %s: import images: exit status %d: %s%s", n.Name, r.ExitCode, r.Stdout, r.Stderr)
	}
	logf("cluster: %s: images imported in %s: %s", n.Name, time.Since(t).Round(time.Millisecond), strings.Join(strings.Fields(r.Stdout), " "))
	n.kubelet, err = v.Start(ctx, joinUnit("kubelet", guestKubelet,
		"--config="+guestKubeletConfig,
		"--kubeconfig="+guestKubeconfig,
		"--hostname-override="+n.Name,
		"--node-ip="+strings.Trim(n.IP+","+n.IP6, ","),
		"--root-dir=/var/lib/kubelet",
		"--cert-dir=/var/lib/kubelet/pki",
		"--v=1")...)
	if err != nil {
		return fmt.Errorf("cluster: %s: %w", n.Name, err)
	}
	return nil
}

func waitContainerd(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		r, err := n.VM.Exec(ctx, vm.Command{Argv: []string{"ctr", "--address", containerdSock, "version"}})
		if err == nil && r.ExitCode == 0 {
			return nil
		}
		if exited, code, _ := n.containerd.Exited(ctx); exited {
			return fmt.Errorf("cluster: %s: containerd exited with status %d:\n%s", n.Name, code, tailString(n.containerd.Output(), 3000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s: containerd not up: %w\n%s", n.Name, ctx.Err(), tailString(n.containerd.Output(), 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// bootNode starts n's VM and makes it a node (containerd, images,
// kubelet, CNI), returning once the Node is Ready.
func (c *Cluster) bootNode(ctx context.Context, n *Node, opts vm.Options) error {
	// The VM's host name is the Node's name, as on a real node (upstream
	// tests compare a host-network pod's hostname with its node's name).
	opts.KernelArgs = append(slices.Clone(opts.KernelArgs), "vm.hostname="+n.Name)
	v, err := vm.Start(ctx, opts)
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.VM = v
	c.mu.Unlock()
	c.logf("cluster: %s: VM ready after %v", n.Name, v.BootTime.Round(time.Millisecond))
	// A guest whose kernel reports a stalled CPU ends the bring-up at
	// once: such a guest has not been seen to recover.
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := watchKernelStall(bctx, cancel, n)
	err = c.startNode(bctx, n)
	if err == nil {
		err = c.waitNodeReady(bctx, n)
	}
	stopWatch()
	var lost *nodeLostError
	if cause := context.Cause(bctx); err != nil && errors.As(cause, &lost) {
		err = &nodeLostError{fmt.Errorf("%w (bring-up stopped at: %w)", cause, err)}
	}
	if dead, qerr := v.Exited(); err != nil && dead {
		if !errors.As(err, &lost) {
			err = &nodeLostError{fmt.Errorf("%w (the VM's QEMU had exited: %w; console:\n%s)", err, vm.ExitStatus(qerr), tailString(v.ConsoleLog(), 4000))}
		}
	}
	return err
}

// dropVM shuts a lost VM down (its console is in the error already) and,
// unless keepNode, deletes the Node its kubelet may have registered, so
// that the next boot's wait sees the new kubelet's Ready condition, not a
// stale one.
func (c *Cluster) dropVM(ctx context.Context, n *Node, keepNode bool) {
	if n.VM != nil {
		_ = n.VM.Shutdown()
	}
	c.mu.Lock()
	n.VM, n.containerd, n.kubelet = nil, nil, nil
	if !keepNode {
		n.PodCIDR, n.PodCIDRs = "", nil
	}
	c.mu.Unlock()
	if keepNode {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		c.logf("cluster: delete the lost node's Node %s: %v", n.Name, err)
	}
}

// watchKernelStall reads n's console every two seconds and cancels ctx
// with a nodeLostError when the kernel reports a stalled CPU. The
// returned function stops the watch and waits for it.
func watchKernelStall(ctx context.Context, cancel context.CancelCauseFunc, n *Node) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	v := n.VM
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
					n.Name, line, tailString(console, 4000))})
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// bootAttempts is how many times a node's VM is booted before the
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

// waitNodeReady waits for n's Node: once registered with its pod CIDR
// (node IPAM's; a rebooted node's Node has it already), it writes the CNI
// configuration for that range into the VM (the kubelet's network turns
// ready with it), then waits for the Ready condition.
func (c *Cluster) waitNodeReady(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	last := "not registered"
	cni := false             // this VM has the CNI configuration
	var unanswered time.Time // since when the agent has not answered
	for {
		if dead, qerr := n.VM.Exited(); dead {
			return &nodeLostError{fmt.Errorf("cluster: the VM's QEMU exited (%w) before node %s was Ready (%s)\nkubelet:\n%s\nconsole:\n%s",
				vm.ExitStatus(qerr), n.Name, last, tailString(n.kubelet.Output(), 3000), tailString(n.VM.ConsoleLog(), 4000))}
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			want := 1
			if c.dualStack {
				want = 2
			}
			if !cni && node.Spec.PodCIDR != "" && len(node.Spec.PodCIDRs) >= want {
				if err := n.VM.WriteFile(ctx, guestCNIConf, []byte(cniConfig(node.Spec.PodCIDRs...)), 0o600); err != nil {
					return fmt.Errorf("cluster: %s: CNI configuration: %w", n.Name, err)
				}
				c.mu.Lock()
				n.PodCIDR, n.PodCIDRs = node.Spec.PodCIDR, slices.Clone(node.Spec.PodCIDRs)
				c.mu.Unlock()
				cni = true
				c.logf("cluster: %s: registered, pods on %s", n.Name, strings.Join(n.PodCIDRs, " and "))
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue && cni {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		}
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		exited, code, aerr := n.kubelet.Exited(actx)
		acancel()
		if exited {
			return fmt.Errorf("cluster: %s: kubelet exited with status %d:\n%s", n.Name, code, tailString(n.kubelet.Output(), 5000))
		}
		switch {
		case aerr == nil:
			unanswered = time.Time{}
		case ctx.Err() != nil:
		case unanswered.IsZero():
			unanswered = time.Now()
		case time.Since(unanswered) > agentLostAfter:
			return &nodeLostError{fmt.Errorf("cluster: the VM's agent has not answered for %s before node %s was Ready (%s): %w\nkubelet (last seen):\n%s\nconsole:\n%s",
				agentLostAfter, n.Name, last, aerr, tailString(n.kubelet.Output(), 3000), tailString(n.VM.ConsoleLog(), 4000))}
		}
		select {
		case <-ctx.Done():
			// Counted as the VM's loss: nothing of the cluster runs on the
			// node yet, so a fresh boot loses nothing.
			return &nodeLostError{fmt.Errorf("cluster: node %s not Ready (%s): %w\nkubelet:\n%s\ncontainerd:\n%s\nconsole:\n%s", n.Name, last, ctx.Err(),
				tailString(n.kubelet.Output(), 5000), tailString(n.containerd.Output(), 3000), tailString(n.VM.ConsoleLog(), 3000))}
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// routePodCIDRs routes every node's pod CIDR to that node over the
// segment, on every other node (several nodes only).
func (c *Cluster) routePodCIDRs(ctx context.Context) error {
	if len(c.Nodes) < 2 {
		return nil
	}
	for _, n := range c.Nodes {
		for _, m := range c.Nodes {
			if m == n {
				continue
			}
			for _, p := range m.PodCIDRs {
				via := m.IP
				if strings.Contains(p, ":") {
					via = m.IP6
				}
				if _, err := n.VM.RunOK(ctx, "ip", "route", "replace", p, "via", via, "dev", SegmentIface); err != nil {
					return fmt.Errorf("cluster: %s: route %s's pods: %w", n.Name, m.Name, err)
				}
			}
		}
	}
	return nil
}

// startOutside boots the host outside the cluster on the segment.
func (c *Cluster) startOutside(ctx context.Context, opts Options) error {
	if c.Hub == nil {
		return errors.New("cluster: Options.Outside needs more than one node")
	}
	v, err := vm.Start(ctx, vm.Options{Assets: opts.Assets, MemoryMB: 512, CPUs: 1, Segment: c.Hub.Addr(),
		SegmentMAC: segmentMAC(100), Log: c.logf})
	if err != nil {
		return fmt.Errorf("cluster: outside host: %w", err)
	}
	c.Outside = v
	script := "ip link set " + SegmentIface + " up && ip addr add " + OutsideIP + "/24 dev " + SegmentIface
	if opts.DualStack {
		// No duplicate address detection: the address is usable at once.
		script = "sysctl -qw net.ipv6.conf." + SegmentIface + ".accept_dad=0 && " + script +
			" && ip addr add " + OutsideIP6 + "/64 dev " + SegmentIface
	}
	if _, err := v.RunOK(ctx, "sh", "-c", script); err != nil {
		return fmt.Errorf("cluster: outside host: %w", err)
	}
	return nil
}

// dialInCluster dials addr from inside the cluster for the apiserver's
// egress: from the node that owns the address (its node IP or pod CIDR),
// else from the first node that is up.
func (c *Cluster) dialInCluster(ctx context.Context, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	var v *vm.VM
	c.mu.Lock()
	for _, n := range c.Nodes {
		if n.VM == nil {
			continue
		}
		if v == nil {
			v = n.VM
		}
		mine := host == n.IP || (n.IP6 != "" && ip != nil && ip.Equal(net.ParseIP(n.IP6)))
		for _, p := range n.PodCIDRs {
			_, pods, _ := net.ParseCIDR(p)
			mine = mine || (pods != nil && ip != nil && pods.Contains(ip))
		}
		if mine {
			v = n.VM
			break
		}
	}
	c.mu.Unlock()
	if v == nil {
		return nil, errors.New("no node is up")
	}
	return v.Dial(ctx, addr)
}

// ExecCtr runs argv in a container on the first node (Node.ExecCtr).
func (c *Cluster) ExecCtr(ctx context.Context, containerID, execID string, argv ...string) (string, error) {
	return c.Nodes[0].ExecCtr(ctx, containerID, execID, argv...)
}

// ExecCtr runs argv in a container of n with containerd's own client in
// the VM (no CRI, no kubelet, no apiserver): containerID is the pod
// status's ID without its "containerd://", execID any name unique among
// the container's execs. It returns stdout and stderr together, and an
// error for an exit status other than 0.
func (n *Node) ExecCtr(ctx context.Context, containerID, execID string, argv ...string) (string, error) {
	r, err := n.VM.Exec(ctx, vm.Command{Argv: append([]string{"ctr", "--address", containerdSock, "-n", "k8s.io",
		"task", "exec", "--exec-id", execID, containerID}, argv...)})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("ctr: command terminated with exit code %d", r.ExitCode)
	}
	return r.Stdout + r.Stderr, err
}

// Ctr runs containerd's own client on n in the k8s.io namespace (ctr
// ARGS...) and returns its output.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	out, err := n.VM.RunOK(ctx, append([]string{"ctr", "--address", containerdSock, "-n", "k8s.io"}, args...)...)
	if err != nil {
		return out, fmt.Errorf("cluster: %s: ctr %s: %w", n.Name, strings.Join(args, " "), err)
	}
	return out, nil
}

// TaskPID is the process ID, in n's root namespace, of the main process
// of a container on n (containerID as ExecCtr takes it).
func (n *Node) TaskPID(ctx context.Context, containerID string) (int, error) {
	out, err := n.Ctr(ctx, "task", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == containerID {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("cluster: %s: no task of container %s in `ctr task ls`:\n%s", n.Name, containerID, out)
}

// Node is the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// KubeletLog is the output of the first node's kubelet so far (for
// failure messages).
func (c *Cluster) KubeletLog() string { return c.Nodes[0].KubeletLog() }

// ContainerdLog is the output of the first node's containerd so far (for
// failure messages).
func (c *Cluster) ContainerdLog() string { return c.Nodes[0].ContainerdLog() }

func procOutput(p *vm.Proc) string {
	if p == nil {
		return ""
	}
	return p.Output()
}

// Close stops every node's kubelet and VM, the outside host, the segment,
// the control plane and the egress proxy, and removes the temporary
// files. It may be called more than once.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		if n.kubelet != nil {
			_ = n.kubelet.Stop()
			n.kubelet = nil
		}
		if n.VM != nil {
			if err := n.VM.Shutdown(); err != nil {
				c.logf("cluster: %s: %v", n.Name, err)
			}
		}
	}
	if c.Outside != nil {
		_ = c.Outside.Shutdown()
	}
	if c.Hub != nil {
		c.Hub.Close()
		c.Hub = nil
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
