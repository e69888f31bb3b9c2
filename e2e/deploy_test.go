package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/manifest"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// deployDir holds the manifests, chartDir the Helm chart (the tests run
// in e2e/).
const (
	deployDir = "../deploy"
	chartDir  = "../deploy/helm/ipvs-proxy"
)

// manifests reads every object of deploy/*.yaml, in file order.
func manifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := manifest.ReadDir(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func newApplier(t *testing.T, cfg *rest.Config) *manifest.Applier {
	t.Helper()
	a, err := manifest.NewApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestDeployManifestsDryRun: every object of deploy/ passes the real
// apiserver's validation and defaulting (server-side apply, dry run).
func TestDeployManifestsDryRun(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	a := newApplier(t, e.CP.RESTConfig)
	kinds := map[string]int{}
	for _, obj := range manifests(t) {
		out, err := a.Apply(ctx, obj, true)
		if err != nil {
			t.Error(err)
			continue
		}
		kinds[obj.GetKind()]++
		if obj.GetKind() == "DaemonSet" {
			// Defaulted by the server: it really was decoded as a DaemonSet.
			if _, ok, _ := unstructured.NestedString(out.Object, "spec", "template", "spec", "schedulerName"); !ok {
				t.Errorf("DaemonSet not defaulted by the server: %v", out.Object["spec"])
			}
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s objects in deploy/, want 1", kinds[k], k)
		}
	}
	t.Logf("server-side dry run accepted %v", kinds)
	if _, err := e.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "ipvs-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the dry run stored the DaemonSet: %v", err)
	}
}

