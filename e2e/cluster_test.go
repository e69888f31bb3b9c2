package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// oneNode is the package's one-node cluster (kubelet, containerd and crun
// in the VM, the control plane on the host) with ipvs-proxy as its
// DaemonSet from the Helm chart (deploy/helm), with no kube-proxy. The
// tests that need real pods on one node share it (each in namespaces of
// its own): booting it costs about 1m50s warm. The first test that needs
// it starts it; the last of them in the package's order (TestClusterNode)
// stops it, so that its VM does not run beside the tests after it, and
// TestMain stops it if that test did not run.
var oneNode struct {
	once   sync.Once
	c      *cluster.Cluster
	err    error
	ready  time.Duration // from the start until ipvs-proxy was ready
	closed bool
}

// closeOneNode stops the shared one-node cluster, if it runs.
func closeOneNode() {
	if oneNode.c != nil {
		oneNode.c.Close()
		oneNode.c, oneNode.closed = nil, true
	}
}

// oneNodeValues are the chart's values of the one-node cluster: a default
// scheduler other than the default (wrr: with equal weights it balances as
// rr does) that must reach the kernel, and monitoring on as an operator
// turns it on (deploy/README.md): the ServiceMonitor, every 5 s for a
// short test, the job kubernetes-mixin's Proxy dashboard selects, the alerts and
// the dashboards ConfigMap (TestPrometheusScrapesAgents).
var oneNodeValues = map[string]any{
	"config":         map[string]any{"ipvs": map[string]any{"scheduler": "wrr"}},
	"monitoring":     map[string]any{"job": monitoringJob},
	"serviceMonitor": map[string]any{"enabled": true, "interval": "5s"},
	"prometheusRule": map[string]any{"enabled": true},
	"dashboards":     map[string]any{"enabled": true},
}

// oneNodeCluster returns the shared one-node cluster, starting it on first
// use. ipvs-proxy comes from the chart as Helm users install it: rendered
// with Helm's SDK, with the apiserver's address and the pod CIDR set, and
// oneNodeValues. (The conformance run
// installs deploy/'s manifests, which the chart's default rendering
// equals: deploy/helm's unit test; TestTwoNodes installs them as shipped.)
func oneNodeCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	assets := vm.Require(t)
	oneNode.once.Do(func() {
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		// The cluster outlives the test that starts it: it logs to stderr.
		logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
		c, err := cluster.Start(ctx, cluster.Options{Assets: assets, Log: logf})
		if err != nil {
			oneNode.err = err
			return
		}
		logf("cluster: TIMING node Ready: %s", c.NodeReady.Round(time.Millisecond))
		if err := c.DeployIPVSProxyChart(ctx, chartDir, oneNodeValues); err != nil {
			c.Close()
			oneNode.err = err
			return
		}
		oneNode.c, oneNode.ready = c, time.Since(began)
		logf("cluster: TIMING ipvs-proxy ready after %s", oneNode.ready.Round(time.Millisecond))
	})
	if oneNode.err != nil {
		t.Fatalf("start the one-node cluster: %v", oneNode.err)
	}
	if oneNode.closed {
		t.Fatal("the one-node cluster was stopped by the last of its users in the package's order (TestClusterNode): a new user runs before it")
	}
	return oneNode.c
}

