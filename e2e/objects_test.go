package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/chaos"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

func tcpPort(name string, port int32) corev1.ServicePort {
	return bed.Port(name, corev1.ProtocolTCP, port)
}

// localLoadBalancer makes a Service a LoadBalancer with
// externalTrafficPolicy Local (the apiserver gives it a health-check node
// port).
func localLoadBalancer(s *corev1.Service) {
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

func udpPort(name string, port int32) corev1.ServicePort {
	return bed.Port(name, corev1.ProtocolUDP, port)
}

// createService creates a Service without a selector (its EndpointSlices
// are made by the test, as for a Service without selectors).
func (e env) createService(t *testing.T, ns, name string, ports []corev1.ServicePort, mutate ...func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: ports},
	}
	for _, m := range mutate {
		m(svc)
	}
	out, err := e.Client.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
	return out
}

// httpService creates, in a new namespace, a Service with one TCP port 80
// named http and n backends on this node in its IPv4 EndpointSlice.
func (e env) httpService(t *testing.T, name string, n int) (ns string, svc *corev1.Service, bes []backend) {
	t.Helper()
	ns = e.namespace(t)
	bes = e.backends(t, n)
	svc = e.createService(t, ns, name, []corev1.ServicePort{tcpPort("http", 80)})
	e.setSlice(t, svc, discoveryv1.AddressTypeIPv4, bes)
	return ns, svc, bes
}

// setSlice sets the Service's EndpointSlice of a family to the backends.
func (e env) setSlice(t *testing.T, svc *corev1.Service, family discoveryv1.AddressType, bes []backend, mutate ...func(*discoveryv1.Endpoint)) {
	t.Helper()
	if err := e.SetEndpoints(context.Background(), svc, family, bes, mutate...); err != nil {
		t.Fatal(err)
	}
}

func names(bes []backend) []string {
	out := make([]string, len(bes))
	for i, b := range bes {
		out[i] = b.Name
	}
	sort.Strings(out)
	return out
}

func hostPort(ip string, port int32) string {
	return net.JoinHostPort(ip, strconv.Itoa(int(port)))
}

// expectBackends waits until connections to addr reach exactly the named
// backends (round robin: two connections each), with no errors.
func (e env) expectBackends(t *testing.T, proto, addr string, want []string) {
	t.Helper()
	sort.Strings(want)
	n := max(2*len(want), 2)
	eventually(t, 30*time.Second, func() error {
		res := e.hit(t, proto, addr, n)
		var got []string
		for name := range res.Answers {
			got = append(got, name)
		}
		sort.Strings(got)
		if !slices.Equal(got, want) || len(res.Errors) > 0 {
			return fmt.Errorf("%s %s: answers %v errors %v, want exactly %v", proto, addr, res.Answers, res.Errors, want)
		}
		return nil
	})
}

// expectNoAnswer waits until connections to addr get no answer at all
// (refused: the virtual server has no real servers, or does not exist).
func (e env) expectNoAnswer(t *testing.T, proto, addr string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		res := e.hit(t, proto, addr, 2)
		if len(res.Answers) > 0 {
			return fmt.Errorf("%s %s still answered: %v", proto, addr, res.Answers)
		}
		return nil
	})
}

// expectTable waits until `ipvsadm -Ln` (with args) contains every line
// of want and none of notWant.
func (e env) expectTable(t *testing.T, want, notWant []string, args ...string) string {
	t.Helper()
	return e.expectTableWithin(t, 30*time.Second, want, notWant, args...)
}

// expectTableWithin is expectTable with its own time limit.
func (e env) expectTableWithin(t *testing.T, limit time.Duration, want, notWant []string, args ...string) string {
	t.Helper()
	var out string
	eventually(t, limit, func() error {
		out = e.ipvsadm(t, args...)
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("ipvsadm -Ln %v has no %q:\n%s", args, w, out)
			}
		}
		for _, w := range notWant {
			if strings.Contains(out, w) {
				return fmt.Errorf("ipvsadm -Ln %v still has %q:\n%s", args, w, out)
			}
		}
		return nil
	})
	return out
}

// vipsBound returns the addresses on the proxy's interface.
func (e env) vipsBound(t *testing.T) string {
	t.Helper()
	out, err := e.VM.RunOK(context.Background(), "ip", "addr", "show", "dev", proxyIface)
	if err != nil {
		t.Fatalf("ip addr: %v", err)
	}
	return out
}

// routedRanges returns the prefixes routed as local through the proxy's
// interface ("10.96.0.0/16"; its bound addresses' routes are single
// addresses).
func (e env) routedRanges(t *testing.T) []string {
	t.Helper()
	out, err := e.VM.RunOK(context.Background(), "ip", "-4", "route", "show", "table", "local", "dev", proxyIface)
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	return chaos.ParseRoutes(out)
}

