package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// moveTimeline records what a test needs to explain a failure while
// endpoints change under traffic: the Service's EndpointSlices as the
// apiserver publishes them (host clock), the test's own steps, and one
// node's IPVS table for the VIP sampled every 300 ms (that node's clock,
// as the traffic's failures are); on failure, every node's IPVS
// connections and conntrack entries of the ports involved.
type moveTimeline struct {
	mu      sync.Mutex
	events  []string
	sampler *vm.Proc
	node    *cluster.Node
	c       *cluster.Cluster
}

func watchMove(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, service string, node *cluster.Node, vip string) *moveTimeline {
	t.Helper()
	tl := &moveTimeline{node: node, c: c}
	w, err := c.Client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		t.Fatalf("watch the EndpointSlices of %s/%s: %v", ns, service, err)
	}
	t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				tl.mark(fmt.Sprintf("slice watch %s: %v", ev.Type, ev.Object))
				continue
			}
			var eps []string
			for _, e := range s.Endpoints {
				eps = append(eps, fmt.Sprintf("%s(ready=%v serving=%v terminating=%v)", strings.Join(e.Addresses, ","),
					deref(e.Conditions.Ready), deref(e.Conditions.Serving), deref(e.Conditions.Terminating)))
			}
			tl.mark(fmt.Sprintf("slice %s %s: %s", s.Name, ev.Type, strings.Join(eps, " ")))
		}
	}()
	script := fmt.Sprintf(`prev=; while :; do cur=$(ipvsadm -Ln -t %s 2>&1 | tail -n +4 | tr -s ' ' | tr '\n' ';'); `+
		`if [ "$cur" != "$prev" ]; then echo "$(date +%%T.%%N | cut -c1-12) $cur"; prev=$cur; fi; sleep 0.3; done`, vip)
	if tl.sampler, err = node.VM.Start(ctx, "sh", "-c", script); err != nil {
		t.Fatalf("sample IPVS on %s: %v", node.Name, err)
	}
	t.Cleanup(func() { _ = tl.sampler.Stop() })
	// Cleanups run last first: this one while the sampler still runs,
	// after a t.Fatal too.
	t.Cleanup(func() {
		if t.Failed() {
			tl.show(t)
		}
	})
	return tl
}

func deref(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}

// mark records a step of the test at the host's time.
func (tl *moveTimeline) mark(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, time.Now().UTC().Format("15:04:05.000")+" "+what)
}

// show logs the timeline and the tail of the node's agent's log.
func (tl *moveTimeline) show(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tl.mu.Lock()
	t.Logf("timeline (host clock):\n%s", strings.Join(tl.events, "\n"))
	tl.mu.Unlock()
	if r, err := tl.node.VM.Run(ctx, "date", "-u", "+%T.%N"); err == nil {
		t.Logf("%s's clock reads %s at host %s", tl.node.Name, strings.TrimSpace(r.Stdout), time.Now().UTC().Format("15:04:05.000"))
	}
	t.Logf("IPVS on %s for the VIP, as it changed (node clock):\n%s", tl.node.Name, tl.sampler.Output())
	// Where each connection went, and in what state it is: a failed
	// attempt's own entry (its local port is in its error) lives on for
	// the state's timeout (a minute or two) after it ended.
	for _, n := range tl.c.Nodes {
		for _, argv := range [][]string{{"ipvsadm", "-Lnc"}, {"vmagent", "conntrack", "--port", "80"}, {"vmagent", "conntrack", "--port", "8080"}} {
			r, err := n.VM.Run(ctx, argv...)
			t.Logf("%s: %s (%v):\n%s%s", n.Name, strings.Join(argv, " "), err, r.Stdout, r.Stderr)
		}
	}
	pods, err := tl.c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		LabelSelector: cluster.IPVSProxyPods, FieldSelector: "spec.nodeName=" + tl.node.Name})
	if err != nil || len(pods.Items) == 0 {
		t.Logf("ipvs-proxy's pod on %s: %v", tl.node.Name, err)
		return
	}
	b, err := tl.c.Client.CoreV1().Pods(metav1.NamespaceSystem).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](120)}).DoRaw(ctx)
	t.Logf("ipvs-proxy's log on %s (last 120 lines, %v):\n%s", tl.node.Name, err, b)
}
