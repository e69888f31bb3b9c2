package model_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:ports":{}}}` + strings.Repeat(" ", 600))}}}}
}

func keptMeta(name string, labels, annotations map[string]string) metav1.ObjectMeta {
	m := fatMeta(name, labels, annotations)
	m.GenerateName, m.Finalizers, m.OwnerReferences, m.ManagedFields = "", nil, nil, nil
	return m
}

func TestTrim(t *testing.T) {
	lastApplied := strings.Repeat("x", 900)
	fatSvc := &corev1.Service{
		ObjectMeta: fatMeta("web", map[string]string{"app": "web", "team": "a"}, map[string]string{
			"kubectl.kubernetes.io/last-applied-configuration": lastApplied,
			scheduler.AnnotationScheduler:                      "sh", scheduler.AnnotationFlags: "sh-port",
		}),
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}},
			Conditions: []metav1.Condition{{Type: "Ready", Status: "True", Reason: "Provisioned"}}},
	}
	wantSvc := &corev1.Service{
		ObjectMeta: keptMeta("web", nil, map[string]string{scheduler.AnnotationScheduler: "sh", scheduler.AnnotationFlags: "sh-port"}),
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}}},
	}

	endpoint := func(fat bool) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{"10.244.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-1"), Zone: ptr.To("z1"), Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}}}
		if fat {
			e.Hostname = ptr.To("web-0")
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-7d9c-abcde", UID: "pod-uid"}
			e.DeprecatedTopology = map[string]string{"kubernetes.io/hostname": "node-1"}
		}
		return e
	}
	sliceLabels := map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	sliceAnn := map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-01T00:00:00Z", "other": "x"}
	fatSlice := &discoveryv1.EndpointSlice{ObjectMeta: fatMeta("web-abc", sliceLabels, sliceAnn), AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{endpoint(true), endpoint(true)},
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}}}
	wantSlice := &discoveryv1.EndpointSlice{
		ObjectMeta: keptMeta("web-abc", map[string]string{discoveryv1.LabelServiceName: "web"},
			map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-01T00:00:00Z"}),
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{endpoint(false), endpoint(false)},
		Ports: fatSlice.Ports}

	taints := []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}
	fatNode := &corev1.Node{ObjectMeta: fatMeta("node-1", map[string]string{corev1.LabelTopologyZone: "z1", corev1.LabelHostname: "node-1"},
		map[string]string{"node.alpha.kubernetes.io/ttl": "0"}),
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}, Taints: taints},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.2.15"}},
			Images: []corev1.ContainerImage{{Names: []string{strings.Repeat("registry.example/image:tag", 20)}, SizeBytes: 1}}}}
	wantNode := &corev1.Node{ObjectMeta: keptMeta("node-1", map[string]string{corev1.LabelTopologyZone: "z1"}, nil),
		Spec: corev1.NodeSpec{Taints: taints}}

	for _, tc := range []struct {
		name      string
		fat, want interface{ Size() int }
	}{{"Service", fatSvc, wantSvc}, {"EndpointSlice", fatSlice, wantSlice}, {"Node", fatNode, wantNode}} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.fat.Size()
			got, err := model.Trim(tc.fat)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Trim (-want +got):\n%s", diff)
			}
			again, _ := model.Trim(got)
			if diff := cmp.Diff(tc.want, again); diff != "" {
				t.Errorf("Trim twice (-want +got):\n%s", diff)
			}
			t.Logf("%s: %d bytes (protobuf) before, %d after", tc.name, before, tc.want.Size())
		})
	}

	// Anything else passes unchanged (a tombstone, another type).
	pod := &corev1.Pod{ObjectMeta: fatMeta("p", map[string]string{"a": "b"}, nil)}
	got, _ := model.Trim(pod)
	if diff := cmp.Diff(&corev1.Pod{ObjectMeta: fatMeta("p", map[string]string{"a": "b"}, nil)}, got); diff != "" {
		t.Errorf("Trim changed a Pod:\n%s", diff)
	}
}
