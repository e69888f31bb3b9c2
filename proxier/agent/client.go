package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// dialTimeout is how long the agent waits for the apiserver to accept a
// TCP connection: three SYNs (sent at 0, 1 and 3 s). client-go's dialer
// waits 30 s, so that after an apiserver (or the path to it) that dropped
// every packet comes back, a list or watch could still sit in a dial begun
// during the outage for up to 15 s until its next SYN, or until the 30 s
// and then untilReachable's wait (TestChaosAPIServerLongOutage/blackhole).
const dialTimeout = 5 * time.Second

// TuneClientConfig sets up cfg the way the agent talks to the apiserver:
// protobuf, which is smaller and cheaper to decode than JSON for 10,000s of
// Services and EndpointSlices, no client-side throttling of the cold
// start's lists and watches, and a dial that gives up on a silent
// apiserver after dialTimeout (with client-go's TCP keepalive, 30 s).
// userAgent names the client.
func TuneClientConfig(cfg *rest.Config, userAgent string) {
	cfg.UserAgent = userAgent
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 50, 100
	cfg.Dial = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
}

// NewClient returns a client of the apiserver configured by the kubeconfig
// file, or, when it is empty, by the pod's in-cluster configuration, tuned
// as TuneClientConfig says: the agent's own client (package kube), which
// links only the API groups the agent reads.
func NewClient(kubeconfig, userAgent string) (kube.Client, error) {
	cfg, err := clientConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	TuneClientConfig(cfg, userAgent)
	return kube.NewForConfig(cfg) // its errors say what they create
}

// clientConfig loads the kubeconfig file, or, when it is empty, the pod's
// in-cluster configuration.
func clientConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("load Kubernetes client configuration: %w", err)
	}
	return cfg, nil
}

// APIServerAddresses are the addresses of the apiserver that the client
// configuration names (model.BuildConfig.APIServer): its host when it is
// an IP address, else what the host resolves to now (within 2 s; nothing,
// logged, if it does not resolve).
func APIServerAddresses(ctx context.Context, kubeconfig string, log *zap.Logger) []netip.Addr {
	cfg, err := clientConfig(kubeconfig)
	if err != nil {
		return nil // NewClient reports it
	}
	if kubeconfig == "" {
		log.Info("in-cluster configuration: the apiserver is reached through the kubernetes Service; externalIPs are checked against its clusterIP, not the apiserver's own addresses",
			zap.String("host", cfg.Host))
	}
	return hostAddresses(ctx, cfg.Host, net.DefaultResolver, log)
}

// hostAddresses resolves the host of an apiserver URL ("https://h:6443",
// or a bare "h:6443").
func hostAddresses(ctx context.Context, server string, r *net.Resolver, log *zap.Logger) []netip.Addr {
	host := server
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host = u.Hostname()
	} else if h, _, err := net.SplitHostPort(server); err == nil {
		host = h
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		log.Warn("cannot resolve the apiserver's host; externalIPs are not checked against it", zap.String("host", host), zap.Error(err))
		return nil
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs
}

// ErrNoAPI means there is no Kubernetes configuration to read Services with.
var ErrNoAPI = errors.New("no Kubernetes configuration (no --kubeconfig, and not in a cluster)")

// NewClientIfConfigured is NewClient for the commands that work without the
// API too (preflight, status): ErrNoAPI when there is neither a kubeconfig
// nor an in-cluster configuration.
func NewClientIfConfigured(kubeconfig, userAgent string) (kube.Client, error) {
	if kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, ErrNoAPI
	}
	return NewClient(kubeconfig, userAgent)
}

// ServiceSelector leaves out the Services (and their EndpointSlices) that
// the proxier leaves out: another proxy's, and headless ones.
const ServiceSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// ListServices lists the Services the proxier serves (ServiceSelector), in
// pages.
func ListServices(ctx context.Context, client kube.Client) ([]corev1.Service, error) {
	var out []corev1.Service
	opts := metav1.ListOptions{LabelSelector: ServiceSelector, Limit: listPage}
	for {
		list, err := client.Services().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list Services: %w", err)
		}
		out = append(out, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// ListEndpointSlices lists the EndpointSlices of the Services the proxier
// serves (ServiceSelector), in pages, by Service.
func ListEndpointSlices(ctx context.Context, client kube.Client) (map[types.NamespacedName][]*discoveryv1.EndpointSlice, error) {
	slicesOf := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	opts := metav1.ListOptions{LabelSelector: ServiceSelector, Limit: listPage}
	for {
		list, err := client.EndpointSlices().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list EndpointSlices: %w", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
				n := types.NamespacedName{Namespace: s.Namespace, Name: svc}
				slicesOf[n] = append(slicesOf[n], s)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return slicesOf, nil
		}
	}
}

// ListNodes lists every Node, in pages, each kept compact (model.Node).
func ListNodes(ctx context.Context, client kube.Client) ([]*model.Node, error) {
	var out []*model.Node
	opts := metav1.ListOptions{Limit: listPage}
	for {
		list, err := client.Nodes().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list Nodes: %w", err)
		}
		for i := range list.Items {
			out = append(out, model.NodeOf(&list.Items[i]))
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// NodePodCIDRs reads the node's podCIDRs (--detect-local-mode NodeCIDR),
// waiting for them as kube-proxy does: the node controller may not have
// allocated them yet. A change later needs a restart, as in kube-proxy.
// It lists the Node by name, which the ClusterRole's list of Nodes allows
// (it grants no get); a list refused (Forbidden, Unauthorized) is an error
// at once, not a wait.
func NodePodCIDRs(ctx context.Context, client kube.Client, node string, log *zap.Logger) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.Nodes().List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return false, fmt.Errorf("list Nodes (the ClusterRole must allow list on nodes): %w", err)
		}
		if err != nil {
			log.Info("waiting for the Node's podCIDRs (--detect-local-mode NodeCIDR)", zap.Error(err))
			return false, nil
		}
		for i := range list.Items {
			if n := model.NodeOf(&list.Items[i]); n.Name == node && len(n.PodCIDRs) > 0 {
				out = n.PodCIDRs
				return true, nil
			}
		}
		log.Info("waiting for the Node's podCIDRs (--detect-local-mode NodeCIDR)", zap.String("node", node))
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("--detect-local-mode NodeCIDR: read the podCIDRs of Node %s: %w", node, err)
	}
	log.Info("pods' traffic told by the Node's podCIDRs", zap.Stringers("podCIDRs", out))
	return out, nil
}
