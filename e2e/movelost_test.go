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
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// TestHostTrafficDuringEndpointMove: the node's own connections to a
// clusterIP lose none while the Service's endpoint moves, in both
// families. Their source is the VIP itself (the local route of a VIP
// names it), so IPVS schedules them in LOCAL_OUT and the glue
// masquerades them: the path of the two-node test's losses (issue 42,
// item 10), on one node. The VM's root namespace opens a new connection
// every 20 ms to each family's clusterIP, and another client reuses one
// source port for all its connections (each ends with a reset, as a
// client that reuses its ports does: IPVS and conntrack still hold the
// last one's entry when the next SYN comes), while the endpoint moves
// several times as a rescheduled pod's does: a new backend joins, ready;
// the old one terminates (serving: weight 0); it leaves the slice; its
// server stops. The Service is a LoadBalancer with externalTrafficPolicy
// Local, as in the two-node test, and the endpoint moves between this
// node and another in the slices (its server runs here either way), so
// that each move also changes what the glue's sets hold for a Local
// Service with and without a local endpoint. A Service that does not
// change is hit the same way from the same namespace: a failure within
// 6 s of one of its failures is the VM stalling, not the move.
func TestHostTrafficDuringEndpointMove(t *testing.T) {
	e := setup(t)
	// The node's connections from a VIP are masqueraded by the rule of
	// traffic from outside the cluster CIDR (the bed's agent), or,
	// without a cluster CIDR (as shipped, and on the two-node bed), by
	// their source being in the VIP set.
	t.Run("cluster CIDR", func(t *testing.T) { e.hostTrafficDuringMove(t, "! --match-set IPVSP-CLUSTER-CIDR src") })
	t.Run("no cluster CIDR", func(t *testing.T) {
		e.runAgentWith(t, withoutFlag(agentArgs, "--cluster-cidr"))
		e.hostTrafficDuringMove(t, "--match-set IPVSP-VIP src")
	})
}