// TestClusterNode: in the shared one-node cluster (oneNodeCluster) the
// Node is Ready, the DaemonSet's pod runs and programs the `kubernetes`
// Service into IPVS with the chart's scheduler, pods run, exec through the
// apiserver works, and pods reach a ClusterIP Service's pod and the
// `kubernetes` Service, and resolve Services' names through the cluster's
// DNS (CoreDNS behind the kube-dns Service).
func TestClusterNode(t *testing.T) {
	began := time.Now()
	c := oneNodeCluster(t)
	defer closeOneNode() // its last user
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	t.Logf("TIMING cluster with ipvs-proxy ready: %s after its start (shared)", oneNode.ready.Round(time.Millisecond))
	cs := c.Client

	ns := "cluster-node"
	clusterNamespace(ctx, t, cs, ns)
	server := agentPod("server", []string{"/vmagent", "serve", "--name", "server", "--port", "8080", "--tcp"})
	server.Labels = map[string]string{"app": "server"}
	client := agentPod("client", []string{"/vmagent", "serve", "--name", "client", "--port", "8081", "--tcp"})
	podsStart := time.Now()
	pods := runPods(ctx, t, c, ns, server, client)
	t.Logf("TIMING pods Running after %s", time.Since(podsStart).Round(time.Millisecond))

	// exec through the apiserver (and its egress into the VM): this one
	// has no fallback to ctr, it is the exec path under test.
	out, err := podExecAPIServer(ctx, t, c, ns, "client", contains("refused"), "/vmagent", "http", "--timeout", "2s", "http://127.0.0.1:1/")
	if err == nil || !strings.Contains(out, "refused") {
		t.Errorf("exec in pod client: %q, %v; want the agent's connection-refused error", out, err)
	} else {
		t.Logf("exec in pod client: %s", strings.TrimSpace(out))
	}

	// Logs through the apiserver (the same egress to the kubelet): the
	// server printed READY once it listened.
	waitFor(ctx, t, "pod server's log", func() (bool, string) {
		b, err := cs.CoreV1().Pods(ns).GetLogs("server", &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && strings.Contains(string(b), "READY"), fmt.Sprintf("%q %v", b, err)
	})

	// ipvs-proxy has programmed the `kubernetes` Service, with the
	// chart's scheduler.
	waitFor(ctx, t, "the kubernetes Service in IPVS with the chart's scheduler wrr", func() (bool, string) {
		out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", cluster.KubernetesIP+":443")
		return err == nil && strings.Contains(out, c.APIServerAddr()) && strings.Contains(out, ":443 wrr"), out + fmt.Sprint(err)
	})

	// A ClusterIP Service in front of the server pod, used from the client
	// pod: the answer names the server and the client pod's own address.
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP + ":80"
	waitFor(ctx, t, "Service server in IPVS", func() (bool, string) {
		out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", vip)
		return err == nil && strings.Contains(out, pods["server"].Status.PodIP+":8080"), out + fmt.Sprint(err)
	})
	hit := podHit(ctx, t, c, ns, "client", vip, 3)
	if hit.Answers["server"] != 3 || hit.Clients[pods["client"].Status.PodIP] != 3 {
		t.Errorf("pod client -> %s: %+v; want 3 answers from server, seen from the client pod's %s", vip, hit, pods["client"].Status.PodIP)
	} else {
		t.Logf("pod client -> Service server %s: %+v", vip, hit)
	}

	// The cluster's DNS (CoreDNS behind kube-dns, through IPVS): the
	// client pod reaches the Service by its short name and by its full
	// name (the Go resolver, over UDP, with the search path kubelet wrote);
	// the node resolves it over TCP; a name outside cluster.local is not
	// answered.
	if err := c.WaitDNS(ctx); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []string{"udp", "tcp"} {
		waitFor(ctx, t, "kube-dns "+proto+" in IPVS", func() (bool, string) {
			out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "--"+proto+"-service", cluster.DNSServiceIP+":53")
			return err == nil && dnsBackend.MatchString(out), out + fmt.Sprint(err)
		})
	}
	// Pods of their own whose command is the client, read through their
	// logs: an exec's output is sometimes lost (see podExec).
	byName := map[string]string{"by-short-name": "server:80", "by-full-name": "server." + ns + ".svc." + cluster.ClusterDomain + ":80"}
	for pod, addr := range byName {
		p := agentPod(pod, []string{"/vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", "2"})
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for pod, addr := range byName {
		waitFor(ctx, t, "pod "+pod+" Succeeded", func() (bool, string) {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Phase == corev1.PodSucceeded, cluster.PodSummary(p)
		}, c.KubeletLog)
		b, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs of pod %s: %v", pod, err)
		}
		var hit nettest.HitResult
		if err := json.Unmarshal(b, &hit); err != nil {
			t.Fatalf("pod %s's hit: %q: %v", pod, b, err)
		}
		if hit.Answers["server"] != 2 {
			t.Errorf("pod %s -> %s: %+v; want 2 answers from server", pod, addr, hit)
		} else {
			t.Logf("pod %s -> %s: %+v", pod, addr, hit)
		}
	}
	// Over TCP from the node: a Go resolver whose connections are the
	// guest agent's (a stream, so DNS over TCP).
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return c.VM.Dial(ctx, cluster.DNSServiceIP+":53")
	}}
	full := "server." + ns + ".svc." + cluster.ClusterDomain + "."
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	addrs, err := r.LookupHost(lctx, full)
	lcancel()
	if err != nil || len(addrs) != 1 || addrs[0] != svc.Spec.ClusterIP {
		t.Errorf("%s over TCP from the node: %v, %v; want [%s]", full, addrs, err, svc.Spec.ClusterIP)
	} else {
		t.Logf("%s over TCP from the node: %v", full, addrs)
	}
	lctx, lcancel = context.WithTimeout(ctx, 30*time.Second)
	addrs, err = r.LookupHost(lctx, "example.com.")
	lcancel()
	var dnsErr *net.DNSError
	if err == nil || !errors.As(err, &dnsErr) || dnsErr.IsTimeout {
		t.Errorf("example.com. from the cluster's DNS: %v, %v; want an answer without addresses (refused)", addrs, err)
	} else {
		t.Logf("example.com. from the cluster's DNS: %v", err)
	}

	// The `kubernetes` Service from a pod, verified with the pod's
	// service-account CA.
	out, err = podExec(ctx, t, c, ns, "client", contains("v1.36.3"), "/vmagent", "http", "--cacert", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
		"https://"+cluster.KubernetesIP+"/version")
	if err != nil || !strings.Contains(out, `"status":200`) || !strings.Contains(out, "v1.36.3") {
		t.Errorf("pod client -> https://%s/version: %q, %v", cluster.KubernetesIP, out, err)
	} else {
		t.Logf("pod client -> https://%s/version: %s", cluster.KubernetesIP, strings.TrimSpace(out))
	}
	podHardening(ctx, t, c, ns)
	if mem, err := c.VM.RunOK(ctx, "free", "-m"); err == nil {
		t.Logf("VM memory:\n%s", mem)
	}
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// podHardening: the chart's pod runs under containerd's RuntimeDefault
// seccomp profile with only NET_ADMIN and NET_RAW, and works there (its
// init container ran preflight, the agent programs IPVS over netlink and
// its rules with iptables-restore); and a container of the image as a
// non-root user, given the same capabilities, gets none of them (the
// runtime sets no ambient capabilities), which is why the DaemonSet runs
// as root.
func podHardening(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: cluster.IPVSProxyPods})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("ipvs-proxy's pods: %v, %v", pods, err)
	}
	if sc := pods.Items[0].Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("ipvs-proxy's pod securityContext %+v, want seccompProfile RuntimeDefault", sc)
	}
	status := agentStatus(ctx, t, c.VM)
	seccomp := regexp.MustCompile(`(?m)^Seccomp:\s*(\d)`).FindStringSubmatch(status)
	capEff := regexp.MustCompile(`(?m)^CapEff:\s*(\S+)`).FindStringSubmatch(status)
	if seccomp == nil || seccomp[1] != "2" || capEff == nil || capEff[1] != "0000000000003000" {
		t.Errorf("the agent's Seccomp %v (want 2, a filter) and CapEff %v (want 0000000000003000, NET_ADMIN and NET_RAW)", seccomp, capEff)
	}
	save, err := c.VM.RunOK(ctx, "iptables-save")
	if err != nil || !strings.Contains(save, ":IPVSP-") {
		t.Errorf("no IPVSP- chains from the agent's iptables-restore under the profile: %v\n%s", err, save)
	}

	capNetAdmin := regexp.MustCompile(`(?m)^capability CAP_NET_ADMIN\s+(\S+)`)
	for _, tc := range []struct {
		user int64
		want string
	}{{0, "OK"}, {65534, "FAIL"}} {
		name := fmt.Sprintf("preflight-uid-%d", tc.user)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				SecurityContext:               &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{
					Name: "preflight", Image: pods.Items[0].Spec.Containers[0].Image, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"/usr/local/bin/ipvs-proxy", "preflight"},
					SecurityContext: &corev1.SecurityContext{
						RunAsUser: ptr.To(tc.user), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}},
					},
				}},
			},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "pod "+name+" ended", func() (bool, string) {
			got, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed, cluster.PodSummary(got)
		}, c.KubeletLog)
		b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs of pod %s: %v", name, err)
		}
		m := capNetAdmin.FindStringSubmatch(string(b))
		if m == nil || m[1] != tc.want {
			t.Errorf("preflight as uid %d with NET_ADMIN and NET_RAW added: CAP_NET_ADMIN %v, want %s:\n%s", tc.user, m, tc.want, b)
		} else {
			t.Logf("preflight as uid %d with NET_ADMIN and NET_RAW added: %s", tc.user, strings.TrimSpace(capNetAdmin.FindString(string(b))))
		}
	}
}

