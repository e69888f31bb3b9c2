// Package workload creates the benchmarks' Services: N Services, each with
// one port and an EndpointSlice of two ready endpoints (or more), as the
// bench in the VM (e2e/cmd/bench) and the host's memory bench (e2e/cmd/heapbench)
// both need.
package workload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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

// EndpointAddr is endpoint k of Service i when each has per endpoints, in
// 10.176.0.0/12. Endpoints are at even addresses, so that a change can
// move one to its neighbour (the last bit flipped) and back; with two per
// Service they are 16 addresses apart (the bench's first layout, kept),
// and from the 32,768th Service on, whose endpoints would leave the range,
// they take the 8th address of each 16 (up to 65,534 Services); with
// more, 2 apart (5,000 Services × 50 endpoints fit: 500,000 addresses).
func EndpointAddr(i, k, per int) string {
	const sparse = 1<<15 - 1 // Services of two endpoints 16 apart
	j := (i*per+k)*2 + 16
	switch {
	case per <= 2 && i < sparse:
		j = (i*per+k)*16 + 16
	case per <= 2:
		j = ((i-sparse)*per+k)*16 + 16 + 8
	}
	return fmt.Sprintf("10.%d.%d.%d", 176+j>>16, (j>>8)&255, j&255)
}

// MaxEndpoints is the most endpoints per Service that EndpointAddr keeps
// inside 10.176.0.0/12 at n Services (0: past the 65,534 Services its
// layout of two each holds).
func MaxEndpoints(n int) int {
	if n > 2*(1<<15-1) {
		return 0
	}
	return (1<<20 - 32) / 2 / max(n, 1)
}

// CreateServices creates Services from..to-1 in Namespace, each with an
// EndpointSlice of two ready endpoints, with 16 workers. The namespace
// must exist.
func CreateServices(ctx context.Context, c kubernetes.Interface, from, to int) error {
	return CreateServicesWith(ctx, c, from, to, 2)
}

// CreateServicesWith is CreateServices with per endpoints per Service
// (one EndpointSlice: at most 1,000).
func CreateServicesWith(ctx context.Context, c kubernetes.Interface, from, to, per int) error {
	if per < 1 || per > 1000 || per > MaxEndpoints(to) {
		return fmt.Errorf("workload: %d endpoints per Service at %d Services: want 1..%d", per, to, min(1000, MaxEndpoints(to)))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				err := createService(ctx, c, i, per)
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

func createService(ctx context.Context, c kubernetes.Interface, i, per int) error {
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
	for k := 0; k < per; k++ {
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{EndpointAddr(i, k, per)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(Namespace).Create(ctx, eps, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s/%s: %w", Namespace, name, err)
	}
	return nil
}

// DeleteServices deletes every Service and EndpointSlice in Namespace and
// waits until none is left.
func DeleteServices(ctx context.Context, c kubernetes.Interface) error {
	// Services have no delete-collection: one delete each, 16 at a time.
	list, err := c.CoreV1().Services(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services in %s: %w", Namespace, err)
	}
	errs := make([]error, len(list.Items))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range list.Items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = c.CoreV1().Services(Namespace).Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete services in %s: %w", Namespace, err)
	}
	if err := c.DiscoveryV1().EndpointSlices(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete endpointslices in %s: %w", Namespace, err)
	}
	for {
		svcs, err := c.CoreV1().Services(Namespace).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return err
		}
		eps, err := c.DiscoveryV1().EndpointSlices(Namespace).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return err
		}
		if len(svcs.Items) == 0 && len(eps.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
