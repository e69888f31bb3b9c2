package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
)

// staleRefusal (fmt: the holder's pod) is what a second agent on a node
// logs as it exits (proxier/nodelock): from another pod the holder's
// process is not visible; the holder names its pod itself.
const staleRefusal = "holds the lock @ipvs-proxy-agent in this network namespace: an ipvs-proxy agent (or cleanup) runs on this node (the holder: ipvs-proxy run %s, pod kube-system/%s,"

// staleAgent is issue 45's case 5, second part: while node-1's agent
// runs, a stale second agent is started there (a bare Pod pinned by
// nodeName with the DaemonSet's pod spec: host network, same image, same
// arguments, its preflight init container too), twice: first as the
// template is (its host ports declared, as the DaemonSet's pods have
// them: kubelet refuses it), then without the ports (a hand-made pod, a
// chart that lists none), which reaches the agent's lock. Each must end
// without running an agent beside the first: not restarted
// (restartPolicy Never), the second exiting non-zero with staleRefusal,
// not Ready once ended. While kubelet counts its container running, the
// pod may be Ready: its probes ask 127.0.0.1:10256 on the node's network,
// where the running agent answers (counted and reported). Meanwhile
// node-1's IPVS table and glue rules stay the same, its agent makes no
// netlink write and is not restarted, node-2 is untouched, and no
// connection fails.
func (b *nodesBed) staleAgent(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	before := b.kernels(t)
	own, other := b.untouched(t, n1), b.untouched(t, n2)
	agent := ipvsProxyPod(b.ctx, t, b.c, n1)
	restarts := restartCount(agent)
	tr := b.startTraffic(t, "stale", map[string]string{n1.Name: n1.IP, n2.Name: n2.IP})

	asIs := b.runStale(t, n1, "stale-agent-ports", true)
	began := time.Now()
	noPorts := b.runStale(t, n1, "stale-agent", false)
	refused := time.Since(began)
	refusal := fmt.Sprintf(staleRefusal, b.agentVersion(t, n1), agent.Name)
	if noPorts.exit == 0 || !strings.Contains(noPorts.log, refusal) {
		t.Errorf("the stale agent without host ports: exit %d, want non-zero with %q in its log:\n%s", noPorts.exit, refusal, noPorts.log)
	}
	time.Sleep(5 * time.Second) // traffic after the stale pods

	attempted, failed := tr.stop(t)
	b.sameKernels(t, before)
	ownWrites, otherWrites := own.check(b.ctx, t, b), other.check(b.ctx, t, b)
	restarted := b.agentRestarts(t, n1, restarts)
	if now := ipvsProxyPod(b.ctx, t, b.c, n1); now.UID != agent.UID {
		t.Errorf("%s's agent pod %s was replaced by %s", n1.Name, agent.Name, now.Name)
	}
	leaks := b.leaks(t)
	notes := fmt.Sprintf("a second agent pod on %s beside its agent %s: with the DaemonSet's host ports: %s; without: %s after %s (%q); "+
		"%s's agent %d writes, restarts %d; %s %d writes; IPVS tables and glue the same; %d Services",
		n1.Name, agent.Name, asIs, noPorts, refused.Round(100*time.Millisecond), lastLine(noPorts.log), n1.Name, ownWrites, restarted, n2.Name, otherWrites, b.size)
	peaks.record(t, chaos.Row{Case: "nodes-stale-agent", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: ownWrites + otherWrites, ConvergeSeconds: seconds(refused), Leaks: leaks, Notes: notes})
}

// staleEnd is how a stale agent pod ended: kubelet's reason for a pod it
// refused, or the agent container's exit code and log.
// readySeen counts the polls that found it Ready: kubelet probes a
// host-network pod's 127.0.0.1:10256, where the running agent answers.
type staleEnd struct {
	reason    string
	exit      int32
	ran       bool
	log       string
	readySeen int
}

func (s staleEnd) String() string {
	if !s.ran {
		return "refused by kubelet: " + s.reason
	}
	return fmt.Sprintf("the agent container exited %d (pod seen Ready by %d polls: its probes reach the running agent)", s.exit, s.readySeen)
}

// staleLimit bounds the wait for a stale agent pod's end: its preflight
// init container runs first, then the agent, which refuses. Up to 2,000
// Services 5 minutes; above, on the loaded emulated node, 2 minutes more
// per 1,000 (at 5,000 the refusal came 3m46s after the pod's creation in
// one run, and the preflight still ran after 5 minutes in the next).
func staleLimit(size int) time.Duration {
	return sizedLimit(size, 5*time.Minute, 2*time.Minute)
}

