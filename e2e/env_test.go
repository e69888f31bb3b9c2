// Package e2e runs ipvs-proxy for real: the agent runs inside a QEMU VM with
// Debian's kernel, against a real kube-apiserver on the host, and tests
// connect through virtual IPs from a client network namespace to backends in
// namespaces of their own. One bed (VM + control plane + agent) serves the
// whole package; every test uses its own Kubernetes namespace, backends and
// addresses, so tests stay independent.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// Short names for the bed's constants.
const (
	nodeName     = bed.NodeName
	otherNode    = bed.OtherNode
	zone         = bed.Zone
	proxyIface   = bed.Interface
	nodeAddr     = bed.NodeAddr
	backendPort  = bed.BackendPort
	guestKubecfg = bed.GuestKubecfg
)

type backend = bed.Backend

// env wraps the shared bed with test helpers.
type env struct{ *bed.Bed }

// The bed is shared by the package's tests: started by the first test that
// needs it, stopped by TestMain.
var shared struct {
	once sync.Once
	bed  *bed.Bed
	err  error
}

func TestMain(m *testing.M) {
	undo := controlplane.InterruptCleanup()
	code := m.Run()
	if shared.bed != nil {
		shared.bed.Close()
	}
	closeOneNode()
	undo()
	os.Exit(code)
}

// agentArgs: node ports only on eth0; quick syncs so that tests are fast;
// a short full-resync period so that drift repair shows within a test.
// The backends' subnets (10.100.0.0/14, fd00:1xx::) are the cluster CIDR; the client
// namespace (10.250.0.2) is outside it.
var agentArgs = []string{"--nodeport-addresses", bed.NodePortCIDR, "--min-sync-period", "100ms",
	"--sync-period", "5s", "--ipvs-udp-timeout", "10s", "--log-level", "debug",
	"--cluster-cidr", bed.ClusterCIDR, "--healthz-bind-address", "0.0.0.0:10256",
	"--metrics-bind-address", "0.0.0.0:10249"}

// bedLog logs the bed's progress; the bed outlives any one test, so it
// cannot log through t.
func bedLog(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bed: "+format+"\n", args...)
}

// setup returns the shared bed, starting it on first use.
func setup(t *testing.T) env {
	t.Helper()
	assets := vm.Require(t) // skips, or fails with CI=true, without a bed
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		shared.bed, shared.err = bed.Start(ctx, assets, bed.Options{
			Log: bedLog, Packages: []string{"github.com/ipvs-proxy/ipvs-proxy/e2e/guest/vmkube"}, TestPackages: kernelTestPackages, AgentArgs: agentArgs,
		})
	})
	if shared.err != nil {
		t.Fatalf("start the test bed: %v", shared.err)
	}
	return env{shared.bed}
}

// namespace creates a Kubernetes namespace for the test, deleted after it.
func (e env) namespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	// A generated suffix: without the namespace controller a deleted
	// namespace lingers, and -count=N runs the same test again.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}
	created, err := e.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().Namespaces().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}

// backends starts n backends, on this node unless nodes says otherwise.
func (e env) backends(t *testing.T, n int, nodes ...string) []backend {
	t.Helper()
	var out []backend
	for i := 0; i < n; i++ {
		node := nodeName
		if i < len(nodes) {
			node = nodes[i]
		}
		be, err := e.AddBackend(context.Background(), node)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = be.Stop() })
		out = append(out, be)
	}
	return out
}

// hit connects n times from the client namespace to addr.
func (e env) hit(t *testing.T, proto, addr string, n int) nettest.HitResult {
	t.Helper()
	res, err := e.Hit(context.Background(), proto, addr, n)
	if err != nil {
		t.Fatalf("hit %s %s: %v", proto, addr, err)
	}
	return res
}

// ipvsadm returns `ipvsadm -Ln ARGS` of the VM.
func (e env) ipvsadm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.IPVSTable(context.Background(), args...)
	if err != nil {
		t.Fatalf("ipvsadm: %v", err)
	}
	return out
}

// eventually retries check until it succeeds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
