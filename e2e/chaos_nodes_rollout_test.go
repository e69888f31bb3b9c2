package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// rolloutAnnotation is the pod-template annotation case 5 changes: a new
// revision of the DaemonSet with the same image, as an upgrade that only
// changes the template makes.
const rolloutAnnotation = "ipvs-proxy.io/chaos-revision"

// rolloutLimit bounds one rollout of both nodes, one node at a time
// (maxUnavailable 1): per node the old pod's end, the new pod's sandbox,
// its preflight init container, the agent's start, its lists of the
// Services and first sync before /healthz answers 200 (readiness). Under
// emulation on a loaded machine (load average 9-11) that was 4-5
// minutes a node at 300 Services (the preflight alone about a minute)
// and 16m34s for both at 2,000 (run 14). Above 2,000 each node's lists
// and first sync grow with the Services (5,000 were programmed 1m24s
// after their creation on node-1, run of 656006f): 3 minutes more per
// 1,000.
func rolloutLimit(size int) time.Duration {
	return sizedLimit(size, 20*time.Minute, 3*time.Minute)
}

// sizedLimit is base up to 2,000 Services (issue 45's size, where the
// chaos bounds were set) and perThousand more for each 1,000 above: the
// waits whose work grows with the Services on a loaded emulated node.
func sizedLimit(size int, base, perThousand time.Duration) time.Duration {
	if size <= 2000 {
		return base
	}
	return base + time.Duration(size-2000)*perThousand/1000
}

// agentLockLine is the agent's lock in /proc/net/unix: held while an
// agent runs on the node (proxier/nodelock).
const agentLockLine = "@ipvs-proxy-agent$"

