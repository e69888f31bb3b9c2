package bed

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Port is a Service port that targets the backends' BackendPort.
func Port(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: proto, TargetPort: intstr.FromInt32(BackendPort)}
}

// SetEndpoints creates or replaces the Service's EndpointSlice of one
// family (named <service>-<family>) so that it lists the backends, ready,
// in zone Zone on their nodes, with one slice port per Service port. mutate
// may change each endpoint (conditions, hints).
func (b *Bed) SetEndpoints(ctx context.Context, svc *corev1.Service, family discoveryv1.AddressType, bes []Backend, mutate ...func(*discoveryv1.Endpoint)) error {
	name := svc.Name + "-" + strings.ToLower(string(family))
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "bed.ipvs-proxy.io",
		}},
		AddressType: family,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range svc.Spec.Ports {
		eps.Ports = append(eps.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(int32(BackendPort))})
	}
	for _, be := range bes {
		addr := be.Addr
		if family == discoveryv1.AddressTypeIPv6 {
			addr = be.Addr6
		}
		ep := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To(be.Node), Zone: ptr.To(Zone)}
		for _, m := range mutate {
			m(&ep)
		}
		eps.Endpoints = append(eps.Endpoints, ep)
	}
	c := b.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	old, err := c.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		eps.ResourceVersion = old.ResourceVersion
		_, err = c.Update(ctx, eps, metav1.UpdateOptions{})
	} else {
		_, err = c.Create(ctx, eps, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("bed: set endpointslice %s/%s: %w", svc.Namespace, name, err)
	}
	return nil
}
