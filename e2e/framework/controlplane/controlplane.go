// Package controlplane runs a real Kubernetes control plane for end-to-end
// tests: etcd, kube-apiserver and, when asked, kube-controller-manager,
// built from the wrapper module e2e/tools/k8sbin (see EnsureBinaries) and listening
// on free ports of 127.0.0.1 only.
//
// The apiserver authorizes with RBAC; the fixture's credentials are a static
// bearer token in the group system:masters. There is no kubelet and no
// scheduler: tests create Nodes and Pods themselves and set Pod status by
// hand; with the controller manager running, selector Services then get
// EndpointSlices as in a real cluster. The Service "kubernetes" exists but
// has no endpoints: the apiserver's address is 127.0.0.1, which Endpoints
// may not hold, so its endpoint reconciler is off.
//
// Every child process dies with the test binary (Pdeathsig), also when it is
// killed outright; TestMain can call InterruptCleanup so that SIGINT and
// SIGTERM also remove the temporary directories.
package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultServiceCIDR is the Service range when Options.ServiceCIDR is empty:
// dual-stack, so that IPv6 and dual-stack Services can be created.
const DefaultServiceCIDR = "10.96.0.0/16,fd00:10:96::/112"

// Time limits for each component to become healthy.
const (
	etcdTimeout      = 30 * time.Second
	apiserverTimeout = 2 * time.Minute
	kcmTimeout       = time.Minute
)

// Options configure Start.
type Options struct {
	// WithControllerManager also runs kube-controller-manager with the
	// serviceaccount, endpoint, endpointslice and endpointslicemirroring
	// controllers.
	WithControllerManager bool
	// Log receives progress messages (e.g. t.Logf). Optional.
	Log func(format string, args ...any)
	// ServiceCIDR is passed to --service-cluster-ip-range: one CIDR, or an
	// IPv4 and an IPv6 one separated by a comma. Default DefaultServiceCIDR.
	ServiceCIDR string
	// BinDir holds kube-apiserver and etcd (and kube-controller-manager,
	// else it is built on demand with EnsureControllerManager).
	// Default: EnsureBinaries(ctx, CacheDir()).
	BinDir string
	// Cluster, if set, makes this the control plane of a real cluster
	// whose node is elsewhere (package cluster: the bed's VM). It implies
	// WithControllerManager.
	Cluster *ClusterOptions
}

// ClusterOptions make the control plane serve a real node: kube-scheduler
// runs, kube-controller-manager runs its default controllers (deployment,
// replicaset, daemonset, namespace, garbage collector, serviceaccount,
// serviceaccount-token, node IPAM and lifecycle, endpoints...), and the
// apiserver advertises an address that the node reaches, reaches the
// node's addresses through an HTTP CONNECT proxy, and publishes its
// serving CA to pods (the kube-root-ca.crt ConfigMaps).
type ClusterOptions struct {
	// AdvertiseAddress is the apiserver's address as the node sees it
	// (--advertise-address): the endpoint of the `kubernetes` Service,
	// with the apiserver's port (APIServerPort), so the node must forward
	// AdvertiseAddress:APIServerPort to it.
	AdvertiseAddress string
	// EgressSocket is the unix socket of an HTTP CONNECT proxy that
	// carries the apiserver's connections to the cluster (kubelet's port
	// for exec, logs and port-forward; pods and services for the proxy
	// subresources): the apiserver's "cluster" egress selection. Empty:
	// direct connections.
	EgressSocket string
	// ClusterCIDR is the pods' range (--cluster-cidr); node IPAM gives
	// each Node a /24 of it.
	ClusterCIDR string
}

