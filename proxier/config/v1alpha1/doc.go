// Package v1alpha1 is version v1alpha1 of ipvs-proxy's configuration file:
// kind IPVSProxyConfiguration in the API group config.ipvs-proxy.io, read
// by `ipvs-proxy run --config` (and preflight and status).
//
// The group is a subdomain of ipvs-proxy.io, the domain of ipvs-proxy's
// annotations and labels (ipvs-proxy.io/scheduler), with config. in front
// as kube-proxy's (kubeproxy.config.k8s.io) and the kubelet's
// (kubelet.config.k8s.io) configuration groups have it: a file, not a
// resource of the apiserver.
//
// The fields follow kube-proxy's KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1) where they mean the same: the same
// names, in the same groups (clientConnection, ipvs, iptables, conntrack,
// detectLocal, logging). Every field is an option of `ipvs-proxy run`;
// package config (the parent) maps them to its Options, applies the
// defaults under the file's values and validates the result. The types
// here only give the file its shape, which is decoded strictly.
package v1alpha1
