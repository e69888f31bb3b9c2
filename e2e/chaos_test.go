package e2e

// The reliability suite (`make chaos`, issue 10): each TestChaos* case
// runs with live traffic through the bed's agent and records one row of
// figures (framework/chaos) into $CHAOS_OUT. The helpers here are shared
// by the cases: bulk Services, the expected state and its comparison with
// the kernel (the one leak count of every case), live traffic.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/controlplane"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// chaosSize is the number of Services of the large cases: $CHAOS_SIZE,
// else 300 (CI's size).
func chaosSize(t *testing.T) int {
	t.Helper()
	s := os.Getenv("CHAOS_SIZE")
	if s == "" {
		return 300
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 {
		t.Fatalf("CHAOS_SIZE=%q: want a number of Services, at least 10", s)
	}
	return n
}

// chaosEnv is the bed with what a chaos case needs.
type chaosEnv struct {
	env
	fast kubernetes.Interface // a client allowed 500 requests/s, for bulk work
}

// chaosSetup returns the shared bed with its agent running (a case may
// stop it; the next one gets it back).
func chaosSetup(t *testing.T) chaosEnv {
	t.Helper()
	e := setup(t)
	if !e.AgentRunning() {
		if err := e.StartAgent(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(e.CP.RESTConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	fast, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := chaosEnv{env: e, fast: fast}
	t.Cleanup(foreignVirtualServer(t, e.VM))
	t.Cleanup(func() {
		// Whatever a case did to the agent, the next test finds it running.
		if !e.AgentRunning() {
			if err := e.StartAgent(context.Background()); err != nil {
				t.Errorf("restart the agent: %v", err)
			}
		}
	})
	return c
}

// foreignVS is another tool's virtual server (an address outside the
// Service ranges, not bound on ipvs-proxy's interface, no node port) with
// one real server, foreignRS: every chaos case runs with it in the kernel,
// and it must come out of the case as it went in.
const (
	foreignVS = "192.0.2.60:80"
	foreignRS = "192.0.2.61:80"
)

// addForeignVS is the other tool's script: its virtual server (wlc) and
// real server (masqueraded, weight 3), when missing.
const addForeignVS = "ipvsadm -Ln -t " + foreignVS + " >/dev/null 2>&1 || { ipvsadm -A -t " + foreignVS +
	" -s wlc && ipvsadm -a -t " + foreignVS + " -r " + foreignRS + " -m -w 3; }"

// foreignIntact matches `ipvsadm -Ln -t foreignVS` when the virtual server
// still has addForeignVS's scheduler, and its real server the same
// forwarding method and weight.
var foreignIntact = []*regexp.Regexp{
	regexp.MustCompile(`(?m)^TCP\s+` + regexp.QuoteMeta(foreignVS) + `\s+wlc\s*$`),
	regexp.MustCompile(`(?m)->\s+` + regexp.QuoteMeta(foreignRS) + `\s+Masq\s+3\s`),
}

// foreignVirtualServer puts foreignVS in the VM's kernel and returns the
// check to run when the case ends (t.Cleanup, or a defer while the VM still
// runs): foreignVS must be there as addForeignVS made it; then it is
// removed.
func foreignVirtualServer(t *testing.T, v *vm.VM) (check func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := v.RunOK(ctx, "sh", "-c", addForeignVS); err != nil {
		t.Fatal(err)
	}
	return func() {
		out, err := v.RunOK(ctx, "ipvsadm", "-Ln", "-t", foreignVS)
		for _, re := range foreignIntact {
			if err != nil || !re.MatchString(out) {
				t.Errorf("another tool's virtual server %s was changed by the agent: %v\n%s", foreignVS, err, out)
				break
			}
		}
		_, _ = v.RunOK(ctx, "ipvsadm", "-D", "-t", foreignVS)
	}
}

// parallel runs f(i) for i in [0, n) on 16 workers and returns the first
// error.
func parallel(n int, f func(i int) error) error {
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		next  = make(chan int)
	)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// fakeEndpoints are n endpoint addresses of bulk Service i, outside every
// backend's address (AddBackend uses .1 and .2 only): only the kernel's
// table is checked for them, nothing connects.
func fakeEndpoints(i, n int) []string {
	out := make([]string, n)
	for j := range out {
		out[j] = fmt.Sprintf("10.%d.%d.%d", 103-j%2, (i/250+j/2*7)%250, i%250+3)
	}
	return out
}

// slice is an IPv4 EndpointSlice of svc (one port, "http" -> BackendPort)
// with the given ready endpoints.
func slice(svc *corev1.Service, addrs []string) *discoveryv1.EndpointSlice {
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name + "-ipv4", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "bed.ipvs-proxy.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(backendPort))}},
	}
	for _, a := range addrs {
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{a},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(nodeName), Zone: ptr.To(zone)})
	}
	return eps
}

// bulkServices creates Services prefix-<i> for i in [from, from+n) in ns,
// TCP port 80 each, with an EndpointSlice of two endpoints.
func (c chaosEnv) bulkServices(t *testing.T, ns, prefix string, from, n int) []*corev1.Service {
	t.Helper()
	out := make([]*corev1.Service, n)
	err := parallel(n, func(k int) error {
		i := from + k
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", prefix, i)},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80)}}}
		created, err := c.fast.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create service %s/%s: %w", ns, svc.Name, err)
		}
		if _, err := c.fast.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), slice(created, fakeEndpoints(i, 2)),
			metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice of %s/%s: %w", ns, svc.Name, err)
		}
		out[k] = created
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// deleteServices deletes Services and their EndpointSlices.
func (c chaosEnv) deleteServices(t *testing.T, svcs []*corev1.Service) {
	t.Helper()
	err := parallel(len(svcs), func(i int) error {
		s := svcs[i]
		if err := c.fast.CoreV1().Services(s.Namespace).Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete service %s/%s: %w", s.Namespace, s.Name, err)
		}
		err := c.fast.DiscoveryV1().EndpointSlices(s.Namespace).Delete(context.Background(), s.Name+"-ipv4", metav1.DeleteOptions{})
		if err != nil && !strings.Contains(err.Error(), "not found") {
			return fmt.Errorf("delete endpointslice of %s/%s: %w", s.Namespace, s.Name, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// cleanupNamespace deletes every Service and EndpointSlice of ns when the
// test ends (the bed has no namespace controller: a deleted namespace
// keeps them, and a large case would weigh on every later test).
func (c chaosEnv) cleanupNamespace(t *testing.T, ns string) {
	t.Cleanup(func() {
		ctx := context.Background()
		svcs, err := c.fast.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Errorf("list services of %s: %v", ns, err)
			return
		}
		_ = parallel(len(svcs.Items), func(i int) error {
			return c.fast.CoreV1().Services(ns).Delete(ctx, svcs.Items[i].Name, metav1.DeleteOptions{})
		})
		if err := c.fast.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete endpointslices of %s: %v", ns, err)
		}
	})
}

// expected is the state the kernel should have: the Services of the
// namespaces in scope exactly (virtual servers of their clusterIPs, with
// their ready endpoints as real servers), every other Service's virtual
// servers and addresses as allowed.
func (c chaosEnv) expected(t *testing.T, scope ...string) chaos.Expected {
	t.Helper()
	return expectedState(t, c.fast, controlplane.DefaultServiceCIDR, []string{nodeAddr}, scope...)
}

// expectedState is chaosEnv.expected for any cluster: its Services read
// with cs, serviceCIDRs its Service ranges (comma-separated; the IPv4 one
// routed as local, as shipped), nodeAddrs the node's addresses whose node
// ports count as ipvs-proxy's.
func expectedState(t *testing.T, cs kubernetes.Interface, serviceCIDRs string, nodeAddrs []string, scope ...string) chaos.Expected {
	t.Helper()
	ctx := context.Background()
	exp := chaos.Expected{Virtual: map[string][]string{}, Known: map[string]bool{}, Addrs: map[string]bool{},
		KnownAddrs: map[string]bool{}, NodeAddrs: nodeAddrs, NodePortRange: [2]int{30000, 32767}}
	for _, p := range strings.Split(serviceCIDRs, ",") {
		pfx := netip.MustParsePrefix(p)
		exp.ServiceCIDRs = append(exp.ServiceCIDRs, pfx)
		if pfx.Addr().Is4() {
			exp.Routed = append(exp.Routed, pfx)
		}
	}
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list services: %v", err)
	}
	// Real servers of the scope's Services: service -> port name -> family -> endpoints.
	type key struct{ ns, svc, port string }
	rs := map[key][]string{}
	for _, ns := range scope {
		slices, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list endpointslices: %v", err)
		}
		for _, s := range slices.Items {
			for _, p := range s.Ports {
				k := key{ns, s.Labels[discoveryv1.LabelServiceName], ptr.Deref(p.Name, "")}
				for _, ep := range s.Endpoints {
					if !ptr.Deref(ep.Conditions.Ready, true) {
						continue
					}
					for _, a := range ep.Addresses {
						rs[k] = append(rs[k], hostPort(a, ptr.Deref(p.Port, 0)))
					}
				}
			}
		}
	}
	for _, s := range svcs.Items {
		if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		inScope := slices.Contains(scope, s.Namespace)
		var ips []string
		ips = append(ips, s.Spec.ClusterIPs...)
		others := slices.Clone(s.Spec.ExternalIPs)
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				others = append(others, in.IP)
			}
		}
		for _, p := range s.Spec.Ports {
			for _, ip := range append(slices.Clone(ips), others...) {
				vs := string(p.Protocol) + " " + hostPort(ip, p.Port)
				if inScope && slices.Contains(ips, ip) {
					want := []string{}
					for _, r := range rs[key{s.Namespace, s.Name, p.Name}] {
						if strings.HasPrefix(r, "[") == strings.Contains(ip, ":") {
							want = append(want, r)
						}
					}
					slices.Sort(want)
					exp.Virtual[vs] = want
					exp.Addrs[ip] = true
				} else {
					exp.Known[vs] = true
					exp.KnownAddrs[ip] = true
				}
			}
			for _, a := range nodeAddrs {
				if p.NodePort != 0 {
					exp.Known[string(p.Protocol)+" "+hostPort(a, p.NodePort)] = true
				}
			}
		}
	}
	return exp
}

