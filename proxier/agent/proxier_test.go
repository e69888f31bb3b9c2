package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/fake"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

func testService(name, clusterIP, sched string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{scheduler.AnnotationScheduler: sched}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func testSlice(svc, addr string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
}

// TestUnavailableSchedulerFallsBack: a Service asks for a scheduler that
// the kernel cannot load. Its sync fails (the other Service is programmed
// regardless); the next sync, even one started by an unrelated change,
// programs it with the default scheduler and raises an Event saying why.
func TestUnavailableSchedulerFallsBack(t *testing.T) {
	ipvs := fake.NewIPVS()
	ipvs.SetSchedulers("rr", "sh") // no ip_vs_mh
	links := fake.NewLinks(node)
	events := record.NewFakeRecorder(10)
	p := New(Config{NodeName: "node-a", Interface: testIface, Scheduler: scheduler.Spec{Name: "rr"},
		NodePortRange: model.PortRange{Min: 30000, Max: 32767}, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Minute},
		nil, ipvs, links, events, nil, zap.NewNop())
	p.tracker.onService(testService("hashed", "10.96.0.10", "mh"), false)
	p.tracker.onSlice(testSlice("hashed", "10.0.1.2"), false)
	p.tracker.onService(testService("sticky", "10.96.0.11", "sh"), false)
	p.tracker.onSlice(testSlice("sticky", "10.0.1.3"), false)

	err := p.SyncOnce(false)
	if err == nil || !strings.Contains(err.Error(), "default/hashed") {
		t.Fatalf("first sync: %v, want the failure of default/hashed", err)
	}
	want := []string{"10.96.0.11:80/TCP sh", "  -> 10.0.1.3:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("after the failed sync, the other Service (-want +got):\n%s", diff)
	}

	// The next sync, whatever starts it, rebuilds with the default.
	if err := p.SyncOnce(false); err != nil {
		t.Fatalf("next sync: %v", err)
	}
	want = []string{"10.96.0.10:80/TCP rr", "  -> 10.0.1.2:8080 w=1", "10.96.0.11:80/TCP sh", "  -> 10.0.1.3:8080 w=1"}
	if diff := cmp.Diff(want, ipvs.Dump()); diff != "" {
		t.Errorf("after the next sync (-want +got):\n%s", diff)
	}
	select {
	case ev := <-events.Events:
		if !strings.Contains(ev, `IPVS scheduler "mh" is not available in this node's kernel (module ip_vs_mh); using the default "rr"`) {
			t.Errorf("event %q does not say the scheduler is missing", ev)
		}
	default:
		t.Errorf("no Event for the Service whose scheduler is missing")
	}

	// Later syncs leave it alone: no failing writes, no writes at all.
	ipvs.ResetCalls()
	if err := p.SyncOnce(true); err != nil {
		t.Fatal(err)
	}
	if w := ipvs.Writes(); len(w) != 0 {
		t.Errorf("writes on the next full resync: %v", w)
	}
}
