package model

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Trim drops, in place, what neither Build nor the proxier ever reads from a
// Service, an EndpointSlice or a Node, so that the informers' caches hold
// only that: an informer transform (cache.TransformFunc) calls it on every
// object before it is stored. Kept: the identity (namespace, name, UID,
// resourceVersion, creation and deletion times: Events and conflicts need
// them), the Service's spec and load-balancer ingress and its scheduler
// annotations, the slice's endpoints (addresses, conditions, node, zone,
// hints), ports, address type, service-name label and change-trigger time,
// and the Node's zone label and taints. Dropped: managed fields, owner
// references, finalizers, other labels and annotations (kubectl's
// last-applied-configuration among them), the Service's selector and
// status conditions, the endpoints' target references and hostnames, the
// Node's status (its image list alone can be kilobytes). Other types pass
// unchanged. Trimming twice changes nothing.
func Trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		if o == nil {
			break
		}
		trimMeta(&o.ObjectMeta, func(k string) bool {
			return k == scheduler.AnnotationScheduler || k == scheduler.AnnotationFlags
		}, nil)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discoveryv1.EndpointSlice:
		if o == nil {
			break
		}
		trimMeta(&o.ObjectMeta, func(k string) bool { return k == corev1.EndpointsLastChangeTriggerTime },
			func(k string) bool { return k == discoveryv1.LabelServiceName })
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.Hostname, e.DeprecatedTopology = nil, nil, nil
		}
	case *corev1.Node:
		if o == nil {
			break
		}
		trimMeta(&o.ObjectMeta, nil, func(k string) bool { return k == corev1.LabelTopologyZone })
		o.Status = corev1.NodeStatus{}
		o.Spec.PodCIDR, o.Spec.PodCIDRs, o.Spec.ConfigSource = "", nil, nil
	}
	return obj, nil
}

// trimMeta keeps the identity and the annotations and labels whose keys
// keepAnnotation and keepLabel accept (nil: none).
func trimMeta(m *metav1.ObjectMeta, keepAnnotation, keepLabel func(string) bool) {
	m.ManagedFields, m.OwnerReferences, m.Finalizers, m.GenerateName = nil, nil, nil, ""
	m.Annotations = keepKeys(m.Annotations, keepAnnotation)
	m.Labels = keepKeys(m.Labels, keepLabel)
}

func keepKeys(in map[string]string, keep func(string) bool) map[string]string {
	if keep == nil {
		return nil
	}
	var out map[string]string
	for k, v := range in {
		if keep(k) {
			if out == nil {
				out = make(map[string]string, 1)
			}
			out[k] = v
		}
	}
	return out
}
