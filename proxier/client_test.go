package proxier

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestListServices: the Services of other proxies and headless ones are
// not read, as in the proxier.
func TestListServices(t *testing.T) {
	svc := func(name string, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	}
	client := fake.NewClientset(svc("mine", nil), svc("theirs", map[string]string{"service.kubernetes.io/service-proxy-name": "other"}),
		svc("headless", map[string]string{"service.kubernetes.io/headless": ""}))
	got, err := ListServices(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "mine" {
		t.Errorf("listed %v, want only ns/mine", got)
	}
}
