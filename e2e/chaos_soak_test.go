package e2e

// Issue 45's case 8, the soak (`make chaos-soak`), on TestChaosNodes'
// bed: CHAOS_SOAK of endpoint churn at CHAOS_SIZE Services under live
// traffic to a Service the churn never touches.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
)

const (
	// chaosSoakNS holds the soak's churned workloads and Services.
	chaosSoakNS = "chaos-soak"
	// soakRound is the churn's default period ($CHAOS_SOAK_ROUND): each
	// round scales, creates, deletes and changes something.
	soakRound = 30 * time.Second
	// soakWarmup is the minute from which the memory slope is bounded.
	soakWarmup = 10.0
	// soakSlopeLimit (MiB per hour after the warm-up) fails only clear
	// growth; it is asserted when the series after the warm-up spans at
	// least soakSlopeSpan minutes.
	soakSlopeLimit = 20.0
	soakSlopeSpan  = 10.0
	// soakServiceBase offsets the churned Services' numbers (their
	// names and fakeEndpoints) from the bulk Services'.
	soakServiceBase = 100000
	// soakEndpointBase offsets the bulk slices' new endpoints.
	soakEndpointBase = 200000
)

// soakDuration is how long TestChaosSoak churns: $CHAOS_SOAK (a Go
// duration, at least 2 minutes), else 60 minutes (issue 45's).
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	return envDuration(t, "CHAOS_SOAK", 60*time.Minute, 2*time.Minute)
}

// soakPeriod is the churn's period: $CHAOS_SOAK_ROUND (a Go duration, at
// least 10 s), else soakRound. The emulated bed's kubelets and containerd
// fell behind 30 s rounds at 2,000 Services (pods left Terminating, the
// nodes NotReady, the agents' probes unanswered): a longer round keeps
// the same churn per round with fewer pod starts an hour.
func soakPeriod(t *testing.T) time.Duration {
	t.Helper()
	return envDuration(t, "CHAOS_SOAK_ROUND", soakRound, 10*time.Second)
}

// TestChaosSoak: on TestChaosNodes' two nodes, outside host and Services
// (CHAOS_SIZE bulk ones, the live one), CHAOS_SOAK of churn in rounds of
// CHAOS_SOAK_ROUND (30 s): a Deployment scaled between 1 and 3 pods,
// another (2 pods) restarted as `kubectl rollout restart` does every
// other round, a batch of Services created and the batch of two rounds
// before deleted, and a batch of the bulk Services' EndpointSlices
// changed. The live Service
// is never touched: the streams of TestChaosNodes (new TCP connections
// from every kind of client) and 20 held connections use it the whole
// time. Each agent's RSS (VmRSS of its process) is read every minute. At
// the end: every node's kernel as the API says (leaks 0), no connection
// failed, no held one broke, no agent restarted, and the memory slope
// after the first 10 minutes below 20 MiB/hour when at least 10 minutes
// of it were read (reported always).
func TestChaosSoak(t *testing.T) {
	began := time.Now()
	dur := soakDuration(t)
	ctx, cancel := context.WithTimeout(context.Background(), dur+60*time.Minute)
	defer cancel()
	c := shippedCluster(ctx, t, 2)
	dumpAgentsOnFailure(t, c)
	s := &soak{nodesBed: newNodesBed(ctx, t, c, chaosSize(t)), dur: dur, period: soakPeriod(t)}
	s.batch = max(5, s.size/50)
	s.run(t)
	t.Logf("TIMING whole test: %s", time.Since(began).Round(time.Millisecond))
}

// soak is the soak's bed and its churn's counts.
type soak struct {
	*nodesBed
	dur    time.Duration
	period time.Duration // of a round
	batch  int           // Services created a round; twice as many bulk slices changed
	churn  soakChurn
}

// soakChurn counts what the churn did and what of it the API refused.
type soakChurn struct {
	rounds, scales, restarts, created, deleted, slices int
	errs                                               int
	lastErr                                            error
}

// soakBaseline is what the end is compared with.
type soakBaseline struct {
	restarts map[string]int32
	writes   map[string]float64
}