// saKubeconfig is a kubeconfig for the VM with a bearer token.
func saKubeconfig(t *testing.T, token string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: "https://" + vm.APIServerGuestAddr, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["ipvs-proxy"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "ipvs-proxy"}
	cfg.CurrentContext = "e2e"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeployRBAC: with deploy/'s ServiceAccount, ClusterRole and binding
// created for real, the agent runs in the VM on a token of that
// ServiceAccount, with detectLocalMode NodeCIDR: it reads its Node's
// podCIDR (before, it waited forever on a get the ClusterRole forbids),
// syncs a Service into the kernel, writes an Event, serves a healthy
// /healthz and tells a pod in the podCIDR from an outside client; the same
// token cannot read Secrets.
func TestDeployRBAC(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ns := e.namespace(t)
	a := newApplier(t, e.CP.RESTConfig)
	var rbac []*unstructured.Unstructured
	for _, obj := range manifests(t) {
		switch obj.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			rbac = append(rbac, obj)
		}
	}
	if len(rbac) != 3 {
		t.Fatalf("%d RBAC objects in deploy/, want 3", len(rbac))
	}
	for _, obj := range rbac {
		if _, err := a.Apply(ctx, obj, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := a.Delete(context.Background(), obj); err != nil {
				t.Errorf("delete %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		})
	}
	sa := rbac[0]
	if sa.GetKind() != "ServiceAccount" {
		t.Fatalf("first RBAC object is a %s", sa.GetKind())
	}
	tr, err := e.Client.CoreV1().ServiceAccounts(sa.GetNamespace()).CreateToken(ctx, sa.GetName(),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", sa.GetNamespace(), sa.GetName(), err)
	}
	token := tr.Status.Token

	// On the host: what the token may and may not do.
	saCfg := rest.CopyConfig(e.CP.RESTConfig)
	saCfg.BearerToken, saCfg.BearerTokenFile = token, ""
	saCfg.Username, saCfg.Password = "", ""
	saClient, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string]error{}
	_, forbidden["list secrets in kube-system"] = saClient.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	_, forbidden["list secrets in all namespaces"] = saClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	_, forbidden["get configmap ipvs-proxy"] = saClient.CoreV1().ConfigMaps("kube-system").Get(ctx, "ipvs-proxy", metav1.GetOptions{})
	_, forbidden["list pods"] = saClient.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	_, forbidden["create services"] = saClient.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("p", 80)}}}, metav1.CreateOptions{})
	_, forbidden["get node"] = saClient.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}) // NodeCIDR lists it
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s with the ServiceAccount's token: %v, want Forbidden", what, err)
		}
	}
	if _, err := saClient.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("list services with the ServiceAccount's token: %v", err)
	}
	if _, err := saClient.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("list endpointslices with the ServiceAccount's token: %v", err)
	}
	t.Logf("token of %s/%s: Secrets, ConfigMaps, Pods, Service writes and Node gets forbidden; Services and EndpointSlices listed", sa.GetNamespace(), sa.GetName())

	// In the VM: the agent on that token. Only one agent may own the
	// kernel: the bed's stops meanwhile and is restored after.
	const kubecfg = "/etc/ipvs-proxy/sa-kubeconfig"
	if err := e.VM.WriteFile(ctx, kubecfg, saKubeconfig(t, token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the bed's agent: %v", err)
		}
	})
	// detectLocalMode NodeCIDR: the Node's podCIDRs, read with the same
	// token (the ClusterRole lists Nodes; it grants no get).
	podCIDR := e.setNodePodCIDR(t, "10.103.250.0/24") // holds inClusterAddr
	argv := append([]string{bed.GuestBinary, "run", "--kubeconfig", kubecfg, "--hostname-override", nodeName},
		withoutFlag(agentArgs, "--cluster-cidr")...)
	argv = append(argv, "--detect-local-mode", "NodeCIDR")
	p, err := e.VM.Start(ctx, argv...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.WaitFor(wctx, `"kind":"full"`); err != nil {
		t.Fatalf("the agent on the ServiceAccount's token did not sync: %v", err)
	}

	// A Service with an unknown scheduler: programmed (with the default
	// scheduler) and reported with an Event, which the agent writes.
	svc := e.createService(t, ns, "rbac", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Annotations = map[string]string{"ipvs-proxy.io/scheduler": "no-such-scheduler"}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, endpointsOn(nodeName))
	e.expectTable(t, []string{"TCP  " + hostPort(svc.Spec.ClusterIP, 80) + " rr", "-> " + hostPort("10.103.0.10", backendPort)}, nil)
	e.expectEvent(t, svc, "")
	body := e.waitHealth(t, healthzURL, 200, time.Minute)
	if body["nodeEligible"] != true {
		t.Errorf("/healthz under RBAC: %v", body)
	}
	e.expectPodsLocal(t, ns, podCIDR)
	if out := p.Output(); regexp.MustCompile(`(?i)forbidden`).MatchString(out) {
		t.Errorf("the agent was refused something under RBAC:\n%s", grepLines(out, "orbidden"))
	}
}

// setNodePodCIDR gives the bed's Node a podCIDR, as node IPAM would (it
// can be set once: a Node that has one keeps it); it returns the Node's.
func (e env) setNodePodCIDR(t *testing.T, cidr string) string {
	t.Helper()
	ctx := context.Background()
	n, err := e.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.PodCIDR == "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = cidr, []string{cidr}
		if n, err = e.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("set the podCIDR of Node %s: %v", nodeName, err)
		}
	}
	if n.Spec.PodCIDR != cidr {
		t.Fatalf("Node %s has podCIDR %s, want %s", nodeName, n.Spec.PodCIDR, cidr)
	}
	return cidr
}