// ControlPlane is a running control plane. Its fields are read-only.
type ControlPlane struct {
	// Dir is the temporary directory with data, keys, certificates and the
	// logs (etcd.log, kube-apiserver.log, kube-controller-manager.log).
	// Stop removes it.
	Dir string
	// Kubeconfig is the path of a kubeconfig file for AdminToken and
	// https://127.0.0.1:APIServerPort (TLS not verified).
	Kubeconfig string
	// RESTConfig and Client use the same credentials. RESTConfig allows
	// 100 QPS (burst 200); copy it to change that.
	RESTConfig *rest.Config
	Client     kubernetes.Interface
	// APIServerPort is the apiserver's secure port on 127.0.0.1.
	APIServerPort int
	// AdminToken is a bearer token in the group system:masters.
	AdminToken string

	binDir      string
	kcmDir      string // where kube-controller-manager is
	serviceCIDR string
	etcdURL     string
	logf        func(format string, args ...any)
	ownerLock   *os.File // flocked while Dir is in use, see makeOwnedDir

	mu        sync.Mutex
	stopped   bool     // set by Stop: start nothing any more
	etcd      *process // guarded by mu
	apiserver *process // guarded by mu
	kcm       *process // guarded by mu
	scheduler *process // guarded by mu
	cluster   *ClusterOptions
	schedDir  string // where kube-scheduler is
	stopOnce  sync.Once
}

// Start starts etcd and kube-apiserver (and kube-controller-manager if
// asked) in a fresh temporary directory and returns once all are healthy.
// ctx bounds the start-up (including a build of the binaries), not the
// lifetime of the processes: call Stop, e.g. from t.Cleanup.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	began := time.Now()
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	binDir := opts.BinDir
	if binDir == "" {
		if binDir, err = EnsureBinaries(ctx, CacheDir()); err != nil {
			return nil, fmt.Errorf("control-plane binaries: %w", err)
		}
		logf("control plane: binaries ready in %s (%s)", time.Since(began).Round(time.Millisecond), binDir)
	}
	if opts.Cluster != nil {
		opts.WithControllerManager = true
	}
	kcmDir := opts.BinDir
	if opts.WithControllerManager && (kcmDir == "" || !complete(kcmDir, []command{{binary: BinControllerManager}})) {
		began := time.Now()
		if kcmDir, err = EnsureControllerManager(ctx, CacheDir()); err != nil {
			return nil, fmt.Errorf("control-plane binaries: %w", err)
		}
		logf("control plane: kube-controller-manager ready in %s (%s)", time.Since(began).Round(time.Millisecond), kcmDir)
	}
	schedDir := opts.BinDir
	if opts.Cluster != nil && (schedDir == "" || !complete(schedDir, []command{{binary: BinScheduler}})) {
		began := time.Now()
		if schedDir, err = EnsureScheduler(ctx, CacheDir()); err != nil {
			return nil, fmt.Errorf("control-plane binaries: %w", err)
		}
		logf("control plane: kube-scheduler ready in %s (%s)", time.Since(began).Round(time.Millisecond), schedDir)
	}
	serviceCIDR := opts.ServiceCIDR
	if serviceCIDR == "" {
		serviceCIDR = DefaultServiceCIDR
	}
	if n := removeStaleDirs(os.TempDir()); n > 0 {
		logf("control plane: removed %d directories left behind by killed test processes", n)
	}
	dir, ownerLock, err := makeOwnedDir(os.TempDir())
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	cp := &ControlPlane{
		Dir:         dir,
		AdminToken:  randomHex(16),
		binDir:      binDir,
		kcmDir:      kcmDir,
		schedDir:    schedDir,
		cluster:     opts.Cluster,
		serviceCIDR: serviceCIDR,
		logf:        logf,
		ownerLock:   ownerLock,
	}
	registerLive(cp)
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()

	upStart := time.Now()
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	logf("control plane: etcd healthy after %s", time.Since(upStart).Round(time.Millisecond))
	if err := cp.writeCredentials(); err != nil {
		return nil, err
	}
	t := time.Now()
	if err := withFreePorts(1, func(ports []int) error {
		cp.APIServerPort = ports[0]
		return cp.StartAPIServer(ctx)
	}); err != nil {
		return nil, err
	}
	logf("control plane: kube-apiserver ready on 127.0.0.1:%d after %s", cp.APIServerPort, time.Since(t).Round(time.Millisecond))
	if err := cp.writeKubeconfig(); err != nil {
		return nil, err
	}
	if err := cp.ensureDefaultServiceAccount(ctx); err != nil {
		return nil, err
	}
	if opts.WithControllerManager {
		t := time.Now()
		if err := cp.startControllerManager(ctx); err != nil {
			return nil, err
		}
		logf("control plane: kube-controller-manager healthy after %s", time.Since(t).Round(time.Millisecond))
	}
	if opts.Cluster != nil {
		t := time.Now()
		if err := cp.startScheduler(ctx); err != nil {
			return nil, err
		}
		logf("control plane: kube-scheduler healthy after %s", time.Since(t).Round(time.Millisecond))
	}
	logf("control plane: up in %s (%s)", time.Since(upStart).Round(time.Millisecond), dir)
	return cp, nil
}