func (s *soak) run(t *testing.T) {
	peaks := startPeaks(s.ctx, t, nodeVMs(s.c))
	clusterNamespace(s.ctx, t, s.c.Client, chaosSoakNS)
	s.startWorkloads(t)
	base := s.baseline(t)
	n1, n2 := s.c.Nodes[0], s.c.Nodes[1]
	tr := s.startTraffic(t, "soak", map[string]string{n1.Name: n1.IP, n2.Name: n2.IP})
	holds := s.holdLive(t, 43000)
	start := time.Now()
	mem := s.watchMemory(t, start)
	s.churnFor(t, start)
	churned := time.Now()
	s.settle(t)
	leaks := s.converged(t)
	converge := time.Since(churned)
	samples := mem.stop()
	broken := stopHolds(t, holds)
	attempted, failed := tr.stop(t)
	restarts, writes := s.after(t, base)
	if s.churn.errs > 0 {
		t.Errorf("%d of the churn's API calls failed, the last: %v", s.churn.errs, s.churn.lastErr)
	}
	sums := s.memory(t, samples)
	s.keep(t, samples, sums)
	ch := s.churn
	peaks.record(t, chaos.Row{Case: "nodes-soak", TrafficAttempted: attempted + 20, TrafficFailed: failed + broken,
		KernelWrites: writes, ConvergeSeconds: seconds(converge), Leaks: leaks,
		Notes: fmt.Sprintf("%s of churn in rounds of %s at %d Services: %d rounds, %d scales, %d rolling restarts, %d Services created, %d deleted, "+
			"%d EndpointSlices changed, %d API errors; held 20, broken %d; agent restarts %d; RSS %s",
			churned.Sub(start).Round(time.Second), s.period, s.size, ch.rounds, ch.scales, ch.restarts, ch.created, ch.deleted, ch.slices,
			ch.errs, broken, restarts, memNotes(sums))})
}

// baseline reads each node's agent's restarts and netlink writes.
func (s *soak) baseline(t *testing.T) soakBaseline {
	t.Helper()
	b := soakBaseline{restarts: map[string]int32{}, writes: map[string]float64{}}
	for _, n := range s.c.Nodes {
		b.restarts[n.Name] = restartCount(ipvsProxyPod(s.ctx, t, s.c, n))
		b.writes[n.Name] = s.writes(t, n)
	}
	return b
}

// after fails the test for an agent restarted since b and returns the
// restarts and the netlink writes of both agents since.
func (s *soak) after(t *testing.T, b soakBaseline) (restarts int32, writes int) {
	t.Helper()
	for _, n := range s.c.Nodes {
		restarts += s.agentRestarts(t, n, b.restarts[n.Name])
		writes += int(s.writes(t, n) - b.writes[n.Name])
	}
	return restarts, writes
}

// The soak's Deployments: one scaled, one restarted.
const (
	soakScaled    = "scaled"
	soakRestarted = "restarted"
)

// startWorkloads creates the two Deployments of the vmagent server with a
// ClusterIP Service each and waits until they are available.
func (s *soak) startWorkloads(t *testing.T) {
	t.Helper()
	for name, replicas := range map[string]int32{soakScaled: 1, soakRestarted: 2} {
		if _, err := s.c.Client.AppsV1().Deployments(chaosSoakNS).Create(s.ctx, soakDeployment(name, replicas), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
		if _, err := s.c.Client.CoreV1().Services(chaosSoakNS).Create(s.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.settle(t)
}

// soakDeployment runs replicas vmagent servers labelled app=name, ready
// when they accept on 8080.
func soakDeployment(name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	p := agentPod(name, []string{"/vmagent", "serve", "--name", name, "--port", "8080", "--tcp"})
	p.Spec.Containers[0].Resources = burstable("50m")
	p.Spec.Containers[0].ReadinessProbe = tcpReady(8080)
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec}}}
}

// settle waits (10 minutes at most) until both Deployments are rolled
// out at their last spec: every replica updated and available, no other
// pod left.
func (s *soak) settle(t *testing.T) {
	t.Helper()
	for _, name := range []string{soakScaled, soakRestarted} {
		waitWithin(s.ctx, t, 10*time.Minute, "Deployment "+name+" rolled out", func() (bool, string) {
			return s.rolledOut(name)
		})
	}
}

func (s *soak) rolledOut(name string) (bool, string) {
	d, err := s.c.Client.AppsV1().Deployments(chaosSoakNS).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	st, want := d.Status, ptr.Deref(d.Spec.Replicas, 1)
	if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.AvailableReplicas != want || st.Replicas != want {
		return false, fmt.Sprintf("status %+v", st)
	}
	pl, err := s.c.Client.CoreV1().Pods(chaosSoakNS).List(s.ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return false, err.Error()
	}
	if len(pl.Items) != int(want) {
		return false, fmt.Sprintf("%d pods, want %d", len(pl.Items), want)
	}
	return s.sliceReady(name, int(want))
}

// sliceReady reports whether Service name's EndpointSlices hold want
// endpoints, every one ready: what the kernel is then compared with.
func (s *soak) sliceReady(name string, want int) (bool, string) {
	sl, err := s.c.Client.DiscoveryV1().EndpointSlices(chaosSoakNS).List(s.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return false, err.Error()
	}
	ready, all := 0, 0
	for _, es := range sl.Items {
		for _, ep := range es.Endpoints {
			all++
			if ptr.Deref(ep.Conditions.Ready, false) {
				ready++
			}
		}
	}
	return ready == want && all == want, fmt.Sprintf("Service %s: %d endpoints, %d ready, want %d", name, all, ready, want)
}

