package e2e

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
)

// glueOutage is how long iptables-restore fails in case 3.
const glueOutage = 3 * time.Minute

// glueResync bounds the glue's repair after the mend: one retry of the
// failed glue sync, whose backoff grows to the shipped syncPeriod (30 s),
// and the sync itself under emulation.
const glueResync = 40 * time.Second

// strayRule is drift in ipvs-proxy's own nat chain that only a restore
// repairs: a rule that matches no packet (a TEST-NET-1 source nothing on
// the segment has).
var strayRule = []string{"-t", "nat", "-I", "IPVSP-POSTROUTING", "1", "-s", "192.0.2.45/32",
	"-m", "comment", "--comment", "TestChaosNodes", "-j", "RETURN"}

// failRestoreScript (fmt: the agent's PID on the node) makes every
// iptables-restore of the agent's container fail, without a hostPath and
// with the container's root file system left read-only: /usr/sbin's
// entries are copied into the container's /tmp (an emptyDir), the
// restore tools there replaced by a script that fails, and that copy is
// bind-mounted over /usr/sbin in the container's mount namespace (entered
// with busybox's nsenter, chrooted to the container's root: the runtime
// runs without pivot_root). iptables-save and the rest keep working.
const failRestoreScript = `set -e
R=/proc/%[1]d/root
F=$R/tmp/chaos-fault
mkdir -p $F
cp -a $R/usr/sbin $F/
cp /bin/busybox $F/busybox
printf '#!/tmp/chaos-fault/busybox sh\necho "$0: failing on purpose (TestChaosNodes)" >&2\nexit 1\n' >$F/fail
chmod 755 $F/fail
for t in iptables ip6tables; do for b in '' -nft -legacy; do rm -f $F/sbin/$t$b-restore; ln -s /tmp/chaos-fault/fail $F/sbin/$t$b-restore; done; done
nsenter -t %[1]d -m -r -- /tmp/chaos-fault/busybox mount --bind /tmp/chaos-fault/sbin /usr/sbin
`

// mendRestoreScript undoes failRestoreScript.
const mendRestoreScript = `set -e
nsenter -t %[1]d -m -r -- /tmp/chaos-fault/busybox umount -l /usr/sbin
rm -rf /proc/%[1]d/root/tmp/chaos-fault
`

// persistentGlueFailure is issue 45's case 3: iptables-restore fails in
// node-1's agent container for glueOutage while the glue has drift to
// repair (strayRule). Through it and after: no connection fails on either
// node; the failure is reported (ipvs_proxy_node_sync_failing, /healthz,
// a NodeSyncFailed Event on the Node); the agent is not restarted; node-2
// writes nothing. After the mend the glue's rules are those it had before
// the fault within glueResync, and both kernels hold what the Services
// want (IPVS, addresses, sets), nothing leaked.
func (b *nodesBed) persistentGlueFailure(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	tool := b.glueTool(t, n1)
	want := b.glueRules(t, n1, tool)
	agent := ipvsProxyPod(b.ctx, t, b.c, n1)
	restarts := restartCount(agent)
	other := b.untouched(t, n2)
	writes := b.writes(t, n1)
	tr := b.startTraffic(t, "glue", map[string]string{n1.Name: n1.IP, n2.Name: n2.IP})

	faulted := time.Now()
	t.Cleanup(func() { b.logAgent(t, n1, faulted, "glue", "iptables", "sync failed", "healthz") })
	mend := b.failRestore(t, n1, agent)
	if out, err := n1.VM.RunOK(b.ctx, append([]string{tool}, strayRule...)...); err != nil {
		t.Fatalf("%s: stray rule: %v: %s", n1.Name, err, out)
	}
	seen := b.watchGlueFailure(t, n1, tool, restarts)
	if err := mend(); err != nil {
		t.Fatal(err) // nothing after it can pass; the next case needs a whole agent
	}
	mended := time.Now()
	waitWithin(b.ctx, t, 5*time.Minute, n1.Name+"'s glue rules as before the fault", func() (bool, string) {
		missing, extra := lineDiff(want, b.glueRules(t, n1, tool))
		return len(missing)+len(extra) == 0, fmt.Sprintf("missing %s; extra %s", sample(missing), sample(extra))
	})
	whole := time.Since(mended)
	if whole > glueResync {
		t.Errorf("%s: the glue's rules were whole %s after the mend; want within %s (one retry of the glue's sync)", n1.Name, whole.Round(time.Millisecond), glueResync)
	}
	waitWithin(b.ctx, t, 2*time.Minute, n1.Name+" healthy again", func() (bool, string) {
		h := b.agentHTTP(t, n1, "http://127.0.0.1:10256/healthz")
		failing := b.metric(t, n1, `ipvs_proxy_node_sync_failing{part="iptables glue"}`)
		return h.Status == 200 && failing == 0 && b.nodeEvent(t, n1, "NodeSyncRecovered", "", mended) != nil,
			fmt.Sprintf("healthz %d %s; failing %v", h.Status, h.Body, failing)
	})
	recovered := time.Since(mended)
	attempted, failed := tr.stop(t)
	restarted := b.agentRestarts(t, n1, restarts)
	otherWrites := other.check(b.ctx, t, b)
	leaks := b.leaks(t)
	ownWrites := int(b.writes(t, n1) - writes)
	notes := fmt.Sprintf("iptables-restore failing in %s's agent container for %s (%s); reported: metric after %s, Event after %s, /healthz 503 after %s, pod unready after %s; "+
		"restarts %d; glue rules whole %s after the mend, healthy again after %s; %s untouched (%d writes); %d Services",
		n1.Name, glueOutage, tool, seen.metric, seen.event, seen.healthz, seen.unready, restarted, whole.Round(time.Second), recovered.Round(time.Second),
		n2.Name, otherWrites, b.size)
	peaks.record(t, chaos.Row{Case: "nodes-glue-restore-fails", TrafficAttempted: attempted, TrafficFailed: failed,
		KernelWrites: ownWrites, ConvergeSeconds: math.Round(whole.Seconds()*10) / 10, Leaks: leaks, Notes: notes})
}