// dnsBackend is a pod's port 53 as a real server in `ipvsadm -Ln`.
var dnsBackend = regexp.MustCompile(`-> 10\.244\.\d+\.\d+:53 `)

// podHit runs `vmagent hit` over TCP to addr (host:port; a name is
// resolved in the pod) n times in the pod and returns its result.
func podHit(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod, addr string, n int) nettest.HitResult {
	t.Helper()
	out, err := podExec(ctx, t, c, ns, pod, func(s string) bool { return json.Valid([]byte(s)) },
		"/vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", strconv.Itoa(n))
	if err != nil {
		t.Fatalf("hit %s from pod %s: %v: %s", addr, pod, err, out)
	}
	var hit nettest.HitResult
	if err := json.Unmarshal([]byte(out), &hit); err != nil {
		t.Fatalf("hit: %q: %v", out, err)
	}
	return hit
}

// runPods creates pods in ns and waits until each runs with an address
// (its kubelet's log, every node's, in the failure); it returns them, as
// they then were, by name.
func runPods(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, pods ...*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	for _, p := range pods {
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logs []func() string
	for _, n := range c.Nodes {
		logs = append(logs, n.KubeletLog)
	}
	running := map[string]*corev1.Pod{}
	for _, want := range pods {
		waitFor(ctx, t, "pod "+want.Name+" Running", func() (bool, string) {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			running[want.Name] = p
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", cluster.PodSummary(p)
		}, logs...)
		t.Logf("pod %s Running on %s (IP %s)", want.Name, running[want.Name].Spec.NodeName, running[want.Name].Status.PodIP)
	}
	return running
}

// agentPod is a pod of the test server image running argv.
// tcpReady is a readiness probe that connects to port every second: a
// test's server pod is Ready once it listens.
func tcpReady(port int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}},
		PeriodSeconds: 1,
	}
}