// KubeconfigFor returns a kubeconfig with the admin credentials for another
// address of the same apiserver, e.g. "https://10.0.2.100:6443" as a VM
// sees a forwarded port. TLS is not verified.
func (cp *ControlPlane) KubeconfigFor(server string) []byte {
	cfg := clientcmdapi.NewConfig()
	const name = "ipvs-proxy-e2e"
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, InsecureSkipTLSVerify: true}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: cp.AdminToken}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: metav1.NamespaceDefault}
	cfg.CurrentContext = name
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		panic(fmt.Sprintf("controlplane: encode kubeconfig: %v", err)) // plain strings: cannot fail
	}
	return b
}

// StopAPIServer stops kube-apiserver only (SIGTERM, SIGKILL after 5 s);
// etcd and the controller manager keep running. StartAPIServer brings it
// back on the same port.
func (cp *ControlPlane) StopAPIServer() {
	cp.mu.Lock()
	p := cp.apiserver
	cp.mu.Unlock()
	if p != nil {
		t := time.Now()
		killed := p.stop()
		cp.logf("control plane: kube-apiserver stopped in %s%s", time.Since(t).Round(time.Millisecond), killedNote(killed))
	}
}

// StartAPIServer starts kube-apiserver on APIServerPort, with the same
// flags, certificates and etcd as before, and waits for /readyz. It fails if
// the apiserver is running or the control plane has been stopped.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.APIServerPort),
		"--etcd-servers=" + cp.etcdURL,
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--service-cluster-ip-range=" + cp.serviceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(cp.Dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(cp.Dir, "sa.key"),
		"--token-auth-file=" + filepath.Join(cp.Dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// Close open watches on SIGTERM; with the default (0) the
		// apiserver waits for them and StopAPIServer needed SIGKILL
		// whenever a client (the controller manager) was watching.
		"--shutdown-watch-termination-grace-period=2s",
		// It could only fail: 127.0.0.1 is no valid endpoint address.
		"--endpoint-reconciler-type=none",
		"--v=1",
	}
	if c := cp.cluster; c != nil {
		args, err := cp.clusterAPIServerArgs(args)
		if err != nil {
			return err
		}
		p, err := cp.startProcess("kube-apiserver", BinAPIServer, args, &cp.apiserver)
		if err != nil {
			return err
		}
		return waitHealthy(ctx, p, apiserverTimeout, fmt.Sprintf("https://127.0.0.1:%d/readyz", cp.APIServerPort), cp.AdminToken)
	}
	p, err := cp.startProcess("kube-apiserver", BinAPIServer, args, &cp.apiserver)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", cp.APIServerPort)
	return waitHealthy(ctx, p, apiserverTimeout, url, cp.AdminToken)
}

