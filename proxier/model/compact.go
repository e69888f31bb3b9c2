package model

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Compact is the informers' transform (cache.TransformFunc): it turns
// every object into what the agent reads of it before the informer stores
// it. A Service becomes a *Service (ServiceOf), an EndpointSlice an
// *EndpointSlice (SliceOf): the handlers and the caches never see the API
// objects, whose maps, pointers and unread strings (managed fields,
// kubectl's last-applied-configuration, the selector, the endpoints'
// target references) the collector then frees. A Node becomes a *Node
// (NodeOf: its zone, podCIDRs, addresses and whether it is leaving; its
// status, with the image list, can be kilobytes). Objects already compact,
// tombstones and other types
// pass unchanged, so Compact may run twice (a watch-list runs it twice).
//
// The compact types are not runtime.Objects: client-go keys and versions
// them through GetObjectMeta, which is all its informers ask; its
// watch-list consistency detector (KUBE_WATCHLIST_INCONSISTENCY_DETECTOR,
// a switch for client-go's own CI) would not accept them.
func Compact(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		if o != nil {
			return ServiceOf(o), nil
		}
	case *discoveryv1.EndpointSlice:
		if o != nil {
			return SliceOf(o), nil
		}
	case *corev1.Node:
		if o != nil {
			return NodeOf(o), nil
		}
	}
	return obj, nil
}

// keepKeys keeps the entries whose keys keep accepts (nil: none).
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