// expectPodsLocal: under detectLocalMode NodeCIDR, a client in the Node's
// podCIDR is a pod: the externalIP of an externalTrafficPolicy Local
// Service without a local endpoint answers it, with its address kept,
// and drops a client outside the cluster.
func (e env) expectPodsLocal(t *testing.T, ns, podCIDR string) {
	t.Helper()
	e.inClusterClient(t)
	bes := e.backends(t, 1, otherNode)
	const extIP = "10.251.1.31"
	svc := e.createService(t, ns, "nodecidr", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.ExternalIPs = []string{extIP}
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	addr := hostPort(extIP, 80)
	e.expectClients(t, inClusterNetns, addr, inClusterAddr)
	if res := e.expectBlocked(t, bed.ClientNetns, addr); res.ErrorCount(nettest.ErrTimeout) == 0 {
		t.Errorf("from outside the cluster to %s: %v; want dropped (timeouts)", addr, res.Errors)
	}
	t.Logf("detectLocalMode NodeCIDR (%s) on the shipped RBAC: the pod's connection kept its address, the outside client was dropped", podCIDR)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// containerCaps returns the added capabilities of the DaemonSet's
// container (init: its init container) from deploy/.
func containerCaps(t *testing.T, init bool) string {
	t.Helper()
	for _, obj := range manifests(t) {
		if obj.GetKind() != "DaemonSet" {
			continue
		}
		field := "containers"
		if init {
			field = "initContainers"
		}
		cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", field)
		if len(cs) != 1 {
			t.Fatalf("DaemonSet has %d %s", len(cs), field)
		}
		add, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "add")
		drop, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "drop")
		if strings.Join(drop, ",") != "ALL" || len(add) == 0 {
			t.Fatalf("%s: capabilities add %v drop %v", field, add, drop)
		}
		return strings.Join(add, ",")
	}
	t.Fatal("no DaemonSet in deploy/")
	return ""
}

// asContainer is a shell script for `unshare -m sh -c` that sets up what
// an unprivileged container of the DaemonSet sees (the node's
// /proc/sys/net at /host/proc/sys/net, /proc/sys read-only) and execs argv
// with only caps.
func asContainer(caps string, argv []string) string {
	return "set -e\n" +
		"mkdir -p /host/proc/sys/net\n" +
		"mount --bind /proc/sys/net /host/proc/sys/net\n" +
		"mount --bind /proc/sys /proc/sys\n" +
		"mount -o remount,bind,ro /proc/sys\n" +
		"exec /tmp/capexec --caps " + caps + " -- " + strings.Join(argv, " ") + "\n"
}

// TestDeployLeastPrivilege: the agent runs as the DaemonSet runs it: with
// only the manifest's capabilities, /proc/sys read-only and the node's
// /proc/sys/net at /host/proc/sys/net. It sets its sysctls through that
// mount, syncs a Service, serves /healthz; preflight with the init
// container's capabilities passes.
func TestDeployLeastPrivilege(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ns := e.namespace(t)
	capexec := filepath.Join(t.TempDir(), "capexec")
	if err := vm.BuildGoBinary(ctx, "github.com/ipvs-proxy/ipvs-proxy/e2e/guest/capexec", capexec); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(capexec)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.VM.WriteFile(ctx, "/tmp/capexec", b, 0o755); err != nil {
		t.Fatal(err)
	}
	runCaps, preflightCaps := containerCaps(t, false), containerCaps(t, true)

	// The emulation holds: /proc/sys is read-only in there.
	r, err := e.VM.Run(ctx, "unshare", "-m", "sh", "-c", asContainer(runCaps, []string{"sh", "-c", "'echo 1 > /proc/sys/net/ipv4/vs/conntrack'"}))
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "Read-only") {
		t.Fatalf("/proc/sys writable in the emulated container: exit %d %s", r.ExitCode, r.Stderr)
	}

	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.VM.Run(context.Background(), "rm", "-rf", "/host", "/tmp/capexec")
		if err := e.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the bed's agent: %v", err)
		}
	})
	// Settings the agent must write (the bed's agent set them).
	if _, err := e.VM.RunOK(ctx, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/vs/conntrack; echo 0 > /proc/sys/net/ipv4/vs/expire_nodest_conn"); err != nil {
		t.Fatal(err)
	}

	t.Run("preflight", func(t *testing.T) {
		// As the init container, before run has set anything.
		pre := append([]string{bed.GuestBinary, "preflight", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName,
			"--load-modules", "--log-level", "info"}, agentArgs...)
		r, err := e.VM.Run(ctx, "unshare", "-m", "sh", "-c", asContainer(preflightCaps, pre))
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 {
			t.Errorf("preflight with %s, /proc/sys read-only: exit %d\n%s%s", preflightCaps, r.ExitCode, r.Stdout, r.Stderr)
		} else {
			t.Logf("preflight with %s passed:\n%s", preflightCaps, r.Stdout)
		}
	})
	t.Run("run", func(t *testing.T) { leastPrivilegeRun(t, e, ns, runCaps) })
}