// Stop stops every process (SIGTERM to each process group, SIGKILL after
// 5 s), waits for them and removes Dir. It may be called more than once and
// concurrently.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		cp.mu.Lock()
		cp.stopped = true
		procs := []*process{cp.scheduler, cp.kcm, cp.apiserver, cp.etcd}
		cp.mu.Unlock()
		t := time.Now()
		for _, p := range procs {
			if p != nil && p.stop() {
				cp.logf("control plane: %s%s", p.name, killedNote(true))
			}
		}
		if err := os.RemoveAll(cp.Dir); err != nil {
			cp.logf("control plane: %v", err)
		}
		cp.ownerLock.Close()
		unregisterLive(cp)
		cp.logf("control plane: stopped in %s", time.Since(t).Round(time.Millisecond))
	})
}

func killedNote(killed bool) string {
	if killed {
		return fmt.Sprintf(" (ignored SIGTERM for %s, killed)", stopGrace)
	}
	return ""
}

// pids lists the processes started and not yet reaped.
func (cp *ControlPlane) pids() []int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []int
	for _, p := range []*process{cp.etcd, cp.apiserver, cp.kcm, cp.scheduler} {
		if p != nil && !p.exited() {
			out = append(out, p.pid())
		}
	}
	return out
}

// startProcess starts binary from binDir, logging to <Dir>/<name>.log, and
// stores it in *field (one of cp's process fields); both happen under cp.mu
// so that a concurrent Stop sees every process.
func (cp *ControlPlane) startProcess(name, binary string, args []string, field **process) (*process, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil, fmt.Errorf("%s: control plane already stopped", name)
	}
	if *field != nil && !(*field).exited() {
		return nil, fmt.Errorf("%s is already running", name)
	}
	dir := cp.binDir
	switch binary {
	case BinControllerManager:
		dir = cp.kcmDir
	case BinScheduler:
		dir = cp.schedDir
	}
	p, err := startProcess(name, filepath.Join(dir, binary), args, filepath.Join(cp.Dir, name+".log"))
	if err != nil {
		return nil, err
	}
	*field = p
	return p, nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	return withFreePorts(3, func(ports []int) error {
		dataDir := filepath.Join(cp.Dir, "etcd")
		if err := os.RemoveAll(dataDir); err != nil { // from a failed attempt
			return fmt.Errorf("etcd: %w", err)
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		args := []string{
			"--name=e2e",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=e2e=" + peer,
			fmt.Sprintf("--listen-metrics-urls=http://127.0.0.1:%d", ports[2]),
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
		p, err := cp.startProcess("etcd", BinEtcd, args, &cp.etcd)
		if err != nil {
			return err
		}
		cp.etcdURL = client
		return waitHealthy(ctx, p, etcdTimeout, client+"/health", "")
	})
}

func (cp *ControlPlane) startControllerManager(ctx context.Context) error {
	return withFreePorts(1, func(ports []int) error {
		args := []string{
			"--kubeconfig=" + cp.Kubeconfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			"--cert-dir=" + filepath.Join(cp.Dir, "kcm-certs"),
			"--authentication-skip-lookup=true",
			"--leader-elect=false",
			"--use-service-account-credentials=false",
			"--controllers=serviceaccount,endpoint,endpointslice,endpointslicemirroring",
			"--v=1",
		}
		if c := cp.cluster; c != nil {
			args = append(args[:len(args)-2],
				"--controllers=*",
				"--root-ca-file="+filepath.Join(cp.Dir, "apiserver-certs", "apiserver.crt"),
				"--service-account-private-key-file="+filepath.Join(cp.Dir, "sa.key"),
				"--allocate-node-cidrs=true",
				"--cluster-cidr="+c.ClusterCIDR,
				"--service-cluster-ip-range="+cp.serviceCIDR,
				"--node-cidr-mask-size-ipv4=24",
				"--v=1")
		}
		p, err := cp.startProcess("kube-controller-manager", BinControllerManager, args, &cp.kcm)
		if err != nil {
			return err
		}
		return waitHealthy(ctx, p, kcmTimeout, fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0]), "")
	})
}

// writeCredentials writes the service-account key pair and the token file.
func (cp *ControlPlane) writeCredentials() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(cp.AdminToken + ",admin,admin-uid,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.Dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write credentials: %w", err)
		}
	}
	return nil
}