// kernelState reads ipvs-proxy's part of the VM's kernel in one round trip.
func (c chaosEnv) kernelState(t *testing.T) chaos.State {
	t.Helper()
	return readKernelState(t, c.VM)
}

// readKernelState reads ipvs-proxy's part of v's kernel in one round trip.
func readKernelState(t *testing.T, v *vm.VM) chaos.State {
	t.Helper()
	const sep = "=====chaos====="
	out, err := v.RunOK(context.Background(), "sh", "-c", "ipvsadm -Ln; echo "+sep+"; ip -o addr show dev "+proxyIface+" 2>/dev/null || echo NO-INTERFACE; echo "+sep+"; ipset save; echo "+sep+
		"; ip -4 route show table local dev "+proxyIface+" 2>/dev/null; true")
	if err != nil {
		t.Fatalf("kernel state: %v", err)
	}
	parts := strings.Split(out, sep+"\n")
	if len(parts) != 4 {
		t.Fatalf("kernel state: %d parts:\n%s", len(parts), out)
	}
	st := chaos.State{Virtual: chaos.ParseIPVS(parts[0]), Sets: chaos.ParseIPSets(parts[2]), Routes: chaos.ParseRoutes(parts[3])}
	if !strings.Contains(parts[1], "NO-INTERFACE") {
		st.Addrs = chaos.ParseAddrs(parts[1])
	}
	return st
}