// leastPrivilegeRun runs the agent as the DaemonSet's main container.
func leastPrivilegeRun(t *testing.T, e env, ns, runCaps string) {
	ctx := context.Background()
	const conntrack = "/proc/sys/net/ipv4/vs/conntrack"
	argv := append([]string{bed.GuestBinary, "run", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName}, agentArgs...)
	p, err := e.VM.Start(ctx, "unshare", "-m", "sh", "-c", asContainer(runCaps, argv))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.WaitFor(wctx, `"kind":"full"`); err != nil {
		t.Fatalf("the agent with %s did not sync: %v", runCaps, err)
	}
	if v, err := e.VM.RunOK(ctx, "cat", conntrack); err != nil || strings.TrimSpace(v) != "1" {
		t.Errorf("%s = %q (%v), want 1 set by the agent through /host/proc/sys", conntrack, v, err)
	}
	if !strings.Contains(p.Output(), `"msg":"set sysctl","name":"net/ipv4/vs/conntrack","value":"1","was":"0"`) &&
		!regexp.MustCompile(`"set sysctl".*"net/ipv4/vs/conntrack"`).MatchString(p.Output()) {
		t.Errorf("no log of setting net/ipv4/vs/conntrack:\n%s", grepLines(p.Output(), "sysctl"))
	}
	capEff := regexp.MustCompile(`(?m)^CapEff:\s*(\S+)`).FindStringSubmatch(agentStatus(ctx, t, e.VM))
	if capEff == nil || capEff[1] != "0000000000003000" { // CAP_NET_ADMIN (12) | CAP_NET_RAW (13)
		t.Errorf("the agent's effective capabilities %v, want 0000000000003000 (NET_ADMIN, NET_RAW)", capEff)
	}

	svc := e.createService(t, ns, "leastpriv", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, endpointsOn(nodeName))
	e.expectTable(t, []string{"TCP  " + hostPort(svc.Spec.ClusterIP, 80) + " rr", "-> " + hostPort("10.103.0.10", backendPort)}, nil)
	e.waitHealth(t, healthzURL, 200, time.Minute)
	hc := fmt.Sprintf("http://%s/", hostPort(nodeAddr, svc.Spec.HealthCheckNodePort))
	eventually(t, 30*time.Second, func() error {
		if code, body := e.httpGet(t, hc); code != 200 {
			return fmt.Errorf("health-check node port: %d %s", code, body)
		}
		return nil
	})
	if errs := grepLines(p.Output(), `"level":"error"`); errs != "" {
		t.Errorf("errors logged with %s:\n%s", runCaps, errs)
	}
	t.Logf("agent with %s (CapEff %s), /proc/sys read-only: synced, sysctls set through %s, /healthz and a health-check node port served",
		runCaps, capEff[1], "/host/proc/sys")
}

// agentStatus is /proc/PID/status of the ipvs-proxy process running in
// the VM.
func agentStatus(ctx context.Context, t *testing.T, v *vm.VM) string {
	t.Helper()
	pid, err := v.RunOK(ctx, "pidof", "ipvs-proxy")
	if err != nil {
		t.Fatal(err)
	}
	status, err := v.RunOK(ctx, "cat", "/proc/"+strings.Fields(pid)[0]+"/status")
	if err != nil {
		t.Fatal(err)
	}
	return status
}
