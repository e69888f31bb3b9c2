package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// GroupName is the API group of ipvs-proxy's configuration file.
	GroupName = "config.ipvs-proxy.io"
	// Version is this package's version of it.
	Version = "v1alpha1"
	// Kind is the kind of the configuration file.
	Kind = "IPVSProxyConfiguration"
)

// GroupVersion is config.ipvs-proxy.io/v1alpha1.
func GroupVersion() schema.GroupVersion {
	return schema.GroupVersion{Group: GroupName, Version: Version}
}

// GroupVersionKind is the apiVersion and kind of the file.
func GroupVersionKind() schema.GroupVersionKind {
	return GroupVersion().WithKind(Kind)
}

// AddToScheme registers IPVSProxyConfiguration in scheme.
func AddToScheme(scheme *runtime.Scheme) error {
	scheme.AddKnownTypeWithName(GroupVersionKind(), &IPVSProxyConfiguration{})
	return nil
}
