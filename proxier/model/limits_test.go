package model_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// TestBuildRefusesHostileServices builds, under the default limits, the
// two objects of a tenant who would fill a node's ipsets (issue 41): a
// Service of 1,024 externalIPs × 1,025 ports (1M virtual servers), and a
// Service whose slices hold 1M endpoint ports (ten slices of 1,000
// endpoints × 100 ports). Each is refused whole, before its plan is built:
// the test also bounds the memory Build allocates for it.
func TestBuildRefusesHostileServices(t *testing.T) {
	wide := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wide"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}}
	for i := range 1024 {
		wide.Spec.ExternalIPs = append(wide.Spec.ExternalIPs, fmt.Sprintf("198.51.%d.%d", 100+i/256, i%256))
	}
	for i := range 1025 {
		wide.Spec.Ports = append(wide.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Protocol: corev1.ProtocolTCP, Port: int32(1000 + i)})
	}
	deep := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "deep"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.2", ClusterIPs: []string{"10.96.0.2"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "p0", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	var slices []*discoveryv1.EndpointSlice
	for s := range 10 {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("deep-%d", s),
			Labels: map[string]string{discoveryv1.LabelServiceName: "deep"}}, AddressType: discoveryv1.AddressTypeIPv4}
		for p := range 100 {
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", p)),
				Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8000 + p))})
		}
		for e := range 1000 {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 1+s, e/256, e%256)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(testNode.Name)})
		}
		slices = append(slices, sl)
	}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		reason string
	}{
		{"1,024 externalIPs × 1,025 ports", wide, nil, "wants 1050625 virtual servers"},
		{"slices of 1M endpoint ports", deep, slices, "hold 1000000 endpoint ports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, in := model.ServiceOf(tc.svc), model.SlicesOf(tc.slices)
			var plan model.ServicePlan
			allocated := bytesAllocated(func() { plan = model.Build(svc, in, testNode, testCfg) })
			if !strings.Contains(plan.Refused, tc.reason) {
				t.Errorf("Refused = %q, want it to say %q", plan.Refused, tc.reason)
			}
			if len(plan.VirtualServers) != 0 || len(plan.NodeEndpoints) != 0 {
				t.Errorf("a refused Service has %d virtual servers and %d node endpoints, want none",
					len(plan.VirtualServers), len(plan.NodeEndpoints))
			}
			// Parsing the slices' 10,000 endpoints costs a few MB; a
			// plan of 1M virtual or real servers would cost hundreds.
			if allocated > 16<<20 {
				t.Errorf("Build allocated %d MB for a refused Service, want under 16", allocated>>20)
			}
		})
	}
}

// TestLimitsValidate refuses negative limits; zero takes the default.
func TestLimitsValidate(t *testing.T) {
	if err := (model.Limits{VirtualServers: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "virtualServers") {
		t.Errorf("Validate(-1 virtual servers) = %v, want an error naming virtualServers", err)
	}
	if got, want := (model.Limits{SetEntries: 7}).OrDefault(), model.DefaultLimits(); got.SetEntries != 7 || got.VirtualServers != want.VirtualServers {
		t.Errorf("OrDefault = %+v, want setEntries 7 and the other defaults %+v", got, want)
	}
}

// bytesAllocated is the heap memory fn allocates (runtime.MemStats).
func bytesAllocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