// agentRollout is issue 45's case 5, first part: under the live traffic
// and 20 held connections (from each node's host to the clusterIP and
// from the outside host to the LoadBalancer IP and node-2's node port),
// the ipvs-proxy DaemonSet rolls to a new revision (rolloutAnnotation) on
// both nodes, then back as `kubectl rollout undo` does (the previous
// ControllerRevision's template patched in). No connection fails, no held
// one breaks; each node's IPVS table and the glue's rules are the same
// after as before (the old agent's SIGTERM leaves them; the new one adopts
// them); each new agent makes 0 netlink writes and is not restarted; the
// time each node was without an agent (its lock unheld) is reported.
func (b *nodesBed) agentRollout(t *testing.T) {
	peaks := startPeaks(b.ctx, t, nodeVMs(b.c))
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	before := b.kernels(t)
	tr := b.startTraffic(t, "rollout", map[string]string{n1.Name: n1.IP, n2.Name: n2.IP})
	holds := b.holdLive(t, 42000)
	locks := b.watchLocks(t)
	out := b.rollDaemonSet(t, "rollout", func(*appsv1.DaemonSet) []byte {
		return []byte(fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{%q:"2"}}}}}`, rolloutAnnotation))
	})
	back := b.rollDaemonSet(t, "rollback", b.undoPatch(t))
	gaps := locks.stop()
	time.Sleep(2 * time.Second) // traffic after the rollback

	broken := stopHolds(t, holds)
	attempted, failed := tr.stop(t)
	b.sameKernels(t, before)
	leaks := b.leaks(t)
	var gapNotes []string
	for _, n := range b.c.Nodes {
		g := gaps[n.Name]
		gapNotes = append(gapNotes, fmt.Sprintf("%s %s (%d gaps, longest %s)", n.Name, g.total.Round(100*time.Millisecond), g.count, g.longest.Round(100*time.Millisecond)))
		if g.count != 2 {
			t.Errorf("%s was without an agent %d times in a rollout and a rollback; want 2 (one handover each): %s", n.Name, g.count, g)
		}
	}
	notes := fmt.Sprintf("DaemonSet rolled (template annotation) %s, rolled back %s; held 20, broken %d; writes of the new agents: rollout %v, rollback %v; "+
		"restarts %d; without an agent: %s; IPVS tables and glue the same after; %d Services",
		out.took.Round(time.Second), back.took.Round(time.Second), broken, out.writes, back.writes, out.restarts+back.restarts,
		strings.Join(gapNotes, ", "), b.size)
	peaks.record(t, chaos.Row{Case: "nodes-agent-rollout", TrafficAttempted: attempted + 20, TrafficFailed: failed + broken,
		KernelWrites: sumWrites(out.writes) + sumWrites(back.writes), ConvergeSeconds: seconds(max(out.took, back.took)), Leaks: leaks, Notes: notes})
}

// nodeKernel is what a handover must leave alone on a node: its IPVS
// table and the glue's rules.
type nodeKernel struct{ ipvs, glue []string }

// kernels reads each node's IPVS table and glue rules.
func (b *nodesBed) kernels(t *testing.T) map[string]nodeKernel {
	t.Helper()
	out := map[string]nodeKernel{}
	for _, n := range b.c.Nodes {
		out[n.Name] = nodeKernel{ipvs: ipvsLines(b.ctx, t, n), glue: b.glueRules(t, n, b.glueTool(t, n))}
	}
	return out
}

// sameKernels fails the test for each node whose IPVS table or glue
// rules differ from before.
func (b *nodesBed) sameKernels(t *testing.T, before map[string]nodeKernel) {
	t.Helper()
	for name, now := range b.kernels(t) {
		if missing, extra := lineDiff(before[name].ipvs, now.ipvs); len(missing)+len(extra) > 0 {
			t.Errorf("%s's IPVS table changed: lines gone %s; new %s", name, sample(missing), sample(extra))
		}
		if missing, extra := lineDiff(before[name].glue, now.glue); len(missing)+len(extra) > 0 {
			t.Errorf("%s's glue rules changed: lines gone %s; new %s", name, sample(missing), sample(extra))
		}
	}
}

// holdLive holds 20 connections to the live Service, 5 from each of:
// node-1's and node-2's hosts to the clusterIP, the outside host to the
// LoadBalancer IP and to node-2's node port; source ports from first on,
// 100 apart.
func (b *nodesBed) holdLive(t *testing.T, first int) []*vm.Proc {
	t.Helper()
	n1, n2 := b.c.Nodes[0], b.c.Nodes[1]
	return []*vm.Proc{
		b.holdConns(t, n1.VM, b.clusterIP(), first),
		b.holdConns(t, n2.VM, b.clusterIP(), first+100),
		b.holdConns(t, b.c.Outside, b.lbIP(), first+200),
		b.holdConns(t, b.c.Outside, b.nodePort(n2.IP), first+300),
	}
}

// holdConns holds 5 connections from v to addr from the source ports
// first on, each asking every 500 ms, and waits until each has answered.
func (b *nodesBed) holdConns(t *testing.T, v *vm.VM, addr string, first int) *vm.Proc {
	t.Helper()
	return holdConnections(b.ctx, t, v, addr, first, 5, 500*time.Millisecond)
}

// stopHolds stops the held connections and returns how many broke (an
// error before the stop), each one an error of the test.
func stopHolds(t *testing.T, holds []*vm.Proc) (broken int) {
	t.Helper()
	for _, p := range holds {
		_ = p.Stop()
		for port, out := range splitHolds(p.Output()) {
			if strings.Contains(out, "error ") {
				broken++
				t.Errorf("held connection from port %d broke after %d answers: %q", port, strings.Count(out, "answer "), lastLine(out))
			}
		}
	}
	return broken
}

// rolled is one rollout's figures: its time, and each node's new agent's
// netlink writes once Ready; restarts of the new agents.
type rolled struct {
	took     time.Duration
	writes   map[string]int
	restarts int32
}

func sumWrites(w map[string]int) int {
	s := 0
	for _, v := range w {
		s += v
	}
	return s
}

// rollDaemonSet patches the DaemonSet (strategic merge, the patch made
// from it by patch) and waits until every node runs a new, Ready agent
// pod and the old ones are gone, as `kubectl rollout status` does; each
// new agent must have made 0 netlink writes (it adopts the kernel's
// state) and not restarted.
func (b *nodesBed) rollDaemonSet(t *testing.T, what string, patch func(*appsv1.DaemonSet) []byte) rolled {
	t.Helper()
	api := b.c.Client.AppsV1().DaemonSets(metav1.NamespaceSystem)
	ds, err := api.Get(b.ctx, "ipvs-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]bool{}
	for _, n := range b.c.Nodes {
		old[ipvsProxyPod(b.ctx, t, b.c, n).Name] = true
	}
	began := time.Now()
	if ds, err = api.Patch(b.ctx, ds.Name, types.StrategicMergePatchType, patch(ds), metav1.PatchOptions{}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	// On a timeout, each node's kubelet and containerd: a pod the runtime
	// could not stop (run 13: KillPodSandbox past its deadline for 20
	// minutes on the loaded node-2) is theirs to tell.
	var logs []func() string
	for _, n := range b.c.Nodes {
		logs = append(logs, func() string { return n.Name + "'s kubelet:\n" + tailLines(n.KubeletLog(), 39) },
			func() string { return n.Name + "'s containerd:\n" + tailLines(n.ContainerdLog(), 39) })
	}
	waitWithin(b.ctx, t, rolloutLimit(b.size), "DaemonSet ipvs-proxy's "+what+" on every node", func() (bool, string) {
		return b.rolledOut(t, ds.Generation, old)
	}, logs...)
	out := rolled{took: time.Since(began), writes: map[string]int{}}
	var pods []string
	for _, n := range b.c.Nodes {
		p := ipvsProxyPod(b.ctx, t, b.c, n)
		pods = append(pods, p.Name)
		out.writes[n.Name] = int(b.writes(t, n))
		out.restarts += restartCount(p)
		if w := out.writes[n.Name]; w != 0 {
			t.Errorf("%s: %s's new agent %s made %d netlink writes; want 0 (nothing changed: it adopts the kernel's state)", what, n.Name, p.Name, w)
		}
		if restartCount(p) != 0 {
			t.Errorf("%s: %s's new agent restarted: %s%s", what, n.Name, cluster.PodSummary(p), lastTermination(p))
		}
	}
	t.Logf("%s: every node runs a new Ready agent (%s) %s after the patch; their writes %v", what, strings.Join(pods, ", "),
		out.took.Round(100*time.Millisecond), out.writes)
	return out
}

// rolledOut reports whether the DaemonSet's generation gen is rolled out:
// observed, every scheduled pod updated and available, one Ready pod on
// each node and none of old left.
func (b *nodesBed) rolledOut(t *testing.T, gen int64, old map[string]bool) (bool, string) {
	t.Helper()
	ds, err := b.c.Client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(b.ctx, "ipvs-proxy", metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	st := ds.Status
	if st.ObservedGeneration < gen || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
		st.NumberAvailable != st.DesiredNumberScheduled || st.DesiredNumberScheduled != int32(len(b.c.Nodes)) {
		return false, fmt.Sprintf("status %+v", st)
	}
	pl, err := b.c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(b.ctx, metav1.ListOptions{LabelSelector: cluster.IPVSProxyPods})
	if err != nil {
		return false, err.Error()
	}
	var state []string
	done := len(pl.Items) == len(b.c.Nodes)
	for i := range pl.Items {
		p := &pl.Items[i]
		state = append(state, cluster.PodSummary(p))
		done = done && !old[p.Name] && p.DeletionTimestamp == nil && podReady(p)
	}
	return done, strings.Join(state, "; ")
}

// undoPatch makes the patch `kubectl rollout undo` applies to a
// DaemonSet: the data of its previous ControllerRevision (the one below
// the newest), a strategic merge patch that replaces the pod template.
func (b *nodesBed) undoPatch(t *testing.T) func(*appsv1.DaemonSet) []byte {
	return func(ds *appsv1.DaemonSet) []byte {
		t.Helper()
		list, err := b.c.Client.AppsV1().ControllerRevisions(metav1.NamespaceSystem).List(b.ctx, metav1.ListOptions{
			LabelSelector: metav1.FormatLabelSelector(ds.Spec.Selector)})
		if err != nil {
			t.Fatal(err)
		}
		var own []appsv1.ControllerRevision
		for _, r := range list.Items {
			if ref := metav1.GetControllerOf(&r); ref != nil && ref.UID == ds.UID {
				own = append(own, r)
			}
		}
		if len(own) < 2 {
			t.Fatalf("DaemonSet ipvs-proxy has %d ControllerRevisions; want 2 to roll back", len(own))
		}
		slices.SortFunc(own, func(x, y appsv1.ControllerRevision) int { return int(x.Revision - y.Revision) })
		prev := own[len(own)-2]
		t.Logf("rollback to ControllerRevision %s (revision %d of %d)", prev.Name, prev.Revision, own[len(own)-1].Revision)
		return prev.Data.Raw
	}
}

// lockGap is a node's time without an agent: in all, how many times,
// the longest.
type lockGap struct {
	total, longest time.Duration
	count          int
}

func (g lockGap) String() string {
	return fmt.Sprintf("%d gaps, %s in all, longest %s", g.count, g.total.Round(100*time.Millisecond), g.longest.Round(100*time.Millisecond))
}

// lockWatch polls each node's agent lock.
type lockWatch struct {
	stop func() map[string]lockGap
}

// watchLocks polls each node's /proc/net/unix for the agent's lock every
// 250 ms (one guest command: an agent runs while it is held) until stop,
// which returns each node's gaps, from the first read without it to the
// first with it again. A failed read is logged and not counted.
func (b *nodesBed) watchLocks(t *testing.T) lockWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	gaps := make([]lockGap, len(b.c.Nodes))
	for i, n := range b.c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gaps[i] = watchLock(ctx, t, n)
		}()
	}
	halt := sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(halt) // no poll may log after the case
	return lockWatch{stop: func() map[string]lockGap {
		halt()
		out := map[string]lockGap{}
		for i, n := range b.c.Nodes {
			out[n.Name] = gaps[i]
			t.Logf("%s without an agent: %s", n.Name, gaps[i])
		}
		return out
	}}
}

// watchLock is one node's part of watchLocks.
func watchLock(ctx context.Context, t *testing.T, n *cluster.Node) lockGap {
	var g lockGap
	var since time.Time // when the lock was first seen unheld; zero while held
	for ctx.Err() == nil {
		r, err := n.VM.Run(ctx, "grep", "-q", agentLockLine, "/proc/net/unix")
		switch {
		case ctx.Err() != nil:
		case err != nil || r.ExitCode > 1:
			t.Logf("%s: reading the agent lock: %v %s", n.Name, err, r.Stderr)
		case r.ExitCode == 1 && since.IsZero():
			since = time.Now()
			t.Logf("%s: no agent from %s", n.Name, since.Format("15:04:05.000"))
		case r.ExitCode == 0 && !since.IsZero():
			d := time.Since(since)
			g.total, g.longest, g.count = g.total+d, max(g.longest, d), g.count+1
			t.Logf("%s: an agent again after %s", n.Name, d.Round(time.Millisecond))
			since = time.Time{}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !since.IsZero() {
		t.Errorf("%s: no agent since %s", n.Name, since.Format("15:04:05.000"))
	}
	return g
}