// glueSeen is when each report of the glue's failure was first seen,
// from the fault's start.
type glueSeen struct{ metric, event, healthz, unready time.Duration }

// watchGlueFailure polls n1 every 10 s for glueOutage: the stray rule
// must stay (no restore succeeds), the agent must not restart, and the
// metric, an Event and /healthz must report the glue failing, /healthz
// stay 503 once it is, kubelet mark the agent unready (readiness is
// /healthz) and /livez stay 200 (liveness: no restart).
func (b *nodesBed) watchGlueFailure(t *testing.T, n1 *cluster.Node, tool string, restarts int32) glueSeen {
	t.Helper()
	began := time.Now()
	var seen glueSeen
	first := func(d *time.Duration, ok bool) {
		if ok && *d == 0 {
			*d = time.Since(began).Round(time.Second)
		}
	}
	for time.Since(began) < glueOutage {
		time.Sleep(10 * time.Second)
		if !slices.ContainsFunc(b.glueRules(t, n1, tool), func(l string) bool { return strings.Contains(l, "192.0.2.45") }) {
			t.Fatalf("%s: the stray rule is gone after %s: a restore succeeded, the fault did not hold", n1.Name, time.Since(began))
		}
		failing := b.metric(t, n1, `ipvs_proxy_node_sync_failing{part="iptables glue"}`)
		if seen.metric != 0 && failing != 1 {
			t.Errorf("%s: ipvs_proxy_node_sync_failing{part=\"iptables glue\"} %v %s into the fault, after 1 from %s", n1.Name, failing,
				time.Since(began).Round(time.Second), seen.metric)
		}
		first(&seen.metric, failing == 1)
		h := b.agentHTTP(t, n1, "http://127.0.0.1:10256/healthz")
		if seen.healthz != 0 && h.Status != 503 {
			t.Errorf("%s: /healthz %d %s %s into the fault, after 503 from %s: the failure must stay reported until mended",
				n1.Name, h.Status, h.Body, time.Since(began).Round(time.Second), seen.healthz)
		}
		first(&seen.healthz, h.Status == 503 && strings.Contains(h.Body, "iptables glue"))
		if l := b.agentHTTP(t, n1, "http://127.0.0.1:10256/livez"); l.Status != 200 {
			t.Errorf("%s: /livez %d %s into the fault; want 200 (a restart cannot mend iptables-restore)", n1.Name, l.Status, l.Body)
		}
		if seen.event == 0 {
			first(&seen.event, b.nodeEvent(t, n1, "NodeSyncFailed", "iptables glue", began) != nil)
		}
		p := ipvsProxyPod(b.ctx, t, b.c, n1)
		first(&seen.unready, !podReady(p))
		if restartCount(p) != restarts {
			t.Errorf("%s: the agent restarted %s into the fault: %s", n1.Name, time.Since(began).Round(time.Second), cluster.PodSummary(p))
		}
	}
	t.Logf("%s: %s of failing restores: metric after %s, Event after %s, /healthz 503 after %s, unready after %s (0: never)",
		n1.Name, glueOutage, seen.metric, seen.event, seen.healthz, seen.unready)
	for what, d := range map[string]time.Duration{"ipvs_proxy_node_sync_failing{part=\"iptables glue\"}": seen.metric,
		"a NodeSyncFailed Event naming the iptables glue": seen.event, "/healthz 503 naming the iptables glue": seen.healthz,
		"unready agent pod (its readiness probe is /healthz)": seen.unready} {
		if d == 0 {
			t.Errorf("%s: in %s of failing restores, no %s", n1.Name, glueOutage, what)
		}
	}
	return seen
}

// mendTimeout bounds the mend: a umount and a removal.
const mendTimeout = time.Minute

