// Command demo shows ipvs-proxy at work on the bundled test bed (`make
// demo`): it starts a real kube-apiserver on this machine and a VM with
// Debian's kernel, runs `ipvs-proxy run` in the VM, creates a few example
// Services with backends in network namespaces, and prints the kernel's
// IPVS table and where a handful of requests went.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop() // before os.Exit, which runs no deferred call
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func logf(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) }

// example is one demo Service.
type example struct {
	name   string
	what   string
	mutate func(*corev1.Service)
}

var examples = []example{
	{"web", "ClusterIP, round robin", nil},
	{"web-nodeport", "NodePort on the node's address", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }},
	{"web-sh", "scheduler sh (source hashing) by annotation", func(s *corev1.Service) {
		s.Annotations = map[string]string{"ipvs-proxy.io/scheduler": "sh"}
	}},
	{"web-sticky", "session affinity ClientIP", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}},
}

func run(ctx context.Context) error {
	start := time.Now()
	step("preparing the test bed (first run: downloads Debian's kernel and QEMU, builds kube-apiserver; minutes)")
	assets, err := vm.EnsureAssets(ctx, vm.CacheDir(), logf)
	if err != nil {
		return err
	}
	step("starting kube-apiserver + etcd on 127.0.0.1, the VM, and ipvs-proxy in the VM")
	b, err := bed.Start(ctx, assets, bed.Options{Log: logf,
		AgentArgs: []string{"--nodeport-addresses", "10.0.2.0/24", "--min-sync-period", "100ms"}})
	if err != nil {
		return err
	}
	defer func() {
		step("shutting down")
		b.Close()
	}()

	step("starting three backends (network namespaces in the VM, answering with their name)")
	var bes []bed.Backend
	for i := 0; i < 3; i++ {
		be, err := b.AddBackend(ctx, bed.NodeName)
		if err != nil {
			return err
		}
		logf("%s at %s:%d", be.Name, be.Addr, bed.BackendPort)
		bes = append(bes, be)
	}

	step("creating Services and their EndpointSlices in namespace demo")
	if _, err := b.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var addrs []string
	for _, ex := range examples {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: ex.name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{bed.Port("http", corev1.ProtocolTCP, 80)}}}
		if ex.mutate != nil {
			ex.mutate(svc)
		}
		svc, err = b.Client.CoreV1().Services("demo").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if err := b.SetEndpoints(ctx, svc, discoveryv1.AddressTypeIPv4, bes); err != nil {
			return err
		}
		addr := fmt.Sprintf("%s:80", svc.Spec.ClusterIP)
		if svc.Spec.Type == corev1.ServiceTypeNodePort {
			addr = fmt.Sprintf("%s:%d", bed.NodeAddr, svc.Spec.Ports[0].NodePort)
		}
		logf("%-13s %-45s -> %s", ex.name, ex.what, addr)
		addrs = append(addrs, addr)
	}

	step("waiting for ipvs-proxy to program the kernel")
	var table string
	for deadline := time.Now().Add(time.Minute); ; {
		if table, err = b.IPVSTable(ctx); err != nil {
			return err
		}
		if countAll(table, addrs) && strings.Count(table, "Masq") >= 3*len(addrs) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the kernel did not get every Service in a minute:\n%s", table)
		}
		time.Sleep(200 * time.Millisecond)
	}
	step("the kernel's IPVS table (ipvsadm -Ln in the VM)")
	fmt.Print(indent(table))
	ranges, err := b.VM.RunOK(ctx, "ip", "-4", "route", "show", "table", "local", "dev", bed.Interface)
	if err != nil {
		return err
	}
	step("Service ranges routed as local through %s, every clusterIP in them (ip route show table local dev %s)", bed.Interface, bed.Interface)
	for _, l := range strings.Split(ranges, "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.Contains(f[1], "/") {
			fmt.Printf("    %s\n", f[1])
		}
	}
	vips, err := b.VM.RunOK(ctx, "ip", "-4", "-o", "addr", "show", "dev", bed.Interface)
	if err != nil {
		return err
	}
	step("virtual IPs bound to %s: externalIPs, LoadBalancer IPs (ip addr show dev %s)", bed.Interface, bed.Interface)
	for _, l := range strings.Split(vips, "\n") {
		if f := strings.Fields(l); len(f) >= 4 {
			fmt.Printf("    %s\n", f[3])
		}
	}

	step("six requests to each Service from a client network namespace (%s)", bed.ClientAddr)
	for i, ex := range examples {
		res, err := b.Hit(ctx, "tcp", addrs[i], 6)
		if err != nil {
			return err
		}
		fmt.Printf("    %-13s %-22s %s\n", ex.name, addrs[i], spread(res.Answers, res.Errors))
	}
	step("done in %v", time.Since(start).Round(time.Second))
	return nil
}

func countAll(table string, addrs []string) bool {
	for _, a := range addrs {
		if !strings.Contains(table, a) {
			return false
		}
	}
	return true
}

func spread(answers map[string]int, errs []string) string {
	keys := make([]string, 0, len(answers))
	for k := range answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, answers[k]))
	}
	if len(errs) > 0 {
		parts = append(parts, fmt.Sprintf("errors=%d", len(errs)))
	}
	return strings.Join(parts, " ")
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
