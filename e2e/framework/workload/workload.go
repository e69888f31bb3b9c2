// Package workload creates the benchmarks' Services: N Services, each with
// one port and an EndpointSlice of two ready endpoints, as the bench in the
// VM (e2e/bench) and the host's memory bench (e2e/heapbench) both need.
package workload

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
)

// Namespace holds the benchmarks' Services.
const Namespace = "bench"

// ServiceName names Service i (and its EndpointSlice).
func ServiceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// EndpointAddr is endpoint k (0 or 1) of Service i, in 10.176.0.0/12. The
// two endpoints of a Service are 16 addresses apart, so that a change can
// move an endpoint to its neighbour (the last bit flipped) and back.
func EndpointAddr(i, k int) string {
	j := (i*2+k)*16 + 16
	return fmt.Sprintf("10.%d.%d.%d", 176+j>>16, (j>>8)&255, j&255)
}

// CreateServices creates Services from..to-1 in Namespace, each with an
// EndpointSlice of two ready endpoints, with 16 workers. The namespace
// must exist.
func CreateServices(ctx context.Context, c kubernetes.Interface, from, to int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				err := createService(ctx, c, i)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for i := from; i < to; i++ {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	return firstErr
}

func createService(ctx context.Context, c kubernetes.Interface, i int) error {
	name := ServiceName(i)
	_, err := c.CoreV1().Services(Namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{bed.Port("http", corev1.ProtocolTCP, 80)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service %s/%s: %w", Namespace, name, err)
	}
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(bed.BackendPort))}},
	}
	for k := 0; k < 2; k++ {
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{EndpointAddr(i, k)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, eps, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s/%s: %w", Namespace, name, err)
	}
	return nil
}
