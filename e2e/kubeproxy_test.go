package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/kubeproxy"
)

// kubeProxy runs upstream kube-proxy (IPVS mode) in the VM in place of the
// agent for the rest of the test: the agent is stopped and its kernel
// state removed, so kube-proxy starts on a node of its own. When the test
// ends kube-proxy is stopped, its state removed (`ipvs-proxy cleanup
// --kube-proxy`) and the agent restarted; kube-proxy's log is printed if
// the test failed.
func (e env) kubeProxy(t *testing.T, opts kubeproxy.Options) *kubeproxy.KubeProxy {
	t.Helper()
	ctx := context.Background()
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	var kp *kubeproxy.KubeProxy
	t.Cleanup(func() {
		if kp != nil {
			if err := kp.Stop(); err != nil {
				t.Errorf("stop kube-proxy: %v", err)
			}
			if t.Failed() {
				t.Logf("kube-proxy's log:\n%s", tailLines(kp.Output(), 200))
			}
		}
		if out, err := kubeproxy.Cleanup(ctx, e.Bed); err != nil {
			t.Errorf("remove kube-proxy's state: %v\n%s", err, out)
		}
		e.expectNoKubeProxyState(t)
		if err := e.StartAgent(ctx); err != nil {
			t.Errorf("restart the agent: %v", err)
		}
	})
	if out, err := e.VM.RunOK(ctx, bed.GuestBinary, "cleanup"); err != nil {
		t.Fatalf("remove the agent's state: %v\n%s", err, out)
	}
	e.dropFinishedTests(t)
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	// Long enough for a cold build of kube-proxy on a fresh machine.
	sctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	var err error
	if kp, err = kubeproxy.Start(sctx, e.Bed, opts); err != nil {
		t.Fatal(err)
	}
	return kp
}

// dropFinishedTests deletes the Services and EndpointSlices of the
// namespaces of tests that have ended. The bed runs no namespace
// controller, so a deleted namespace keeps its objects, and kube-proxy,
// which rewrites everything on each sync, would carry them all: with the
// ~600 Services the chaos cases leave, its first sync took 2m42s and its
// later ones held up the takeover test. (The agent, stopped here, reads
// the smaller set when it starts again.)
func (e env) dropFinishedTests(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	nss, err := e.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list namespaces: %v", err)
	}
	svcs, namespaces := 0, 0
	for _, ns := range nss.Items {
		if ns.DeletionTimestamp == nil {
			continue
		}
		ss, err := e.Client.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list the Services of %s: %v", ns.Name, err)
		}
		for _, s := range ss.Items {
			if err := e.Client.CoreV1().Services(ns.Name).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("delete Service %s/%s: %v", ns.Name, s.Name, err)
			}
			svcs++
		}
		if err := e.Client.DiscoveryV1().EndpointSlices(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatalf("delete the EndpointSlices of %s: %v", ns.Name, err)
		}
		namespaces++
	}
	t.Logf("deleted the %d Services (and the slices) of %d ended tests' namespaces", svcs, namespaces)
}

// expectNoKubeProxyState checks that nothing of kube-proxy is left in the
// VM: no kube-ipvs0, no KUBE-* chains (both families) or sets.
func (e env) expectNoKubeProxyState(t *testing.T) {
	t.Helper()
	if e.vmOK("ip", "link", "show", kubeproxy.Interface) {
		t.Errorf("%s is still there", kubeproxy.Interface)
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(e.iptablesSave(t, tool), "\n") {
			if strings.Contains(l, "KUBE-") {
				t.Errorf("%s still has %q", tool, l)
			}
		}
	}
	if sets := e.vmRun(t, "ipset", "list", "-n"); strings.Contains(sets, "KUBE-") {
		t.Errorf("kube-proxy's sets are still there:\n%s", sets)
	}
}

// TestKubeProxyIPVSMode: upstream kube-proxy in IPVS mode serves a
// ClusterIP Service in the bed the way a user would check it: the
// clusterIP on kube-ipvs0, a virtual server with both backends as real
// servers, and connections from the client namespace reaching both. Once
// kube-proxy is stopped its state stays and goes on serving.
func TestKubeProxyIPVSMode(t *testing.T) {
	e := setup(t)
	kp := e.kubeProxy(t, kubeproxy.Options{})
	e.logGlueState(t) // before the cleanup of kube-proxy's state
	_, svc, bes := e.httpService(t, "kp", 2)
	ip := svc.Spec.ClusterIP
	addr := hostPort(ip, 80)
	vs := []string{"TCP  " + addr + " rr", "-> " + hostPort(bes[0].Addr, backendPort), "-> " + hostPort(bes[1].Addr, backendPort)}

	// kube-proxy syncs everything each time, execing iptables and ipset:
	// under emulation on a busy machine a sync can take half a minute.
	expectVIP := func(when string) {
		t.Helper()
		eventually(t, 2*time.Minute, func() error {
			out, err := e.VM.RunOK(context.Background(), "ip", "-o", "addr", "show", "dev", kubeproxy.Interface)
			if err != nil {
				return fmt.Errorf("%s: clusterIP %s not on %s: %w\n%s", when, ip, kubeproxy.Interface, err, out)
			}
			if !strings.Contains(out, " "+ip+"/32 ") {
				return fmt.Errorf("%s: clusterIP %s not on %s\n%s", when, ip, kubeproxy.Interface, out)
			}
			return nil
		})
	}
	expectVIP("kube-proxy running")
	e.expectTable(t, vs, nil)
	e.expectBackends(t, "tcp", addr, names(bes))

	if err := kp.Stop(); err != nil {
		t.Fatal(err)
	}
	if exited, _, err := kp.Exited(context.Background()); err != nil || !exited {
		t.Fatalf("kube-proxy still runs after Stop (%v)", err)
	}
	expectVIP("kube-proxy stopped")
	e.expectTable(t, vs, nil)
	e.expectBackends(t, "tcp", addr, names(bes))
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines ...]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
