package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/cluster"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// TestChaosRollingUpdate: in the shared one-node cluster (oneNodeCluster:
// kubelet, the EndpointSlice controller, ipvs-proxy as its DaemonSet), a Deployment of
// two pods (Burstable) behind a ClusterIP Service is rolled out (maxSurge 1,
// maxUnavailable 0; the pods drain 15 s after SIGTERM, as a well-behaved
// server does) while the node opens a new connection every 100 ms, with no
// retry, and holds one. No new connection fails; the held connection
// stays on its old pod, answering while that pod terminates, and ends
// when the pod closes it; afterwards IPVS has exactly the new pods as real
// servers.
func TestChaosRollingUpdate(t *testing.T) {
	c := oneNodeCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	defer foreignVirtualServer(t, c.VM)()
	peaks := startPeaks(ctx, t, nodeVMs(c))
	cs := c.Client
	const ns = "rolling"
	clusterNamespace(ctx, t, cs, ns)

	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"revision": "1"}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](60),
					Containers: []corev1.Container{{
						Name: "web", Image: cluster.ServerImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Command: []string{"/vmagent", "serve", "--name", "$(POD_NAME)", "--port", "8080", "--tcp", "--drain", "15s"},
						Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						// Burstable, not BestEffort: a BestEffort pod's CPU
						// weight is the minimum, and on a node this busy (an
						// emulated VM on a loaded machine) its answers then
						// stall for seconds, with any proxy.
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("400m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
						ReadinessProbe: tcpReady(8080),
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: labels,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP + ":80"

	// pods lists the Deployment's pods: name -> IP, and which terminate.
	pods := func() (ips map[string]string, terminating map[string]bool) {
		pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		ips, terminating = map[string]string{}, map[string]bool{}
		for _, p := range pl.Items {
			ips[p.Name] = p.Status.PodIP
			terminating[p.Name] = p.DeletionTimestamp != nil
		}
		return ips, terminating
	}
	// realServers are the virtual server's real servers (IP:port weight).
	realServers := func() ([]string, error) {
		out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", vip)
		if err != nil {
			return nil, err
		}
		var rs []string
		for _, m := range realServerLine.FindAllStringSubmatch(out, -1) {
			rs = append(rs, m[1]+" "+m[2])
		}
		slices.Sort(rs)
		return rs, nil
	}
	// settled: the Deployment is rolled out at revision rev, its old pods
	// are gone, and IPVS has exactly its pods, weight 1.
	settled := func(rev string) (bool, string) {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := d.Status
		if d.Spec.Template.Annotations["revision"] != rev || st.ObservedGeneration < d.Generation ||
			st.UpdatedReplicas != 2 || st.ReadyReplicas != 2 || st.AvailableReplicas != 2 || st.Replicas != 2 {
			return false, fmt.Sprintf("deployment status %+v", st)
		}
		ips, _ := pods()
		var want []string
		for _, ip := range ips {
			want = append(want, ip+":8080 1")
		}
		slices.Sort(want)
		got, err := realServers()
		if err != nil || !slices.Equal(got, want) || len(ips) != 2 {
			return false, fmt.Sprintf("real servers %v (%v), want %v", got, err, want)
		}
		return true, ""
	}
	// Pods take 1-3 minutes to start under emulation on a loaded machine.
	waitWithin(ctx, t, 15*time.Minute, "web rolled out at revision 1", func() (bool, string) { return settled("1") }, c.KubeletLog)
	oldIPs, _ := pods()

	// The control: a Service that does not change, whose endpoint is a
	// server on the node itself. Its traffic tells a VM that stalled (the
	// emulated node on a loaded machine can stop for seconds) from a
	// connection the rollout broke.
	control := controlService(ctx, t, c, ns)

	// Traffic from the node: a new connection every 100 ms (no retry) and
	// a held one, and the same to the control.
	hit, controlHit, hold := startTraffic(ctx, t, c.VM, vip, control)
	heldPod := heldAnswer.FindStringSubmatch(hold.Output())[1]
	if _, ok := oldIPs[heldPod]; !ok {
		t.Fatalf("the held connection answers from %q, not one of the pods %v", heldPod, oldIPs)
	}
	time.Sleep(2 * time.Second) // traffic before the rollout

	// The rollout.
	began := time.Now()
	patch := []byte(`{"spec":{"template":{"metadata":{"annotations":{"revision":"2"}}}}}`)
	if _, err := cs.AppsV1().Deployments(ns).Patch(ctx, "web", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The answers the held connection got before its pod began to
	// terminate, and whether it answered after.
	answersAtTermination := -1
	waitWithin(ctx, t, 15*time.Minute, "web rolled out at revision 2", func() (bool, string) {
		if answersAtTermination < 0 {
			if _, term := pods(); term[heldPod] {
				answersAtTermination = strings.Count(hold.Output(), "answer ")
			}
		}
		return settled("2")
	}, c.KubeletLog)
	rollout := time.Since(began)
	time.Sleep(2 * time.Second) // traffic after the rollout

	res, failures := stopHit(t, hit)
	controlRes, controlFailures := stopHit(t, controlHit)
	newIPs, _ := pods()
	t.Logf("rolling update: rollout (and IPVS with exactly the new pods) %s; new connections %d, failed %d; answers by pod %v; old pods %v, new %v",
		rollout.Round(time.Millisecond), res.Total()+len(failures), len(failures), res.Answers, oldIPs, newIPs)
	t.Logf("control Service (unchanged): new connections %d, failed %d", controlRes.Total()+len(controlFailures), len(controlFailures))
	unexcused := unexcusedFailures(t, failures, controlFailures)
	if len(unexcused) > 0 {
		t.Errorf("%d new connections failed during the rolling update while the control Service answered: %v", len(unexcused), unexcused)
	}
	if len(controlFailures) > len(failures)/2+3 {
		t.Logf("the control failed %d times: the VM stalled; its failures are listed above", len(controlFailures))
	}
	for name := range newIPs {
		if res.Answers[name] == 0 {
			t.Errorf("no new connection reached the new pod %s: %v", name, res.Answers)
		}
	}

	// The held connection: on its old pod all along, answering while the
	// pod terminated, then ended by the pod.
	if err := hold.WaitFor(ctx, "error "); err != nil {
		t.Errorf("the held connection did not end with its pod: %v", err)
	}
	total := strings.Count(hold.Output(), "answer ")
	for _, l := range strings.Split(strings.TrimSpace(hold.Output()), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "answer" && f[2] != heldPod {
			t.Errorf("the held connection moved from %s: %q", heldPod, l)
		}
	}
	t.Logf("held connection on %s: %d answers, %d of them while its pod terminated; ended with %q",
		heldPod, total, total-answersAtTermination, lastLine(hold.Output()))
	if answersAtTermination < 0 || total <= answersAtTermination {
		t.Errorf("the held connection got no answer while its pod %s terminated (%d answers, %d before)", heldPod, total, answersAtTermination)
	}
	peaks.record(t, chaos.Row{
		Case: "rolling-update", TrafficAttempted: res.Total() + len(failures) + 1, TrafficFailed: len(unexcused),
		ConvergeSeconds: seconds(rollout),
		Notes: fmt.Sprintf("2 pods replaced one by one in the cluster; converge = rollout until IPVS has exactly the new pods; held connection: %d answers on its old pod, %d while it terminated; %d failures during VM stalls (control failed too); writes not counted (the agent runs in its pod)",
			total, total-answersAtTermination, len(failures)-len(unexcused)),
	})
}

// startTraffic starts, in v's root namespace, a new TCP connection to vip
// every 100 ms (no retry, 5 s timeout), the same to control, and a held
// connection to vip that has had its first answer. All three are stopped
// when the test ends.
func startTraffic(ctx context.Context, t *testing.T, v *vm.VM, vip, control string) (hit, controlHit, hold *vm.Proc) {
	t.Helper()
	hit, controlHit = startHit(ctx, t, v, vip), startHit(ctx, t, v, control)
	hold = startProc(ctx, t, v, "vmagent", "hold", "--addr", vip, "--interval", "200ms", "--timeout", "10s")
	if err := hold.WaitFor(ctx, "answer 1 "); err != nil {
		t.Fatal(err)
	}
	return hit, controlHit, hold
}

// startHit starts, in v's root namespace, a new TCP connection to addr
// every 100 ms (no retry, 5 s timeout), stopped when the test ends.
func startHit(ctx context.Context, t *testing.T, v *vm.VM, addr string) *vm.Proc {
	t.Helper()
	return startProc(ctx, t, v, "vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", "1000000", "--interval", "100ms", "--timeout", "5s")
}

// startProc starts argv in v, stopped when the test ends.
func startProc(ctx context.Context, t *testing.T, v *vm.VM, argv ...string) *vm.Proc {
	t.Helper()
	p, err := v.Start(ctx, argv...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// unexcusedFailures are the failures of a hit that a change under test
// caused: a failure is the change's unless the control (a Service that
// does not change) failed within 6 s of it (a stalled VM fails both).
// The excused ones are logged.
func unexcusedFailures(t *testing.T, failures, controlFailures []hitFailure) []string {
	t.Helper()
	var unexcused []string
	for i, at := range failures {
		stalled := false
		for _, cat := range controlFailures {
			if d := at.at.Sub(cat.at); d > -6*time.Second && d < 6*time.Second {
				stalled = true
			}
		}
		if !stalled {
			unexcused = append(unexcused, fmt.Sprintf("#%d %s", i, at))
		} else {
			t.Logf("failure during a stall (the control failed too): %s", at)
		}
	}
	return unexcused
}

// hitFailure is a failed attempt of a hit and when it began (the VM's
// clock).
type hitFailure struct {
	at  time.Time
	err string
}

func (f hitFailure) String() string { return f.at.Format("15:04:05.000") + " " + f.err }

// stopHit stops a `vmagent hit` and returns its result and failures (the
// attempt cut short by the stop is not one).
func stopHit(t *testing.T, p *vm.Proc) (nettest.HitResult, []hitFailure) {
	t.Helper()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	var res nettest.HitResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(p.Output())), &res); err != nil {
		t.Fatalf("hit: %v\n%s", err, p.Output())
	}
	return res, hitFailures(res)
}

// hitFailures are the failures of a stopped hit's result, each with when
// it began (the attempt cut short by the stop is not one).
func hitFailures(res nettest.HitResult) []hitFailure {
	var out []hitFailure
	i := 0
	for _, e := range res.Errors {
		if strings.Contains(e, "stopped after") {
			continue
		}
		f := hitFailure{err: e}
		if i < len(res.FailedAt) {
			f.at = res.Started.Add(res.FailedAt[i])
		}
		i++
		out = append(out, f)
	}
	return out
}

// controlService creates, in ns, a Service "control" without a selector
// whose one endpoint is a `vmagent serve` on the node's own address, and
// returns its address once IPVS has it.
func controlService(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) string {
	t.Helper()
	srv, err := c.VM.Start(ctx, "vmagent", "serve", "--name", "control", "--port", "9090", "--tcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "control"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "control", Labels: map[string]string{
			discoveryv1.LabelServiceName: "control", discoveryv1.LabelManagedBy: "e2e.ipvs-proxy.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](9090)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{cluster.NodeIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := svc.Spec.ClusterIP + ":80"
	waitFor(ctx, t, "Service control in IPVS", func() (bool, string) {
		out, err := c.VM.RunOK(ctx, "ipvsadm", "-Ln", "-t", addr)
		return err == nil && strings.Contains(out, cluster.NodeIP+":9090"), out + fmt.Sprint(err)
	})
	return addr
}

// realServerLine is a real server of `ipvsadm -Ln`: address and weight.
var realServerLine = regexp.MustCompile(`(?m)^\s+-> (\S+)\s+\S+\s+(\d+)\s`)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
