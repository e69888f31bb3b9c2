package agent

// Service ranges routed as local: where they come from (the flag, or the
// cluster's ServiceCIDR objects) and how a change reaches the plans, the
// reconciler and the consumers.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
)

// RangeConsumer is a Consumer that must know the Service ranges routed as
// local (the iptables glue protects their addresses).
type RangeConsumer interface {
	SetServiceRanges(ranges []netip.Prefix)
}

// RoutableRanges keeps the prefixes that can be routed as local through
// the interface: IPv4 ones. Without a preferred source on the route, the
// node's own connections to an IPv6 range would come from ::1, which
// cannot leave the node (netlinkutil.LocalRoute): IPv6 clusterIPs are
// bound one by one, as before. Sorted, each once.
func RoutableRanges(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is4() && p.Bits() > 0 {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// serviceCIDRPrefixes reads the prefixes of ServiceCIDR objects, with the
// object each comes from (by masked prefix, for Events); a malformed one
// is skipped (the apiserver validates them).
func serviceCIDRPrefixes(objs []*networkingv1.ServiceCIDR) ([]netip.Prefix, map[netip.Prefix]*corev1.ObjectReference) {
	var out []netip.Prefix
	sources := map[netip.Prefix]*corev1.ObjectReference{}
	for _, o := range objs {
		for _, s := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p)
				sources[p.Masked()] = &corev1.ObjectReference{Kind: "ServiceCIDR", APIVersion: "networking.k8s.io/v1",
					Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion}
			}
		}
	}
	return out, sources
}

// ListServiceRanges is the Service ranges to route under cfg, as run
// finds them: cfg.ServiceRanges when given, else the cluster's ServiceCIDR
// objects (networking.k8s.io/v1); none unless cfg.RouteServiceRanges.
// `ipvs-proxy status` builds its desired state with them.
func ListServiceRanges(ctx context.Context, client kube.Client, cfg Config) ([]netip.Prefix, error) {
	if !cfg.RouteServiceRanges {
		return nil, nil
	}
	if len(cfg.ServiceRanges) > 0 {
		return RoutableRanges(cfg.ServiceRanges), nil
	}
	list, err := client.ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ServiceCIDRs: %w", err)
	}
	objs := make([]*networkingv1.ServiceCIDR, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	prefixes, _ := serviceCIDRPrefixes(objs)
	return RoutableRanges(prefixes), nil
}

// setRanges records the Service ranges to route, with the objects that
// asked for them (sources, by prefix; nil when configured): a change
// rebuilds every plan and reaches the reconciler and the consumers at the
// next sync.
func (t *tracker) setRanges(ranges []netip.Prefix, sources map[netip.Prefix]*corev1.ObjectReference) {
	ranges = RoutableRanges(ranges)
	t.mu.Lock()
	changed := !slices.Equal(ranges, t.ranges.prefixes) || !t.ranges.known
	if changed {
		t.ranges = rangeFacts{prefixes: ranges, sources: sources, routed: t.ranges.routed, refused: t.ranges.refused,
			known: true, changed: true}
		t.queuedLocked()
	}
	t.mu.Unlock()
	if changed {
		if len(ranges) == 0 {
			t.log.Info("no IPv4 Service range to route as local: every clusterIP is bound")
		} else {
			t.log.Info("Service ranges routed as local", zap.Stringers("ranges", ranges))
		}
		t.wake()
	}
}

// probeServiceCIDRs lists the ServiceCIDR API once it answers: an error
// when the API is not served or not allowed (absent before Kubernetes
// 1.33, a ClusterRole without the right), which decides binding for the
// life of the process. Any other error (the apiserver not reachable yet,
// a timeout) is retried with backoff, logged, until ctx ends: the first
// full sync waits for the apiserver anyway, and a node that booted before
// its apiserver answered must not bind for good.
func (t *tracker) probeServiceCIDRs(ctx context.Context, client kube.Client) error {
	delay := 500 * time.Millisecond
	for {
		_, err := client.ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsUnauthorized(err),
			apierrors.IsMethodNotSupported(err):
			return fmt.Errorf("list ServiceCIDRs: %w", err)
		}
		t.log.Warn("cannot list the cluster's ServiceCIDRs yet; retrying", zap.Duration("in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("list ServiceCIDRs: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// watchServiceCIDRs follows the cluster's ServiceCIDR objects into the
// ranges (setRanges), with an informer of infs: an apiserver that cannot
// be reached is waited for as the other informers wait for it
// (untilReachable). An API that cannot be listed (a cluster before
// Kubernetes 1.33, a ClusterRole without the right) is an error, and the
// caller binds one address per clusterIP instead. The returned func tells
// when the first list has been handled.
func (t *tracker) watchServiceCIDRs(ctx context.Context, client kube.Client, infs *informerSet) (cache.InformerSynced, error) {
	if err := t.probeServiceCIDRs(ctx, client); err != nil {
		return nil, err
	}
	inf := serviceCIDRInformer(client, t.reach)
	update := func() {
		var objs []*networkingv1.ServiceCIDR
		for _, o := range inf.GetStore().List() {
			if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
				objs = append(objs, sc)
			}
		}
		t.setRanges(serviceCIDRPrefixes(objs))
	}
	reg, err := infs.add(inf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	})
	if err != nil {
		return nil, fmt.Errorf("watch ServiceCIDRs: %w", err)
	}
	return reg.HasSynced, nil
}
