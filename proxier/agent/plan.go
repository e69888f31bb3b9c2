package agent

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Ownership is the ownership rule of this configuration (model.Ownership):
// what the reconciler, `ipvs-proxy status` and `ipvs-proxy cleanup` own.
func (c Config) Ownership() model.Ownership {
	return model.Ownership{Interface: c.Interface, NodePortRange: c.NodePortRange, ExcludeCIDRs: c.ExcludeCIDRs,
		Adopt: c.AdoptInterface}
}

// Planner builds Services' plans as the sync loop does. `ipvs-proxy
// status` builds the desired state it compares the kernel with through it
// too (DesiredState), so that both want the same.
type Planner struct{ bcfg model.BuildConfig }

// Planner returns the planner of this configuration; unavailable are the
// schedulers the kernel cannot load (their Services get the default one).
func (c Config) Planner(unavailable map[string]bool) Planner {
	return Planner{bcfg: model.BuildConfig{Scheduler: c.Scheduler, IPv4: c.IPv4, IPv6: c.IPv6,
		Unavailable: unavailable, NodeWithoutIPv6: c.NodeWithoutIPv6, APIServer: c.APIServer,
		ExternalIPCIDRs: c.ExternalIPCIDRs, Limits: c.Limits, DSR: c.DSR}}
}

// OnNodeIPv6 fits the families to the node: where its kernel has no IPv6
// (hasIPv6 false, err nil), IPv6 is off and its Services are told. The
// result of sysctls.HasIPv6 goes in as it is.
func (c *Config) OnNodeIPv6(hasIPv6 bool, err error) error {
	if err != nil || !c.IPv6 || hasIPv6 {
		return err
	}
	if !c.IPv4 {
		return fmt.Errorf("--ip-families is IPv6 alone, and the node's kernel has no IPv6")
	}
	c.IPv6, c.NodeWithoutIPv6 = false, true
	return nil
}

// WithRanges is the planner with the Service ranges routed as local
// (model.BuildConfig.ServiceRanges).
func (pl Planner) WithRanges(ranges []netip.Prefix) Planner {
	pl.bcfg.ServiceRanges = ranges
	return pl
}

// WithOtherNodes is the planner with the other Nodes' addresses, each
// with its Node's name (model.BuildConfig.OtherNodes).
func (pl Planner) WithOtherNodes(others map[netip.Addr]string) Planner {
	pl.bcfg.OtherNodes = others
	return pl
}

// Plan is svc's plan on node; nil when svc is gone (nil) or is one the
// proxier leaves out (model.Skip).
func (pl Planner) Plan(svc *model.Service, slices []*model.EndpointSlice, node model.NodeInfo) *model.ServicePlan {
	if svc == nil || model.Skip(svc) {
		return nil
	}
	plan := model.Build(svc, slices, node, pl.bcfg)
	return &plan
}

// DesiredState is what the Services want of the kernel, all at once: the
// plans of the Services (slicesOf gives each Service's EndpointSlices),
// built by the sync loop's Planner, and the virtual servers they want with
// the Service holding each, decided by the reconciler's rule (model.Assign,
// which TestReconcilerClaimsMatchAssign holds equal to the reconciler's
// claims), with the conflicts.
func DesiredState(cfg Config, pl Planner, services []corev1.Service, slicesOf map[types.NamespacedName][]*discoveryv1.EndpointSlice,
	node model.NodeInfo) (model.Desired, []model.Conflict, []*model.ServicePlan) {
	var plans []*model.ServicePlan
	for i := range services {
		svc := &services[i]
		sl := slicesOf[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}]
		if plan := pl.Plan(model.ServiceOf(svc), model.SlicesOf(sl), node); plan != nil {
			plans = append(plans, plan)
		}
	}
	want, conflicts := model.Assign(plans, cfg.Ownership())
	return want, conflicts, plans
}