func agentPod(name string, argv []string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: name, Image: cluster.ServerImage, ImagePullPolicy: corev1.PullIfNotPresent, Command: argv,
			}},
		},
	}
}

// podExec runs argv in the pod's first container through the apiserver's
// exec subresource and returns stdout and stderr together, once ok accepts
// them. On a loaded machine an exec often comes back with the right exit
// status but its output empty (once replaced by NUL bytes): containerd
// 1.6.20's CRI exec path loses it, with or without the kubelet, the
// apiserver and the bed's egress in between, while containerd's own ctr
// loses none (TestClusterExecPaths, README). So an answer that ok rejects
// is tried again through the apiserver, up to 4 attempts, then with ctr
// in the VM in the same container (its network namespace, hence the same
// path to a Service), up to 4 more, each logged: at the loss rates
// measured under load (8-17 of 20), 8 attempts through the apiserver were
// not enough in a CI rehearsal at load average 6.
func podExec(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string, ok func(string) bool, argv ...string) (string, error) {
	t.Helper()
	return podExecTries(ctx, t, c, ns, pod, 4, ok, argv...)
}

// podExecAPIServer is podExec through the apiserver alone, up to 8
// attempts: for a check of that exec path itself.
func podExecAPIServer(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string, ok func(string) bool, argv ...string) (string, error) {
	t.Helper()
	return podExecTries(ctx, t, c, ns, pod, 8, ok, argv...)
}