// failRestore makes iptables-restore fail in the agent's container on n
// (failRestoreScript), checks that it does there while iptables-save
// works, and returns the mend (run once; later calls return nil), also
// registered as a cleanup.
func (b *nodesBed) failRestore(t *testing.T, n *cluster.Node, agent *corev1.Pod) (mend func() error) {
	t.Helper()
	if len(agent.Status.ContainerStatuses) == 0 {
		t.Fatalf("%s: no ipvs-proxy container: %s", n.Name, cluster.PodSummary(agent))
	}
	id := strings.TrimPrefix(agent.Status.ContainerStatuses[0].ContainerID, "containerd://")
	pid, err := n.TaskPID(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := n.VM.RunOK(b.ctx, "sh", "-c", fmt.Sprintf(failRestoreScript, pid)); err != nil {
		t.Fatalf("%s: break iptables-restore: %v: %s", n.Name, err, out)
	}
	mended := false
	mend = func() error {
		if mended {
			return nil
		}
		mended = true
		ctx, cancel := context.WithTimeout(b.ctx, mendTimeout)
		defer cancel()
		if out, err := n.VM.RunOK(ctx, "sh", "-c", fmt.Sprintf(mendRestoreScript, pid)); err != nil {
			return fmt.Errorf("%s: mend iptables-restore: %w: %s", n.Name, err, out)
		}
		return nil
	}
	t.Cleanup(func() { // also when the case fails: the next one needs a whole agent
		if err := mend(); err != nil {
			t.Error(err)
		}
	})
	out, err := n.ExecCtr(b.ctx, id, "chaos-restore", "/usr/sbin/iptables-nft-restore", "--noflush")
	if err == nil || !strings.Contains(out, "failing on purpose") {
		t.Fatalf("%s: iptables-nft-restore in the agent's container: %q, %v; want the failing script", n.Name, out, err)
	}
	if out, err := n.ExecCtr(b.ctx, id, "chaos-save", "/usr/sbin/iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(out, "IPVSP-") {
		t.Fatalf("%s: iptables-nft-save in the agent's container: %v: %s", n.Name, err, out)
	}
	t.Logf("%s: iptables-restore fails in the agent's container (pid %d): %s", n.Name, pid, strings.TrimSpace(out))
	return mend
}

// glueTool is the iptables command of the backend holding the agent's
// rules on n (iptables-nft or iptables-legacy).
func (b *nodesBed) glueTool(t *testing.T, n *cluster.Node) string {
	t.Helper()
	for _, tool := range []string{"iptables-nft", "iptables-legacy"} {
		if out, err := n.VM.RunOK(b.ctx, tool+"-save", "-t", "nat"); err == nil && strings.Contains(out, ":IPVSP-POSTROUTING") {
			return tool
		}
	}
	t.Fatalf("%s: no iptables backend holds ipvs-proxy's chains", n.Name)
	return ""
}

var saveCounters = regexp.MustCompile(`\[\d+:\d+\]`)

// glueRules are the lines of tool's save on n that are ipvs-proxy's
// (ownGlueLines).
func (b *nodesBed) glueRules(t *testing.T, n *cluster.Node, tool string) []string {
	t.Helper()
	out, err := n.VM.RunOK(b.ctx, tool+"-save")
	if err != nil {
		t.Fatalf("%s: %s-save: %v", n.Name, tool, err)
	}
	return ownGlueLines(out)
}

// ownGlueLines are the lines of an iptables-save that are ipvs-proxy's
// (chains IPVSP-*, their rules and the jumps to them), each prefixed with
// its table, without counters, sorted.
func ownGlueLines(save string) []string {
	var lines []string
	table := ""
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l
		case strings.Contains(l, "IPVSP-"):
			lines = append(lines, table+" "+saveCounters.ReplaceAllString(l, ""))
		}
	}
	slices.Sort(lines)
	return lines
}

// nodeEvent is nodeEventOf on n.
func (b *nodesBed) nodeEvent(t *testing.T, n *cluster.Node, reason, msg string, since time.Time) *corev1.Event {
	t.Helper()
	return nodeEventOf(b.ctx, t, b.c.Client, n.Name, reason, msg, since)
}

// nodeEventOf is the newest Event of reason on Node node whose message
// contains msg, last seen after since (less a minute: the agent's clock is
// the node VM's), or nil.
func nodeEventOf(ctx context.Context, t *testing.T, cs kubernetes.Interface, node, reason, msg string, since time.Time) *corev1.Event {
	t.Helper()
	list, err := cs.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var found *corev1.Event
	for i, e := range list.Items {
		if !strings.Contains(e.Message, msg) || e.LastTimestamp.Time.Before(since.Add(-time.Minute)) {
			continue
		}
		if found == nil || e.LastTimestamp.After(found.LastTimestamp.Time) {
			found = &list.Items[i]
		}
	}
	return found
}

// restartCount is the restarts of p's first container.
func restartCount(p *corev1.Pod) int32 {
	if len(p.Status.ContainerStatuses) == 0 {
		return 0
	}
	return p.Status.ContainerStatuses[0].RestartCount
}