// hostTrafficDuringMove is TestHostTrafficDuringEndpointMove with the
// agent that runs; masq is the part of iptables-save's rule that marks
// the node's clusterIP connections for masquerade.
func (e env) hostTrafficDuringMove(t *testing.T, masq string) {
	const moves = 4
	if save := e.iptablesSave(t, "iptables-save"); !strings.Contains(save, masq+" -j IPVSP-MARK-MASQ") {
		t.Fatalf("no rule with %q marks clusterIP traffic for masquerade:\n%s", masq, strings.Join(ownRules(save), "\n"))
	}
	ns := e.namespace(t)
	cur := e.backends(t, 1)[0]
	moving := e.createService(t, ns, "moving", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ExternalTrafficPolicy = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	if len(moving.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs %v: want one per family", moving.Spec.ClusterIPs)
	}
	svc4, svc6 := hostPort(moving.Spec.ClusterIPs[0], 80), hostPort(moving.Spec.ClusterIPs[1], 80)
	ctlBackend := e.backends(t, 1)
	ctl4, ctl6 := e.dualStackService(t, ns, "control", 80, ctlBackend)
	m := &endpointMove{e: e, t: t, svc: moving, vip4: svc4, vip6: svc6}
	m.set([]backend{cur})
	e.waitWeights(t, ctl4, map[string]int{ctlBackend[0].Addr: 1})
	e.waitWeights(t, ctl6, map[string]int{ctlBackend[0].Addr6: 1})
	m.weights(beWeight{cur, 1})

	streams := []*hostStream{
		e.startHostStream(t, "IPv4", svc4, "20ms", 0),
		e.startHostStream(t, "IPv6", svc6, "20ms", 0),
		// Below the ephemeral range (32768-60999): a port in it may be
		// taken by any connection of the VM (bind: address in use).
		e.startHostStream(t, "IPv4 one source port", svc4, "20ms", 23456),
		e.startHostStream(t, "IPv6 one source port", svc6, "20ms", 23457),
	}
	controls := []*hostStream{
		e.startHostStream(t, "control IPv4", ctl4, "100ms", 0),
		e.startHostStream(t, "control IPv6", ctl6, "100ms", 0),
	}
	time.Sleep(2 * time.Second) // traffic before the first move
	for i := range moves {
		cur = m.move(i+1, cur)
	}
	time.Sleep(2 * time.Second) // traffic after the last move
	if !checkHostStreams(t, streams, controls, cur.Name, moves) {
		e.showMove(t, &m.steps)
	}
}

// endpointMove moves a dual-stack Service's only endpoint from one
// backend to another, in both families at once.
type endpointMove struct {
	e          env
	t          *testing.T
	svc        *corev1.Service
	vip4, vip6 string
	steps      stepLog
}

// set sets both families' slices to bes.
func (m *endpointMove) set(bes []backend, mutate ...func(*discoveryv1.Endpoint)) {
	m.e.setSlice(m.t, m.svc, discoveryv1.AddressTypeIPv4, bes, mutate...)
	m.e.setSlice(m.t, m.svc, discoveryv1.AddressTypeIPv6, bes, mutate...)
}

// weights waits until both families' real servers have the weights of
// ws (-1: absent or 0).
func (m *endpointMove) weights(ws ...beWeight) {
	want4, want6 := map[string]int{}, map[string]int{}
	for _, x := range ws {
		want4[x.be.Addr], want6[x.be.Addr6] = x.w, x.w
	}
	m.e.waitWeights(m.t, m.vip4, want4)
	m.e.waitWeights(m.t, m.vip6, want6)
}

// beWeight is a backend's wanted weight.
type beWeight struct {
	be backend
	w  int
}

// move is the n-th move, away from cur, as a rescheduled pod's: a new
// backend (on the other node of the slices) joins, ready; cur terminates
// while serving (weight 0), leaves the slice, and its server stops. It
// returns the new backend.
func (m *endpointMove) move(n int, cur backend) backend {
	node := otherNode
	if cur.Node == otherNode {
		node = nodeName
	}
	next := m.e.backends(m.t, 1, node)[0]
	m.steps.mark(fmt.Sprintf("move %d: %s (%s) joins beside %s (%s)", n, next.Name, next.Node, cur.Name, cur.Node))
	m.set([]backend{cur, next})
	m.weights(beWeight{cur, 1}, beWeight{next, 1})
	time.Sleep(time.Second)
	m.steps.mark(fmt.Sprintf("move %d: %s terminating, serving", n, cur.Name))
	m.set([]backend{cur, next}, func(ep *discoveryv1.Endpoint) {
		if ep.Addresses[0] == cur.Addr || ep.Addresses[0] == cur.Addr6 {
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		}
	})
	m.weights(beWeight{cur, -1}, beWeight{next, 1})
	time.Sleep(time.Second)
	m.steps.mark(fmt.Sprintf("move %d: %s leaves the slice", n, cur.Name))
	m.set([]backend{next})
	m.weights(beWeight{cur, -1}, beWeight{next, 1})
	time.Sleep(time.Second)
	m.steps.mark(fmt.Sprintf("move %d: %s's server stops", n, cur.Name))
	if err := cur.Stop(); err != nil {
		m.t.Logf("stop %s: %v", cur.Name, err)
	}
	time.Sleep(time.Second)
	return next
}

// checkHostStreams stops the streams and their controls, logs their
// counts and fails the test for each failed connection of a stream that
// no control's failure within 6 s excuses, and for a stream that never
// reached the last backend. It reports whether all was well.
func checkHostStreams(t *testing.T, streams, controls []*hostStream, last string, moves int) bool {
	t.Helper()
	var controlFailures []hitFailure
	for _, c := range controls {
		_, f := stopHit(t, c.proc)
		controlFailures = append(controlFailures, f...)
		t.Logf("%s: %d failed", c.name, len(f))
	}
	ok := true
	for _, s := range streams {
		res, failures := stopHit(t, s.proc)
		unexcused := unexcusedFailures(t, failures, controlFailures)
		t.Logf("%s -> %s during %d moves: %d connections, %d failed (%d not during a stall), answers %v",
			s.name, s.addr, moves, res.Total()+len(failures), len(failures), len(unexcused), res.Answers)
		if len(unexcused) > 0 {
			ok = false
			t.Errorf("%s: %d connections from the node failed while the endpoint moved and the control answered:\n%s",
				s.name, len(unexcused), strings.Join(unexcused, "\n"))
		}
		if res.Answers[last] == 0 {
			t.Errorf("%s: no connection reached the last backend %s: %v", s.name, last, res.Answers)
		}
	}
	return ok
}

// hostStream is `vmagent hit` from the VM's root namespace: a new
// connection to addr at each interval, 5 s for each (connect and answer).
type hostStream struct {
	name, addr string
	proc       *vm.Proc
}

func (e env) startHostStream(t *testing.T, name, addr, interval string, sourcePort int) *hostStream {
	t.Helper()
	p, err := e.VM.Start(context.Background(), "vmagent", "hit", "--proto", "tcp", "--addr", addr, "--n", "1000000",
		"--interval", interval, "--timeout", "5s", "--source-port", fmt.Sprint(sourcePort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return &hostStream{name: name, addr: addr, proc: p}
}

// waitWeights waits until IPVS has the virtual server vip ("ip:port")
// with real servers of the weights in want, -1 meaning "absent or 0" (a
// real server that left keeps weight 0 while IPVS counts connections on
// it).
func (e env) waitWeights(t *testing.T, vip string, want map[string]int) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		out, err := e.IPVSTable(context.Background(), "-t", vip)
		if err != nil {
			return err
		}
		if !weightsMatch(ipvsWeights(out), want) {
			return fmt.Errorf("%s: want weights %v:\n%s", vip, want, out)
		}
		return nil
	})
}

// stepLog is a test's steps, at this host's clock.
type stepLog struct {
	mu    sync.Mutex
	steps []string
}

func (l *stepLog) mark(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, time.Now().UTC().Format("15:04:05.000")+" "+what)
}

// showMove logs what explains a failed connection: the steps (this
// host's clock, with the VM's clock beside it), the IPVS connections and
// the conntrack entries to the Services' and backends' ports, where each
// failed attempt's entry can be found by its local port.
func (e env) showMove(t *testing.T, steps *stepLog) {
	t.Helper()
	steps.mu.Lock()
	t.Logf("steps (host clock):\n%s", strings.Join(steps.steps, "\n"))
	steps.mu.Unlock()
	ctx := context.Background()
	if r, err := e.VM.Run(ctx, "date", "-u", "+%T.%N"); err == nil {
		t.Logf("the VM's clock reads %s at host %s", strings.TrimSpace(r.Stdout), time.Now().UTC().Format("15:04:05.000"))
	}
	for _, argv := range [][]string{{"ipvsadm", "-Lnc"}, {"vmagent", "conntrack", "--port", "80"},
		{"vmagent", "conntrack", "--port", fmt.Sprint(backendPort)}} {
		r, err := e.VM.Run(ctx, argv...)
		t.Logf("%s (%v):\n%s%s", strings.Join(argv, " "), err, r.Stdout, r.Stderr)
	}
}