// churnFor runs rounds from start until s.dur has passed.
func (s *soak) churnFor(t *testing.T, start time.Time) {
	t.Helper()
	for k := 0; time.Since(start) < s.dur; k++ {
		roundStart := time.Now()
		s.round(k)
		s.churn.rounds++
		if took := time.Since(roundStart); took > s.period {
			t.Logf("soak round %d took %s (period %s)", k, took.Round(time.Millisecond), s.period)
		}
		select {
		case <-s.ctx.Done():
			t.Fatalf("soak round %d: %v", k, s.ctx.Err())
		case <-time.After(time.Until(roundStart.Add(s.period))):
		}
	}
	s.endBatches()
}

// endBatches deletes the last two rounds' batches: the end state has only
// the Deployments' Services in the soak's namespace.
func (s *soak) endBatches() {
	k := s.churn.rounds
	s.note(s.deleteBatch(k - 2))
	s.note(s.deleteBatch(k - 1))
}

// round k of the churn.
func (s *soak) round(k int) {
	replicas := 1 + 2*int32(k%2) // 1, 3, 1, 3, ...
	if s.note(s.patchDeployment(soakScaled, types.MergePatchType, fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas))) {
		s.churn.scales++
	}
	if k%2 == 1 {
		restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`,
			time.Now().Format(time.RFC3339Nano))
		if s.note(s.patchDeployment(soakRestarted, types.StrategicMergePatchType, restart)) {
			s.churn.restarts++
		}
	}
	if _, err := s.fakeServices(chaosSoakNS, "soak-", soakServiceBase+k*s.batch, s.batch); s.note(err) {
		s.churn.created += s.batch
	}
	s.note(s.deleteBatch(k - 2))
	s.note(s.changeBulkSlices(k))
}

// note counts err, if any, as the churn's and reports whether it is nil.
func (s *soak) note(err error) bool {
	if err != nil {
		s.churn.errs++
		s.churn.lastErr = err
	}
	return err == nil
}

func (s *soak) patchDeployment(name string, pt types.PatchType, patch string) error {
	if _, err := s.fast.AppsV1().Deployments(chaosSoakNS).Patch(s.ctx, name, pt, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch deployment %s/%s: %w", chaosSoakNS, name, err)
	}
	return nil
}

// deleteBatch deletes the Services round k created, and their slices.
func (s *soak) deleteBatch(k int) error {
	if k < 0 {
		return nil
	}
	first := soakServiceBase + k*s.batch
	err := parallel(s.batch, func(j int) error {
		name := "soak-" + strconv.Itoa(first+j)
		if err := s.fast.CoreV1().Services(chaosSoakNS).Delete(s.ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete service %s/%s: %w", chaosSoakNS, name, err)
		}
		if err := s.fast.DiscoveryV1().EndpointSlices(chaosSoakNS).Delete(s.ctx, name+"-ipv4", metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete endpointslice %s/%s-ipv4: %w", chaosSoakNS, name, err)
		}
		return nil
	})
	if err == nil {
		s.churn.deleted += s.batch
	}
	return err
}

// changeBulkSlices replaces the second endpoint of 2×batch bulk
// Services' slices, a window that moves each round.
func (s *soak) changeBulkSlices(k int) error {
	n := 2 * s.batch
	err := parallel(n, func(j int) error {
		m := k*n + j
		i := m % s.size
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: chaosNodesBulkNS, Name: "bulk-" + strconv.Itoa(i)}}
		eps := slice(svc, []string{fakeEndpoints(i, 1)[0], fakeEndpoints(soakEndpointBase+m, 1)[0]})
		patch, err := json.Marshal(map[string]any{"endpoints": eps.Endpoints})
		if err != nil {
			return fmt.Errorf("endpointslice %s: %w", eps.Name, err)
		}
		if _, err := s.fast.DiscoveryV1().EndpointSlices(chaosNodesBulkNS).Patch(s.ctx, eps.Name, types.MergePatchType, patch,
			metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patch endpointslice %s/%s: %w", chaosNodesBulkNS, eps.Name, err)
		}
		return nil
	})
	if err == nil {
		s.churn.slices += n
	}
	return err
}

// converged waits (5 minutes at most) until each node's kernel is what
// the API says, the soak's namespace included, and returns the leaks in
// all, each one an error.
func (s *soak) converged(t *testing.T) int {
	t.Helper()
	leaks := 0
	for _, n := range s.c.Nodes {
		exp := expectedState(t, s.fast, cluster.ServiceCIDR, s.nodeAddrs(t, n), chaosNodesNS, chaosNodesBulkNS, chaosSoakNS)
		took, d := convergeOn(t, n.VM, n.Name+": the Services after the soak", exp, 5*time.Minute)
		t.Logf("%s: converged %s after the churn's end was settled: %s", n.Name, took.Round(time.Millisecond), d)
		if len(d.Leaks) > 0 {
			t.Errorf("%s: %d kernel objects leaked after the soak: %s", n.Name, len(d.Leaks), sample(d.Leaks))
		}
		leaks += len(d.Leaks)
	}
	return leaks
}