// runStale creates the stale agent pod name on n from the DaemonSet's pod
// template (its ports kept or dropped), waits until it has ended
// (staleLimit: its preflight runs first), checks it was never Ready and
// never restarted, deletes it and says how it ended.
func (b *nodesBed) runStale(t *testing.T, n *cluster.Node, name string, ports bool) staleEnd {
	t.Helper()
	api := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem)
	p := b.stalePod(t, n, name, ports)
	if _, err := api.Create(b.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := api.Delete(b.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Errorf("delete pod %s: %v", name, err)
		}
	}()
	readySeen := 0 // polls that found it Ready
	waitWithin(b.ctx, t, staleLimit(b.size), "stale agent pod "+name+" ended", func() (bool, string) {
		got, err := api.Get(b.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if podReady(got) && readySeen == 0 {
			t.Logf("stale agent pod %s Ready: %s", name, cluster.PodSummary(got))
		}
		if podReady(got) {
			readySeen++
		}
		p = got
		return got.Status.Phase == corev1.PodFailed || got.Status.Phase == corev1.PodSucceeded, cluster.PodSummary(got)
	}, func() string { return b.staleProgress(n, name) })
	end := staleEnd{reason: p.Status.Reason + ": " + p.Status.Message, readySeen: readySeen}
	if podReady(p) {
		t.Errorf("stale agent pod %s ended Ready: %s", name, cluster.PodSummary(p))
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.RestartCount != 0 {
			t.Errorf("stale agent pod %s: container %s restarted %d times", name, cs.Name, cs.RestartCount)
		}
		if cs.Name == "ipvs-proxy" && cs.State.Terminated != nil {
			end.ran, end.exit = true, cs.State.Terminated.ExitCode
		}
	}
	if end.ran {
		raw, err := api.GetLogs(name, &corev1.PodLogOptions{Container: "ipvs-proxy"}).DoRaw(b.ctx)
		end.log = strings.TrimSpace(string(raw))
		if err != nil {
			t.Errorf("stale agent pod %s: its log: %v", name, err)
		}
	}
	t.Logf("stale agent pod %s on %s (host ports declared: %v): %s; %s; log:\n%s", name, n.Name, ports, end, cluster.PodSummary(p), end.log)
	return end
}

// staleProgress says, when the stale pod has not ended in time, where its
// init container is: its log (the preflight's line of step times, once
// done) and the node's processes of the preflight and the tools it runs.
func (b *nodesBed) staleProgress(n *cluster.Node, name string) string {
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	raw, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).GetLogs(name, &corev1.PodLogOptions{Container: "preflight"}).DoRaw(ctx)
	procs, perr := n.VM.RunOK(ctx, "sh", "-c", `top -b -n 1 | grep -E 'Mem:|CPU:|Load|PID|preflight|iptables|ipset|modprobe'`)
	return fmt.Sprintf("preflight's log (%v):\n%s\n%s's processes (%v):\n%s", err, strings.TrimSpace(string(raw)), n.Name, perr, procs)
}

// stalePod is the DaemonSet's pod spec pinned to n as a bare Pod of its
// own labels (the DaemonSet must not adopt it), never restarted; with
// ports false its containers declare no ports (on a host-network pod each
// is a host port, which kubelet gives to one pod only).
func (b *nodesBed) stalePod(t *testing.T, n *cluster.Node, name string, ports bool) *corev1.Pod {
	t.Helper()
	ds, err := b.c.Client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(b.ctx, "ipvs-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec.DeepCopy()
	spec.NodeName = n.Name
	spec.RestartPolicy = corev1.RestartPolicyNever
	if !ports {
		for i := range spec.Containers {
			spec.Containers[i].Ports = nil
		}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "ipvs-proxy-stale"}}, Spec: *spec}
}

var buildVersion = regexp.MustCompile(`(?m)^ipvs_proxy_build_info\{(?:[^}]*,)?version="([^"]*)"`)

// agentVersion is the version n's agent reports (its build info metric).
func (b *nodesBed) agentVersion(t *testing.T, n *cluster.Node) string {
	t.Helper()
	res := b.agentHTTP(t, n, "http://127.0.0.1:10249/metrics")
	if m := buildVersion.FindStringSubmatch(res.Body); m != nil {
		return m[1]
	}
	t.Fatalf("%s: the agent's metrics have no ipvs_proxy_build_info with a version", n.Name)
	return ""
}