// bedRoutedRanges are the Service ranges the bed's agent routes as local
// (routeServiceCIDRs is on by default): the IPv4 range of the apiserver's
// ServiceCIDR; IPv6 clusterIPs stay bound.
func bedRoutedRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range strings.Split(controlplane.DefaultServiceCIDR, ",") {
		if pfx := netip.MustParsePrefix(p); pfx.Addr().Is4() {
			out = append(out, pfx)
		}
	}
	return out
}

// converge waits until the kernel equals exp (nothing missing, nothing
// leaked) and returns how long that took and the last diff; past the
// timeout it fails the test with the diff.
func (c chaosEnv) converge(t *testing.T, what string, exp chaos.Expected, timeout time.Duration) (time.Duration, chaos.Diff) {
	t.Helper()
	return convergeOn(t, c.VM, what, exp, timeout)
}

// convergeOn is chaosEnv.converge on v's kernel.
func convergeOn(t *testing.T, v *vm.VM, what string, exp chaos.Expected, timeout time.Duration) (time.Duration, chaos.Diff) {
	t.Helper()
	return convergeOnLive(t, v, what, func() chaos.Expected { return exp }, timeout)
}

// convergeOnLive is convergeOn against exp() taken anew before each read
// of the kernel: for Services whose endpoints may still change (a
// readiness probe failing under load) while one read of a big table takes
// minutes on a starved node.
func convergeOnLive(t *testing.T, v *vm.VM, what string, exp func() chaos.Expected, timeout time.Duration) (time.Duration, chaos.Diff) {
	t.Helper()
	start := time.Now()
	logged := start
	for {
		d := chaos.Compare(readKernelState(t, v), exp())
		took := time.Since(start)
		if d.Converged() {
			return took, d
		}
		if time.Since(logged) > 5*time.Second {
			t.Logf("%s: after %v: %s", what, took.Round(time.Millisecond), d)
			logged = time.Now()
		}
		if took > timeout {
			t.Errorf("%s: not converged after %v: %s", what, timeout, d)
			return took, d
		}
		time.Sleep(500 * time.Millisecond)
	}
}

var syncedWrites = regexp.MustCompile(`"msg":"synced".*"writes":(\d+)`)

// syncWrites sums the writes of the agent's sync log lines in log.
func syncWrites(log string) int {
	n := 0
	for _, m := range syncedWrites.FindAllStringSubmatch(log, -1) {
		w, _ := strconv.Atoi(m[1])
		n += w
	}
	return n
}

// agentLogMark is a point in the running agent's log, to read what it
// logged since.
type agentLogMark int