// writeKubeconfig writes Kubeconfig and builds RESTConfig and Client from it.
func (cp *ControlPlane) writeKubeconfig() error {
	data := cp.KubeconfigFor(fmt.Sprintf("https://127.0.0.1:%d", cp.APIServerPort))
	path := filepath.Join(cp.Dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	cp.Kubeconfig, cp.RESTConfig, cp.Client = path, cfg, client
	return nil
}

// ensureDefaultServiceAccount creates default/default, which admission
// requires for Pods, so that Pods can be created without the controller
// manager too (with it, this merely wins a race against its controller).
func (cp *ControlPlane) ensureDefaultServiceAccount(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	for {
		// The namespace "default" appears shortly after /readyz.
		_, err := cp.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create service account default/default: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// withFreePorts calls start with n free ports of 127.0.0.1, and again with
// other ports (three tries in all) when a port was taken in between.
func withFreePorts(n int, start func(ports []int) error) error {
	var err error
	for try := 0; try < 3; try++ {
		ports, perr := freePorts(n)
		if perr != nil {
			return perr
		}
		if err = start(ports); err == nil || !errors.Is(err, errPortInUse) {
			return err
		}
	}
	return err
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment
// ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close() // held until all n are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitHealthy polls url until it answers 200, p exits, ctx ends or the
// timeout passes; on failure p is stopped and the error carries its log.
func waitHealthy(ctx context.Context, p *process, timeout time.Duration, url, token string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // self-signed serving certs
			DisableKeepAlives: true,
		},
	}
	var lastErr error
	for {
		if lastErr = probe(ctx, client, url, token); lastErr == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.failure(fmt.Errorf("exited before %s answered", url))
		case <-ctx.Done():
			p.stop()
			return p.failure(fmt.Errorf("%s not healthy after %s: %w (last: %w)", url, timeout, ctx.Err(), lastErr))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func probe(ctx context.Context, client *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// clusterAPIServerArgs turns the apiserver's arguments into those of a
// cluster's (Options.Cluster): the node's view of its address, the lease
// endpoint reconciler (so the `kubernetes` Service gets that address as
// its endpoint), and the egress to the node's network.
func (cp *ControlPlane) clusterAPIServerArgs(args []string) ([]string, error) {
	c := cp.cluster
	var out []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--advertise-address="), strings.HasPrefix(a, "--endpoint-reconciler-type="):
		default:
			out = append(out, a)
		}
	}
	out = append(out,
		"--advertise-address="+c.AdvertiseAddress,
		"--kubelet-preferred-address-types=InternalIP,Hostname")
	if c.EgressSocket != "" {
		// The "cluster" selection covers the apiserver's connections to
		// kubelets, and to pods and services for their proxy
		// subresources. HTTPConnect over TCP always speaks TLS to the
		// proxy; over a unix socket it is plain HTTP.
		cfg := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, c.EgressSocket)
		p := filepath.Join(cp.Dir, "egress-selector.yaml")
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			return nil, fmt.Errorf("egress selector config: %w", err)
		}
		out = append(out, "--egress-selector-config-file="+p)
	}
	return out, nil
}

func (cp *ControlPlane) startScheduler(ctx context.Context) error {
	return withFreePorts(1, func(ports []int) error {
		args := []string{
			"--kubeconfig=" + cp.Kubeconfig,
			"--authentication-kubeconfig=" + cp.Kubeconfig,
			"--authorization-kubeconfig=" + cp.Kubeconfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			"--cert-dir=" + filepath.Join(cp.Dir, "scheduler-certs"),
			"--leader-elect=false",
			"--v=1",
		}
		p, err := cp.startProcess("kube-scheduler", BinScheduler, args, &cp.scheduler)
		if err != nil {
			return err
		}
		return waitHealthy(ctx, p, kcmTimeout, fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0]), "")
	})
}
