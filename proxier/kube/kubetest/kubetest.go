// Package kubetest drives the agent's client (kube.Client) with
// client-go's Clientset, mostly its fake (k8s.io/client-go/kubernetes/fake):
// its reactors, its object tracker and its recorded actions. Only tests
// import it: the Clientset links every API group, which the agent's binary
// leaves out (see package kube).
package kubetest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
)

// New is cs as a kube.Client; nil (no client) is nil.
func New(cs kubernetes.Interface) kube.Client {
	if cs == nil {
		return nil
	}
	return clientset{cs}
}

type clientset struct{ cs kubernetes.Interface }

func (c clientset) Services() kube.ListWatcher[*corev1.ServiceList] {
	return c.cs.CoreV1().Services(corev1.NamespaceAll)
}

func (c clientset) EndpointSlices() kube.ListWatcher[*discoveryv1.EndpointSliceList] {
	return c.cs.DiscoveryV1().EndpointSlices(corev1.NamespaceAll)
}

func (c clientset) Nodes() kube.ListWatcher[*corev1.NodeList] { return c.cs.CoreV1().Nodes() }

func (c clientset) ServiceCIDRs() kube.ListWatcher[*networkingv1.ServiceCIDRList] {
	return c.cs.NetworkingV1().ServiceCIDRs()
}

func (c clientset) Events() record.EventSink {
	return &typedcorev1.EventSinkImpl{Interface: c.cs.CoreV1().Events(corev1.NamespaceAll)}
}

// ServerVersion asks the Clientset's discovery client, which takes no
// context.
func (c clientset) ServerVersion(context.Context) (*version.Info, error) {
	return c.cs.Discovery().ServerVersion()
}
