// Package kube is the agent's own client of the apiserver: exactly the
// calls the agent makes (list and watch Services, EndpointSlices, Nodes and
// ServiceCIDRs, write Events, read /version), over client-go's REST client
// with a scheme of the three API groups it reads.
//
// client-go's Clientset, every typed client and its discovery client import
// k8s.io/client-go/kubernetes/scheme, which links and registers every
// k8s.io/api group (55 packages) and their apply configurations: about a
// fifth of the binary, pages the agent maps and never uses, and init work
// at every start. A test (TestBinaryLinksNoClientset) keeps them out of
// the binary; tests may still drive the agent with client-go's fake
// Clientset through kubetest.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
)

// Client is what the agent asks of the apiserver.
type Client interface {
	Services() ListWatcher[*corev1.ServiceList]
	EndpointSlices() ListWatcher[*discoveryv1.EndpointSliceList]
	Nodes() ListWatcher[*corev1.NodeList]
	ServiceCIDRs() ListWatcher[*networkingv1.ServiceCIDRList]
	// Events writes Events in the namespace each names (the recorder's
	// sink).
	Events() record.EventSink
	// ServerVersion reads /version, which every authenticated client may
	// read and which touches no storage.
	ServerVersion(ctx context.Context) (*version.Info, error)
}

// ListWatcher lists and watches one resource in every namespace. A typed
// client of client-go (CoreV1().Services("")) is one.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// client is Client over one REST client per API group, sharing one HTTP
// client (connections) and one rate limiter, as the Clientset shares them.
type client struct {
	core, discovery, networking rest.Interface
	params                      runtime.ParameterCodec
}

// NewForConfig returns a Client configured by cfg (its host, credentials,
// user agent, content types, QPS and burst, dialer), as
// kubernetes.NewForConfig would make the Clientset.
func NewForConfig(cfg *rest.Config) (Client, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("create Kubernetes client: burst must be above 0 when QPS is set (%v)", c.QPS)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	scheme := NewScheme()
	codecs := rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	group := func(apiPath string, gv schema.GroupVersion) (rest.Interface, error) {
		gc := c
		gc.APIPath, gc.GroupVersion, gc.NegotiatedSerializer = apiPath, &gv, codecs
		rc, err := rest.RESTClientForConfigAndClient(&gc, httpClient)
		if err != nil {
			return nil, fmt.Errorf("create Kubernetes client of %s: %w", gv, err)
		}
		return rc, nil
	}
	out := &client{params: runtime.NewParameterCodec(scheme)}
	if out.core, err = group("/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if out.discovery, err = group("/apis", discoveryv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if out.networking, err = group("/apis", networkingv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return out, nil
}

// NewScheme holds the types the agent reads and writes (core/v1,
// discovery.k8s.io/v1, networking.k8s.io/v1), and the unversioned ones of
// every answer (Status). Registering these generated types cannot fail
// but by a programming error, hence Must, as client-go's own schemes do.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(discoveryv1.AddToScheme(s))
	utilruntime.Must(networkingv1.AddToScheme(s))
	return s
}

func (c *client) Services() ListWatcher[*corev1.ServiceList] {
	return resource[*corev1.ServiceList]{c.core, "services", c.params, func() *corev1.ServiceList { return &corev1.ServiceList{} }}
}

func (c *client) EndpointSlices() ListWatcher[*discoveryv1.EndpointSliceList] {
	return resource[*discoveryv1.EndpointSliceList]{c.discovery, "endpointslices", c.params,
		func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} }}
}

func (c *client) Nodes() ListWatcher[*corev1.NodeList] {
	return resource[*corev1.NodeList]{c.core, "nodes", c.params, func() *corev1.NodeList { return &corev1.NodeList{} }}
}

func (c *client) ServiceCIDRs() ListWatcher[*networkingv1.ServiceCIDRList] {
	return resource[*networkingv1.ServiceCIDRList]{c.networking, "servicecidrs", c.params,
		func() *networkingv1.ServiceCIDRList { return &networkingv1.ServiceCIDRList{} }}
}

func (c *client) Events() record.EventSink { return eventSink{c.core} }

func (c *client) ServerVersion(ctx context.Context) (*version.Info, error) {
	body, err := c.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("decode /version: %w", err)
	}
	return &info, nil
}

// resource lists and watches one resource across namespaces (cluster
// scoped ones have none), as a typed client's List and Watch do. Errors
// are the REST client's, unwrapped: callers tell them apart by their
// status (apierrors) and the reflector by an expired version.
type resource[L runtime.Object] struct {
	rc      rest.Interface
	name    string
	params  runtime.ParameterCodec
	newList func() L
}

func (r resource[L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := r.newList()
	err := r.rc.Get().Resource(r.name).VersionedParams(&opts, r.params).Timeout(timeoutOf(opts)).Do(ctx).Into(list)
	return list, err
}

func (r resource[L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.rc.Get().Resource(r.name).VersionedParams(&opts, r.params).Timeout(timeoutOf(opts)).Watch(ctx)
}

// timeoutOf is the request's timeout the options ask (none: 0).
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
