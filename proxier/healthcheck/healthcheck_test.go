package healthcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

var (
	svcA = types.NamespacedName{Namespace: "ns", Name: "a"}
	svcB = types.NamespacedName{Namespace: "ns", Name: "b"}
)

var loopback = netip.MustParseAddr("127.0.0.1")

// freePort returns a port that was free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func plan(name types.NamespacedName, port uint16, local int) *model.ServicePlan {
	return &model.ServicePlan{Service: name, HealthCheckNodePort: port, LocalEndpoints: local}
}

// get asks the health check on port; code 0 means the connection failed.
func get(t *testing.T, port uint16) (int, Response, http.Header) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return 0, Response{}, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r Response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return resp.StatusCode, r, resp.Header
}

func mustSync(t *testing.T, s *Server) {
	t.Helper()
	if err := s.Sync(false); err != nil {
		t.Fatal(err)
	}
}

func TestServerLifecycle(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	s := New(Config{Addresses: []netip.Addr{loopback}, ProxyHealthy: healthy.Load}, zap.NewNop())
	t.Cleanup(func() { _ = s.Close() })
	pa, pb := freePort(t), freePort(t)

	s.SetPlan(svcA, plan(svcA, pa, 2))
	s.SetPlan(svcB, plan(svcB, 0, 3)) // no health-check port: nothing opens
	mustSync(t, s)
	if got := s.Ports(); len(got) != 1 || got[svcA] != pa {
		t.Fatalf("Ports() = %v, want only %v on %d", got, svcA, pa)
	}
	code, r, h := get(t, pa)
	if code != http.StatusOK || r.LocalEndpoints != 2 || r.Service.Namespace != "ns" || r.Service.Name != "a" || !r.ServiceProxyHealthy {
		t.Fatalf("with 2 local endpoints: %d %+v", code, r)
	}
	if w := h.Get("X-Load-Balancing-Endpoint-Weight"); w != "2" {
		t.Errorf("weight header = %q, want 2", w)
	}

	// No local endpoints: 503 with the count.
	s.SetPlan(svcA, plan(svcA, pa, 0))
	mustSync(t, s)
	if code, r, _ := get(t, pa); code != http.StatusServiceUnavailable || r.LocalEndpoints != 0 {
		t.Fatalf("with no local endpoints: %d %+v", code, r)
	}

	// An unhealthy proxier answers 503 even with endpoints (kube-proxy).
	s.SetPlan(svcA, plan(svcA, pa, 1))
	mustSync(t, s)
	healthy.Store(false)
	if code, r, _ := get(t, pa); code != http.StatusServiceUnavailable || r.LocalEndpoints != 1 || r.ServiceProxyHealthy {
		t.Fatalf("with the proxier unhealthy: %d %+v", code, r)
	}
	healthy.Store(true)

	// The port changes: the old one closes, the new one opens.
	s.SetPlan(svcA, plan(svcA, pb, 1))
	mustSync(t, s)
	if code, _, _ := get(t, pa); code != 0 {
		t.Errorf("old port %d still answers %d", pa, code)
	}
	if code, _, _ := get(t, pb); code != http.StatusOK {
		t.Errorf("new port %d answers %d", pb, code)
	}

	// The Service goes away: closed.
	s.SetPlan(svcA, nil)
	mustSync(t, s)
	if code, _, _ := get(t, pb); code != 0 {
		t.Errorf("port %d still answers %d after the Service went away", pb, code)
	}
	if got := s.Ports(); len(got) != 0 {
		t.Errorf("Ports() = %v after removal", got)
	}
}

// TestServerPortBusy: a port held by another process is reported once (log
// and Event), is not a sync failure, and opens at a later Sync once free.
func TestServerPortBusy(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	s := New(Config{Addresses: []netip.Addr{loopback}, Recorder: rec}, zap.NewNop())
	t.Cleanup(func() { _ = s.Close() })
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(other.Addr().(*net.TCPAddr).Port)
	s.SetPlan(svcA, plan(svcA, port, 1))
	mustSync(t, s)
	mustSync(t, s)
	if len(s.Ports()) != 0 {
		t.Fatalf("opened a busy port: %v", s.Ports())
	}
	if n := len(rec.Events); n != 1 {
		t.Fatalf("%d Events for one busy port, want 1", n)
	}
	if ev := <-rec.Events; !strings.Contains(ev, "FailedToStartServiceHealthcheck") || !strings.Contains(ev, fmt.Sprint(port)) {
		t.Errorf("event %q", ev)
	}
	other.Close()
	mustSync(t, s)
	if code, _, _ := get(t, port); code != http.StatusOK {
		t.Fatalf("after the port was freed: %d", code)
	}
}

// TestServerAllAddresses: without addresses it listens on every address.
func TestServerAllAddresses(t *testing.T) {
	var got []string
	s := New(Config{Listen: func(network, addr string) (net.Listener, error) {
		got = append(got, network+" "+addr)
		return net.Listen("tcp", "127.0.0.1:0")
	}}, zap.NewNop())
	t.Cleanup(func() { _ = s.Close() })
	s.SetPlan(svcA, plan(svcA, 31000, 1))
	mustSync(t, s)
	if len(got) != 1 || got[0] != "tcp :31000" {
		t.Errorf("listened on %q, want [tcp :31000]", got)
	}
	two := New(Config{Addresses: []netip.Addr{loopback, netip.MustParseAddr("::1")}, Listen: func(network, addr string) (net.Listener, error) {
		got = append(got, network+" "+addr)
		if strings.HasPrefix(addr, "[::1]") {
			return nil, fmt.Errorf("injected")
		}
		return net.Listen("tcp", "127.0.0.1:0")
	}}, zap.NewNop())
	t.Cleanup(func() { _ = two.Close() })
	got = nil
	two.SetPlan(svcA, plan(svcA, 31001, 1))
	mustSync(t, two)
	if len(got) != 2 || got[0] != "tcp4 127.0.0.1:31001" || got[1] != "tcp6 [::1]:31001" {
		t.Errorf("listened on %q", got)
	}
	if len(two.Ports()) != 0 {
		t.Errorf("half-opened port kept: %v", two.Ports())
	}
}
