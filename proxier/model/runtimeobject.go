package model

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The compact objects are runtime.Objects, so that a lister can hand an
// informer a list of them (the agent's paged initial lists keep each page
// only in this form). They carry no kind: nothing encodes them.

var (
	_ runtime.Object = (*Service)(nil)
	_ runtime.Object = (*EndpointSlice)(nil)
	_ runtime.Object = (*Node)(nil)
)

// GetObjectKind implements runtime.Object: a compact Node has no kind.
func (n *Node) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (n *Node) DeepCopyObject() runtime.Object {
	if n == nil {
		return (*Node)(nil)
	}
	c := *n
	c.PodCIDRs, c.Addresses = slices.Clone(n.PodCIDRs), slices.Clone(n.Addresses)
	return &c
}

// GetObjectKind implements runtime.Object: a compact Service has no kind.
func (s *Service) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// GetObjectKind implements runtime.Object: a compact slice has no kind.
func (s *EndpointSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (s *Service) DeepCopyObject() runtime.Object {
	if s == nil {
		return (*Service)(nil)
	}
	c := *s
	c.Annotations = maps.Clone(s.Annotations)
	sp := &c.Spec
	sp.ClusterIPs = slices.Clone(sp.ClusterIPs)
	sp.IPFamilies = slices.Clone(sp.IPFamilies)
	sp.ExternalIPs = slices.Clone(sp.ExternalIPs)
	sp.LoadBalancerSourceRanges = slices.Clone(sp.LoadBalancerSourceRanges)
	sp.InternalTrafficPolicy = clonePtr(sp.InternalTrafficPolicy)
	sp.AffinityTimeout = clonePtr(sp.AffinityTimeout)
	sp.Ports = slices.Clone(sp.Ports)
	lb := &c.Status.LoadBalancer
	lb.Ingress = slices.Clone(lb.Ingress)
	for i := range lb.Ingress {
		lb.Ingress[i].IPMode = clonePtr[corev1.LoadBalancerIPMode](lb.Ingress[i].IPMode)
	}
	return &c
}

// DeepCopyObject implements runtime.Object.
func (s *EndpointSlice) DeepCopyObject() runtime.Object {
	if s == nil {
		return (*EndpointSlice)(nil)
	}
	c := *s
	c.Ports = slices.Clone(s.Ports)
	for i := range c.Ports {
		p := &c.Ports[i]
		p.Name, p.Protocol, p.Port, p.AppProtocol = clonePtr(p.Name), clonePtr(p.Protocol), clonePtr(p.Port), clonePtr(p.AppProtocol)
	}
	c.Endpoints = slices.Clone(s.Endpoints)
	c.Unparsed = maps.Clone(s.Unparsed)
	for i := range c.Endpoints {
		e := &c.Endpoints[i]
		if e.Hints != nil {
			h := EndpointHints{ForNodes: slices.Clone(e.Hints.ForNodes), ForZones: slices.Clone(e.Hints.ForZones)}
			e.Hints = &h
		}
	}
	return &c
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