// expectRouted fails t unless the IPv4 clusterIP ip is held as the
// default holds it: inside a Service range routed as local through the
// proxy's interface, and not bound to it.
func (e env) expectRouted(t *testing.T, ip string) {
	t.Helper()
	a := netip.MustParseAddr(ip)
	ranges := e.routedRanges(t)
	if !slices.ContainsFunc(ranges, func(r string) bool { p, err := netip.ParsePrefix(r); return err == nil && p.Contains(a) }) {
		t.Errorf("clusterIP %s is in no range routed through %s: %q", ip, proxyIface, ranges)
	}
	if b := e.vipsBound(t); strings.Contains(b, " "+ip+"/32") {
		t.Errorf("clusterIP %s is bound to %s although its range is routed:\n%s", ip, proxyIface, b)
	}
}

// expectEvent waits for a Warning Event from ipvs-proxy on svc whose
// message contains msg ("" matches any).
func (e env) expectEvent(t *testing.T, svc *corev1.Service, msg string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		evs, err := e.Client.CoreV1().Events(svc.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.UID == svc.UID && ev.Source.Component == "ipvs-proxy" && ev.Type == corev1.EventTypeWarning &&
				strings.Contains(ev.Message, msg) {
				return nil
			}
		}
		return fmt.Errorf("no warning Event from ipvs-proxy on %s/%s saying %q among %d", svc.Namespace, svc.Name, msg, len(evs.Items))
	})
}

// heldConn is one flow held open to a Service address from the client
// namespace (`vmagent hold`): a TCP connection, or UDP datagrams from one
// socket; it sends a line every 200 ms and logs "answer N <backend> ..."
// per answer, "error ..." when the flow ends.
type heldConn struct {
	t       *testing.T
	proto   string
	proc    *vm.Proc
	ctx     context.Context
	started time.Time
	backend string // the first answer's
}

// holdConn opens a held TCP connection to addr and waits for its first
// answer; it returns the connection and the backend that answered. The
// connection is closed when the test ends.
func (e env) holdConn(t *testing.T, addr string) (*heldConn, string) {
	t.Helper()
	h := e.holdFlow(t, "tcp", addr)
	return h, h.backend
}

// holdFlow is holdConn for proto "tcp" or "udp"; extra are more flags of
// `vmagent hold` (--reset).
func (e env) holdFlow(t *testing.T, proto, addr string, extra ...string) *heldConn {
	t.Helper()
	// A 10 s answer timeout: under emulation a busy VM can stall a few
	// seconds; a broken flow stays broken however long one waits.
	argv := append([]string{"vmagent", "hold", "--netns", bed.ClientNetns, "--proto", proto, "--addr", addr,
		"--interval", "200ms", "--timeout", "10s"}, extra...)
	proc, err := e.VM.Start(context.Background(), argv...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(func() {
		cancel()
		_ = proc.Stop()
	})
	h := &heldConn{t: t, proto: proto, proc: proc, ctx: ctx, started: time.Now()}
	if err := proc.WaitFor(ctx, "answer 1 "); err != nil {
		t.Fatalf("held %s flow to %s: %v\n%s", proto, addr, err, proc.Output())
	}
	h.backend = heldAnswer.FindStringSubmatch(proc.Output())[1]
	return h
}

// answers counts the answers so far.
func (h *heldConn) answers() int { return strings.Count(h.proc.Output(), "answer ") }

// verify says how the flow failed, if it did: no new answer within
// `within`, an answer from another backend than the first, or an error.
func (h *heldConn) verify(within time.Duration) error {
	n := h.answers()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := h.proc.WaitFor(ctx, fmt.Sprintf("answer %d %s ", n+1, h.backend)); err != nil {
		return fmt.Errorf("the held %s flow stopped answering from %s after %d answers: %w\n%s", h.proto, h.backend, n, err,
			tailLines(h.proc.Output(), 5))
	}
	for _, l := range strings.Split(strings.TrimSpace(h.proc.Output()), "\n") {
		if f := strings.Fields(l); len(f) < 3 || f[0] != "answer" || f[2] != h.backend {
			return fmt.Errorf("the held %s flow failed or moved from %s: %q", h.proto, h.backend, l)
		}
	}
	return nil
}

var heldAnswer = regexp.MustCompile(`answer 1 (\S+)`)

// expectAnswers waits for n more answers and checks that every answer so
// far came from backend, with no error.
func (h *heldConn) expectAnswers(n int, backend string) {
	h.t.Helper()
	answers := strings.Count(h.proc.Output(), "answer ")
	if err := h.proc.WaitFor(h.ctx, fmt.Sprintf("answer %d %s ", answers+n, backend)); err != nil {
		h.t.Fatalf("the held connection (opened at %s) stopped answering from %s after %d answers: %v\n%s",
			h.started.Format("15:04:05.000"), backend, answers, err, h.proc.Output())
	}
	for _, l := range strings.Split(strings.TrimSpace(h.proc.Output()), "\n") {
		if f := strings.Fields(l); len(f) < 3 || f[0] != "answer" || f[2] != backend {
			h.t.Errorf("the held connection failed or moved: %q", l)
		}
	}
}

// expectEnd waits until the held connection ends with an error.
func (h *heldConn) expectEnd() {
	h.t.Helper()
	if err := h.proc.WaitFor(h.ctx, "error "); err != nil {
		h.t.Errorf("the held connection outlived its real server: %v", err)
	}
}