// podExecTries makes 8 attempts, the first viaAPIServer through the
// apiserver and the rest with ctr, each failed one logged.
func podExecTries(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, pod string, viaAPIServer int, ok func(string) bool, argv ...string) (string, error) {
	t.Helper()
	var out string
	var err error
	for try := 1; try <= 8; try++ {
		how := "apiserver"
		if try <= viaAPIServer {
			out, err = podExecOnce(ctx, c, ns, pod, argv...)
		} else {
			how = "ctr"
			out, err = ctrExec(ctx, c, ns, pod, try, argv...)
		}
		if ok(out) {
			if how != "apiserver" {
				t.Logf("exec %q in pod %s, attempt %d through %s: answered", argv, pod, try, how)
			}
			return out, err
		}
		t.Logf("exec %q in pod %s, attempt %d through %s: unexpected output %.120q (%v)", argv, pod, try, how, out, err)
	}
	return out, err
}

// ctrExec runs argv in the pod's first container with ctr (ExecCtr).
func ctrExec(ctx context.Context, c *cluster.Cluster, ns, pod string, try int, argv ...string) (string, error) {
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ContainerID == "" {
		return "", fmt.Errorf("pod %s/%s has no container yet", ns, pod)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n := c.Node(p.Spec.NodeName)
	if n == nil {
		return "", fmt.Errorf("pod %s/%s is on no node of the cluster (%q)", ns, pod, p.Spec.NodeName)
	}
	return n.ExecCtr(ctx, id, fmt.Sprintf("e2e-%d-%d", time.Now().UnixNano(), try), argv...)
}

// contains is an output check for podExec.
func contains(sub string) func(string) bool {
	return func(out string) bool { return strings.Contains(out, sub) }
}

func podExecOnce(ctx context.Context, c *cluster.Cluster, ns, pod string, argv ...string) (string, error) {
	req := c.CP.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(c.CP.RESTConfig, "POST", req.URL())
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
	return out.String(), err
}

// waitFor polls cond every half second until it holds; it fails the test
// after 5 minutes with cond's last word (and more, from extra).
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string), extra ...func() string) {
	t.Helper()
	waitWithin(ctx, t, 5*time.Minute, what, cond, extra...)
}

// waitWithin is waitFor with another time limit.
func waitWithin(ctx context.Context, t *testing.T, limit time.Duration, what string, cond func() (bool, string), extra ...func() string) {
	t.Helper()
	waitEvery(ctx, t, limit, 500*time.Millisecond, what, cond, extra...)
}

// waitEvery is waitWithin asking cond every interval: a poll of a large
// kernel table takes CPU from the agent it waits for.
func waitEvery(ctx context.Context, t *testing.T, limit, interval time.Duration, what string, cond func() (bool, string), extra ...func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		ok, last := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s: not after %s: %s", what, limit, last)
			for _, f := range extra {
				msg += "\n" + tailLines(f(), 40)
			}
			t.Fatal(msg)
		case <-time.After(interval):
		}
	}
}

// clusterNamespace creates namespace ns and waits for its default
// ServiceAccount (the serviceaccount controller makes it), which pods
// need.
func clusterNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Deleted after the test (the namespace controller removes its pods,
	// in the background): the cluster may be shared with later tests.
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	waitFor(ctx, t, "ServiceAccount default in "+ns, func() (bool, string) {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
}
