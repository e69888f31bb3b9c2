package model_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// fatMeta is metadata as the apiserver serves it after kubectl apply and a
// few controllers.
func fatMeta(name string, labels, annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "uid-" + metav1.NamespaceDefault, ResourceVersion: "42",
		GenerateName: name + "-", CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)),
		Labels: labels, Annotations: annotations, Finalizers: []string{"example.com/keep"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "u"}},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:ports":{}}}` + strings.Repeat(" ", 600))}}}
}

func TestCompact(t *testing.T) {
	lastApplied := strings.Repeat("x", 900)
	fatSvc := &corev1.Service{
		ObjectMeta: fatMeta("web", map[string]string{"app": "web", "team": "a"}, map[string]string{
			"kubectl.kubernetes.io/last-applied-configuration": lastApplied,
			scheduler.AnnotationScheduler:                      "sh", scheduler.AnnotationFlags: "sh-port",
		}),
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, ExternalIPs: []string{"203.0.113.5"},
			LoadBalancerSourceRanges: []string{"192.0.2.0/24"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster), HealthCheckNodePort: 32000,
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}},
			Selector:              map[string]string{"app": "web"},
			Ports:                 []corev1.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080, TargetPort: intstr.FromString("web")}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: "192.0.2.1", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}, {Hostname: "lb.example"}}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: "True", Reason: "Provisioned"}}},
	}
	wantSvc := &model.Service{Namespace: "ns", Name: "web", UID: "uid-default", ResourceVersion: "42",
		Created:     time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Annotations: map[string]string{scheduler.AnnotationScheduler: "sh", scheduler.AnnotationFlags: "sh-port"},
		Spec: model.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, ExternalIPs: []string{"203.0.113.5"},
			LoadBalancerSourceRanges: []string{"192.0.2.0/24"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster), HealthCheckNodePort: 32000,
			SessionAffinity: corev1.ServiceAffinityClientIP, AffinityTimeout: ptr.To[int32](60),
			Ports: []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}},
		Status: model.ServiceStatus{LoadBalancer: model.LoadBalancerStatus{Ingress: []model.LoadBalancerIngress{
			{IP: "192.0.2.1", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}}},
	}

	endpoint := func(ready *bool, nodeHint bool) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{"10.244.0.5", "10.244.0.6"},
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: ptr.To(false)},
			NodeName:   ptr.To("node-1"), Zone: ptr.To("z1"), Hostname: ptr.To("web-0"),
			TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-7d9c-abcde", UID: "pod-uid"},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-1"}}
		if nodeHint {
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-1"}}}
		} else {
			e.Hints = &discoveryv1.EndpointHints{} // empty: no hints
		}
		return e
	}
	sliceLabels := map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	sliceAnn := map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-01T00:00:00.5Z", "other": "x"}
	fatSlice := &discoveryv1.EndpointSlice{ObjectMeta: fatMeta("web-abc", sliceLabels, sliceAnn), AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{endpoint(nil, true), endpoint(ptr.To(false), false)},
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}}}
	wantSlice := &model.EndpointSlice{Namespace: "ns", Name: "web-abc", ResourceVersion: "42", Service: "web",
		Triggered: time.Date(2026, 11, 1, 0, 0, 0, 5e8, time.UTC), AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []model.Endpoint{
			{Address: netip.MustParseAddr("10.244.0.5"), Ready: true, Serving: true, NodeName: "node-1", Zone: "z1",
				Hints: &model.EndpointHints{ForNodes: []string{"node-1"}, ForZones: []string{"z1"}}},
			{Address: netip.MustParseAddr("10.244.0.5"), Ready: false, Serving: true, NodeName: "node-1", Zone: "z1"},
		},
		Ports: fatSlice.Ports}

	taints := []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}
	fatNode := &corev1.Node{ObjectMeta: fatMeta("node-1", map[string]string{corev1.LabelTopologyZone: "z1", corev1.LabelHostname: "node-1"},
		map[string]string{"node.alpha.kubernetes.io/ttl": "0"}),
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}, Taints: taints},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.2.15"}},
			Images: []corev1.ContainerImage{{Names: []string{strings.Repeat("registry.example/image:tag", 20)}, SizeBytes: 1}}}}
	fatNode.Status.Addresses = append(fatNode.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "node-1"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.4"}, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "10.0.2.15"})
	wantNode := &model.Node{Name: "node-1", UID: fatNode.UID, ResourceVersion: fatNode.ResourceVersion, Zone: "z1", Leaving: true,
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")},
		Addresses: []netip.Addr{netip.MustParseAddr("10.0.2.15"), netip.MustParseAddr("203.0.113.4")}}

	svcBefore, sliceBefore := fatSvc.DeepCopy(), fatSlice.DeepCopy()
	for _, tc := range []struct {
		name      string
		fat, want any
	}{{"Service", fatSvc, wantSvc}, {"EndpointSlice", fatSlice, wantSlice}, {"Node", fatNode, wantNode}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := model.Compact(tc.fat)
			if err != nil {
				t.Fatal(err)
			}
			addrs := cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})
			if diff := cmp.Diff(tc.want, got, addrs); diff != "" {
				t.Errorf("Compact (-want +got):\n%s", diff)
			}
			again, _ := model.Compact(got)
			if diff := cmp.Diff(tc.want, again, addrs); diff != "" {
				t.Errorf("Compact twice (-want +got):\n%s", diff)
			}
		})
	}
	if diff := cmp.Diff(svcBefore, fatSvc); diff != "" {
		t.Errorf("Compact changed the Service:\n%s", diff)
	}
	if diff := cmp.Diff(sliceBefore, fatSlice); diff != "" {
		t.Errorf("Compact changed the EndpointSlice:\n%s", diff)
	}

	// An informer's store keys the compact objects and reads their
	// resource version (it tells a resync from an update by it).
	for _, obj := range []any{wantSvc, wantSlice} {
		key, err := cache.MetaNamespaceKeyFunc(obj)
		if err != nil {
			t.Fatal(err)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		if want := "ns/" + m.GetName(); key != want || m.GetResourceVersion() != "42" {
			t.Errorf("%T: key %q, resource version %q; want %q, 42", obj, key, m.GetResourceVersion(), want)
		}
	}
	if key, err := cache.MetaNamespaceKeyFunc(wantNode); err != nil || key != "node-1" {
		t.Errorf("Node: key %q, %v; want node-1 (cluster-scoped)", key, err)
	}
	if ref := wantSvc.Ref(); ref.Kind != "Service" || ref.APIVersion != "v1" || ref.UID != "uid-default" || ref.Namespace != "ns" || ref.Name != "web" {
		t.Errorf("Ref() = %+v", ref)
	}

	// Anything else passes unchanged (a tombstone, another type).
	pod := &corev1.Pod{ObjectMeta: fatMeta("p", map[string]string{"a": "b"}, nil)}
	got, _ := model.Compact(pod)
	if diff := cmp.Diff(&corev1.Pod{ObjectMeta: fatMeta("p", map[string]string{"a": "b"}, nil)}, got); diff != "" {
		t.Errorf("Compact changed a Pod:\n%s", diff)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: wantSvc}
	if got, _ := model.Compact(tomb); !cmp.Equal(tomb, got) {
		t.Errorf("Compact changed a tombstone: %+v", got)
	}
}