func (c chaosEnv) logMark() agentLogMark { return agentLogMark(len(c.AgentOutput())) }

func (c chaosEnv) logSince(m agentLogMark) string {
	out := c.AgentOutput()
	if int(m) > len(out) {
		return out
	}
	return out[m:]
}

// notJSONLines returns the lines of an agent's output that are not JSON
// objects, and how many are client-go's (a "reflector" field, as its
// reflectors log). Two lines are not the agent's to write and are passed
// over: the marker the bed writes where the VM dropped output it had kept
// too long (with the line after it, cut at its start), and a last line
// still being written (no newline yet).
func notJSONLines(out string) (bad []string, clientGo int) {
	lines := strings.Split(out, "\n")
	lines = lines[:len(lines)-1] // "" after the last newline, or a line being written
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "[... ") && strings.HasSuffix(l, " bytes of output dropped ...]") {
			i++
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			bad = append(bad, l)
			continue
		}
		if _, ok := m["reflector"]; ok {
			clientGo++
		}
	}
	return bad, clientGo
}

// scaled makes a namespace for a case (its Services deleted at the end)
// with a liveService and n bulk Services, and waits until the kernel has
// them all.
func (c chaosEnv) scaled(t *testing.T, n int) (ns string, live liveService, bulk []*corev1.Service) {
	t.Helper()
	ns = c.namespace(t)
	c.cleanupNamespace(t, ns)
	live = c.liveService(t, ns)
	start := time.Now()
	bulk = c.bulkServices(t, ns, "bulk", 0, n)
	created := time.Since(start)
	took, _ := c.converge(t, "the case's Services", c.expected(t, ns), 5*time.Minute)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d Services created in %v, programmed %v later", n, created.Round(time.Millisecond), took.Round(time.Millisecond))
	return ns, live, bulk
}

// liveService is a Service with two real backends, TCP port 80 and UDP
// port 53, whose endpoints the cases never change: its traffic must not
// fail whatever happens to the agent or the apiserver.
type liveService struct {
	svc *corev1.Service
	bes []backend
	tcp string // clusterIP:80
	udp string // clusterIP:53
}

func (c chaosEnv) liveService(t *testing.T, ns string) liveService {
	t.Helper()
	bes := c.backends(t, 2)
	svc := c.createService(t, ns, "live", []corev1.ServicePort{tcpPort("http", 80), udpPort("dns", 53)})
	c.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	l := liveService{svc: svc, bes: bes, tcp: hostPort(svc.Spec.ClusterIP, 80), udp: hostPort(svc.Spec.ClusterIP, 53)}
	c.expectBackends(t, "tcp", l.tcp, names(bes))
	c.expectBackends(t, "udp", l.udp, names(bes))
	return l
}

// liveTraffic runs against a liveService: new TCP connections and UDP
// exchanges every 50 ms, and held flows.
type liveTraffic struct {
	flows []*traffic
	holds []*heldConn
}

// startLiveTraffic starts the new connections and exchanges, and, when
// held > 0, that many held TCP connections and one held UDP flow (one
// source port all along: it must stay on its real server like a
// connection).
func (c chaosEnv) startLiveTraffic(t *testing.T, l liveService, held int) *liveTraffic {
	t.Helper()
	// A 5 s timeout per attempt: a failure is a refusal, a reset or a
	// black hole, not a VM that the shared machine starved for 2 s (seen
	// at load average 16).
	lt := &liveTraffic{flows: []*traffic{c.startTrafficTimeout(t, "tcp", l.tcp, 5*time.Second),
		c.startTrafficTimeout(t, "udp", l.udp, 5*time.Second)}}
	for i := 0; i < held; i++ {
		lt.holds = append(lt.holds, c.holdFlow(t, "tcp", l.tcp))
	}
	if held > 0 {
		lt.holds = append(lt.holds, c.holdFlow(t, "udp", l.udp))
	}
	return lt
}

// stop ends the traffic: attempts (each held flow counts one) and
// failures (a held flow that broke or moved counts one), with the
// failures' descriptions.
func (lt *liveTraffic) stop(t *testing.T) (attempted, failed int, errs []string) {
	t.Helper()
	for i, h := range lt.holds {
		attempted++
		if err := h.verify(30 * time.Second); err != nil {
			failed++
			errs = append(errs, fmt.Sprintf("held flow %d: %v", i, err))
		}
		_ = h.proc.Stop()
	}
	for _, f := range lt.flows {
		a, n, _, e := f.stop(t, time.Time{})
		if a < 20 {
			t.Errorf("%s: only %d attempts: the traffic did not run", f.name, a)
		}
		attempted += a
		failed += n
		for _, s := range e {
			errs = append(errs, f.name+" "+s)
		}
	}
	return attempted, failed, errs
}

// seconds rounds a duration to tenths of seconds, for rows.
func seconds(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}
