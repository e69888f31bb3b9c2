package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
)

// TestConflictOlderServiceHolds: two Services want the same externalIP and
// port. The older one holds the virtual server; it is created first but
// named after the younger in name order, so that a rule "first arrived" or
// "first by name" would flip the holder at the next full resync. Across
// several full resyncs, a connection held through the older Service keeps
// answering from its backend and new connections reach only it; the
// younger Service gets a Warning Event naming the holder, and `status`
// reports the same holder with no drift. When the older Service goes, the
// younger takes the virtual server over.
func TestConflictOlderServiceHolds(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ns := e.namespace(t)
	bes := e.backends(t, 2)
	const extIP = "10.251.0.20"
	addr := hostPort(extIP, 80)
	withExternalIP := func(s *corev1.Service) { s.Spec.ExternalIPs = []string{extIP} }

	older := e.createService(t, ns, "z-older", []corev1.ServicePort{tcpPort("http", 80)}, withExternalIP)
	e.setSlice(t, older, discoveryv1.AddressTypeIPv4, bes[:1])
	e.expectBackends(t, "tcp", addr, []string{bes[0].Name})
	// Creation times have a resolution of one second.
	time.Sleep(1100 * time.Millisecond)

	hold, held := e.holdConn(t, addr)
	if held != bes[0].Name {
		t.Fatalf("the held connection reached %s, want %s", held, bes[0].Name)
	}

	fullSyncs := func() int { return strings.Count(e.AgentOutput(), `"kind":"full"`) }
	before := fullSyncs()
	younger := e.createService(t, ns, "a-younger", []corev1.ServicePort{tcpPort("http", 80)}, withExternalIP)
	e.setSlice(t, younger, discoveryv1.AddressTypeIPv4, bes[1:])
	if !younger.CreationTimestamp.After(older.CreationTimestamp.Time) {
		t.Fatalf("creation times %v and %v: the test needs the younger one younger", older.CreationTimestamp, younger.CreationTimestamp)
	}
	e.expectEvent(t, younger, "virtual server "+addr+"/TCP is held by Service "+ns+"/z-older, which is older")

	// Two full resyncs (--sync-period 5s) later, nothing moved.
	eventually(t, 30*time.Second, func() error {
		if n := fullSyncs() - before; n < 2 {
			return fmt.Errorf("%d full resyncs since the younger Service came", n)
		}
		return nil
	})
	e.expectBackends(t, "tcp", addr, []string{bes[0].Name})
	e.expectTable(t, []string{"-> " + hostPort(bes[0].Addr, backendPort)}, []string{"-> " + hostPort(bes[1].Addr, backendPort)}, "-t", addr)
	hold.expectAnswers(3, bes[0].Name)

	// status decides the same way and sees no drift on this virtual server.
	args := append([]string{bed.GuestBinary, "status", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName, "--output", "json"}, agentArgs...)
	out, err := e.VM.RunOK(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		statusJSON
		Conflicts []struct {
			VirtualServer, Holder, Loser string
		} `json:"conflicts"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --output json: %v\n%s", err, out)
	}
	found := false
	for _, c := range st.Conflicts {
		if c.VirtualServer == addr+"/TCP" {
			found = true
			if c.Holder != ns+"/z-older" || c.Loser != ns+"/a-younger" {
				t.Errorf("status: conflict %+v, want held by %s/z-older", c, ns)
			}
		}
	}
	if !found {
		t.Errorf("status shows no conflict on %s: %+v", addr, st.Conflicts)
	}
	for _, d := range st.Drift {
		if d.VirtualServer == addr+"/TCP" {
			t.Errorf("status: drift on the contested virtual server: %+v", d)
		}
	}

	// The older Service goes: the younger takes the virtual server over.
	if err := e.Client.CoreV1().Services(ns).Delete(ctx, older.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectBackends(t, "tcp", addr, []string{bes[1].Name})
	if !regexp.MustCompile(`(?m)^TCP\s+` + regexp.QuoteMeta(addr)).MatchString(e.ipvsadm(t, "-t", addr)) {
		t.Errorf("the virtual server is gone after the handover")
	}
	if err := e.Client.CoreV1().Services(ns).Delete(ctx, younger.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expectNoAnswer(t, "tcp", addr)
}
