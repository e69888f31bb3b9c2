package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

// The deep copies runtime.Object asks for, written by hand: the only
// references the types hold are lists of strings.

// DeepCopyInto copies c into out, lists included.
func (c *IPVSProxyConfiguration) DeepCopyInto(out *IPVSProxyConfiguration) {
	*out = *c
	out.IPFamilies = slices.Clone(c.IPFamilies)
	out.NodePortAddresses = slices.Clone(c.NodePortAddresses)
	out.ClusterCIDRs = slices.Clone(c.ClusterCIDRs)
	out.ExternalIPCIDRs = slices.Clone(c.ExternalIPCIDRs)
	out.IPVS.ExcludeCIDRs = slices.Clone(c.IPVS.ExcludeCIDRs)
	out.IPVS.ServiceCIDRs = slices.Clone(c.IPVS.ServiceCIDRs)
}

// DeepCopy is a copy of c that shares nothing with it.
func (c *IPVSProxyConfiguration) DeepCopy() *IPVSProxyConfiguration {
	if c == nil {
		return nil
	}
	out := new(IPVSProxyConfiguration)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject is DeepCopy as a runtime.Object.
func (c *IPVSProxyConfiguration) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	return c.DeepCopy()
}