// TestSliceOfAddressesAndNames: an endpoint's first address is kept
// parsed, one that does not parse as written (by its index) for Build, and
// node and zone names decoded apart share one copy.
func TestSliceOfAddressesAndNames(t *testing.T) {
	decoded := func(s string) *string { return ptr.To(strings.Clone(s)) } // as each decode makes its own
	ep := func(addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, NodeName: decoded("node-1"), Zone: decoded("z1")}
	}
	in := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{ep("10.1.0.1", "10.1.0.9"), ep("bogus"), ep(), ep("010.001.000.003"), ep("fd01::1")}}
	got := model.SliceOf(in)
	wantAddrs := []string{"10.1.0.1", "invalid IP", "invalid IP", "invalid IP", "fd01::1"}
	for i, e := range got.Endpoints {
		if e.Address.String() != wantAddrs[i] {
			t.Errorf("endpoint %d: Address %v, want %s", i, e.Address, wantAddrs[i])
		}
	}
	if want := map[int]string{1: "bogus", 3: "010.001.000.003"}; !cmp.Equal(got.Unparsed, want) {
		t.Errorf("Unparsed = %v, want %v", got.Unparsed, want)
	}
	for i, want := range []string{"10.1.0.1", "bogus", "", "010.001.000.003", "fd01::1"} {
		if w := got.WrittenAddress(i); w != want {
			t.Errorf("WrittenAddress(%d) = %q, want %q", i, w, want)
		}
	}
	for i, e := range got.Endpoints[1:] {
		if unsafe.StringData(e.NodeName) != unsafe.StringData(got.Endpoints[0].NodeName) ||
			unsafe.StringData(e.Zone) != unsafe.StringData(got.Endpoints[0].Zone) {
			t.Errorf("endpoint %d: node %q and zone %q are copies of their own", i+1, e.NodeName, e.Zone)
		}
	}
	if valid := model.SliceOf(&discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{ep("10.1.0.1")}}); valid.Unparsed != nil {
		t.Errorf("a slice whose addresses all parse has Unparsed %v", valid.Unparsed)
	}
}
