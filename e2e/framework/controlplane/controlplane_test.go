package controlplane

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	undo := InterruptCleanup()
	code := m.Run()
	undo()
	os.Exit(code)
}

// skipOrFail skips when the control plane cannot be built or run here,
// unless CI=true, where that is a failure.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (a failure when CI=true)", args...)
}

func TestControlPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	t0 := time.Now()
	binDir, err := EnsureBinaries(ctx, CacheDir())
	if err != nil {
		skipOrFail(t, "cannot build the control-plane binaries: %v", err)
	}
	t.Logf("EnsureBinaries: %s (%s)", time.Since(t0).Round(time.Millisecond), binDir)

	t1 := time.Now()
	cp, err := Start(ctx, Options{WithControllerManager: true, Log: t.Logf, BinDir: binDir})
	if err != nil {
		skipOrFail(t, "cannot run the control plane: %v", err)
	}
	t.Logf("Start (etcd, kube-apiserver, kube-controller-manager): %s", time.Since(t1).Round(time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cp.Stop()
		}
	})
	c := cp.Client

	t.Run("kubeconfig", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v, err := kc.Discovery().ServerVersion()
		if err != nil {
			t.Fatalf("server version through %s: %v", cp.Kubeconfig, err)
		}
		if v.Major != "1" || !strings.HasPrefix(v.GitVersion, "v1.") {
			t.Errorf("server version %+v: want a stamped v1.x", v)
		}
		t.Logf("server version %s", v.GitVersion)

		other, err := clientcmd.Load(cp.KubeconfigFor("https://10.0.2.100:6443"))
		if err != nil {
			t.Fatal(err)
		}
		cl := other.Clusters[other.Contexts[other.CurrentContext].Cluster]
		if cl.Server != "https://10.0.2.100:6443" || !cl.InsecureSkipTLSVerify {
			t.Errorf("KubeconfigFor cluster = %+v", cl)
		}
		if got := other.AuthInfos[other.Contexts[other.CurrentContext].AuthInfo].Token; got != cp.AdminToken {
			t.Errorf("KubeconfigFor token = %q, want the admin token", got)
		}
	})

	t.Run("endpointslice from kcm", func(t *testing.T) {
		const ns, podIP = metav1.NamespaceDefault, "10.244.1.5"
		labels := map[string]string{"app": "web"}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
		if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node: %v", err)
		}
		dual := corev1.IPFamilyPolicyRequireDualStack
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
			Spec: corev1.ServiceSpec{
				Selector:       labels,
				IPFamilyPolicy: &dual,
				Ports:          []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		svc, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service: %v", err)
		}
		if len(svc.Spec.ClusterIPs) != 2 {
			t.Errorf("dual-stack service got ClusterIPs %v, want one per family", svc.Spec.ClusterIPs)
		}
		t.Logf("service web: ClusterIPs %v", svc.Spec.ClusterIPs)

		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{
				NodeName: node.Name,
				Containers: []corev1.Container{{
					Name:  "web",
					Image: "registry.invalid/web:1",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				}},
			},
		}
		pod, err = c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod: %v", err)
		}
		now := metav1.Now()
		pod.Status = corev1.PodStatus{
			Phase:     corev1.PodRunning,
			HostIP:    "192.0.2.10",
			PodIP:     podIP,
			PodIPs:    []corev1.PodIP{{IP: podIP}},
			StartTime: &now,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
		}
		if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update pod status: %v", err)
		}

		t2 := time.Now()
		deadline := time.Now().Add(time.Minute)
		for {
			eps, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
				LabelSelector: discoveryv1.LabelServiceName + "=web",
			})
			if err != nil {
				t.Fatalf("list endpointslices: %v", err)
			}
			if hasReadyEndpoint(eps.Items, podIP) {
				t.Logf("EndpointSlice with %s after %s", podIP, time.Since(t2).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no EndpointSlice with ready endpoint %s after 1m; slices: %+v", podIP, eps.Items)
			}
			time.Sleep(200 * time.Millisecond)
		}

		list, err := c.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list services: %v", err)
		}
		var names []string
		for _, s := range list.Items {
			names = append(names, s.Name)
		}
		if !slices.Contains(names, "kubernetes") || !slices.Contains(names, "web") {
			t.Errorf("services = %v, want kubernetes and web", names)
		}
	})

	t.Run("apiserver restart", func(t *testing.T) {
		cp.StopAPIServer()
		if _, err := c.Discovery().ServerVersion(); err == nil {
			t.Fatal("apiserver still answers after StopAPIServer")
		}
		t3 := time.Now()
		if err := cp.StartAPIServer(ctx); err != nil {
			t.Fatalf("StartAPIServer: %v", err)
		}
		t.Logf("kube-apiserver back after %s", time.Since(t3).Round(time.Millisecond))
		if _, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Errorf("get service after restart: %v", err)
		}
		if err := cp.StartAPIServer(ctx); err == nil {
			t.Error("second StartAPIServer succeeded, want an error")
		}
	})

	pids := cp.pids()
	if len(pids) != 3 {
		t.Fatalf("pids %v, want etcd, kube-apiserver and kube-controller-manager", pids)
	}
	t4 := time.Now()
	cp.Stop()
	stopped = true
	t.Logf("Stop: %s", time.Since(t4).Round(time.Millisecond))
	cp.Stop() // idempotent
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Stop (kill -0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(cp.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Stop (%v)", cp.Dir, err)
	}
	if err := cp.StartAPIServer(ctx); err == nil {
		t.Error("StartAPIServer after Stop succeeded, want an error")
	}
}

func hasReadyEndpoint(items []discoveryv1.EndpointSlice, ip string) bool {
	for _, s := range items {
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if ready && slices.Contains(ep.Addresses, ip) {
				return true
			}
		}
	}
	return false
}

// TestWithoutControllerManager checks the plain etcd + apiserver set-up with
// a single-stack Service range: Pods can be created (the default service
// account exists without the controller manager) and nothing makes slices.
func TestWithoutControllerManager(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{ServiceCIDR: "10.97.0.0/16", Log: t.Logf})
	if err != nil {
		skipOrFail(t, "cannot run the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	c := cp.Client
	if n := len(cp.pids()); n != 2 {
		t.Errorf("%d processes, want etcd and kube-apiserver", n)
	}

	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	if len(svc.Spec.ClusterIPs) != 1 || !strings.HasPrefix(svc.Spec.ClusterIP, "10.97.") {
		t.Errorf("ClusterIPs %v, want one from 10.97.0.0/16", svc.Spec.ClusterIPs)
	}
	_, err = c.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
}
