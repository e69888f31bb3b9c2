package controlplane

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
)

// contentTypes records the Content-Type of every response, by path.
type contentTypes struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen map[string]string
}

func (c *contentTypes) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil {
		c.mu.Lock()
		c.seen[r.URL.Path] = resp.Header.Get("Content-Type")
		c.mu.Unlock()
	}
	return resp, err
}

func (c *contentTypes) of(path string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[path]
}

// TestAgentClient: the agent's own client (package kube, configured as
// agent.NewClient configures it: protobuf) against kube-apiserver. It
// lists the Services, EndpointSlices, Nodes and ServiceCIDRs the agent
// reads, in protobuf, through the agent's own readers; watches a Service
// created after the list; writes an Event twice through the recorder (a
// create, then a patch of its count); and reads /version.
func TestAgentClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{Log: t.Logf})
	if err != nil {
		skipOrFail(t, "cannot run the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	agent.TuneClientConfig(cfg, "ipvs-proxy/controlplane-test")
	seen := &contentTypes{seen: map[string]string{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { seen.next = rt; return seen }
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := cp.Client
	const ns = metav1.NamespaceDefault
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("lists", func(t *testing.T) {
		// The apiserver's bootstrap controller makes default/kubernetes
		// after the apiserver answers: a list right after its start can
		// come before it (make test on d46b3de).
		var names []string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			svcs, err := agent.ListServices(ctx, client)
			if err != nil {
				t.Fatal(err)
			}
			names = names[:0]
			for _, s := range svcs {
				names = append(names, s.Namespace+"/"+s.Name)
			}
			if slices.Contains(names, "default/kubernetes") || time.Now().After(deadline) {
				break
			}
		}
		if !slices.Contains(names, "default/web") || !slices.Contains(names, "default/kubernetes") {
			t.Errorf("Services %v, want default/web and default/kubernetes", names)
		}
		slicesOf, err := agent.ListEndpointSlices(ctx, client)
		if web := slicesOf[types.NamespacedName{Namespace: ns, Name: "web"}]; err != nil || len(web) != 1 || web[0].Endpoints[0].Addresses[0] != "10.244.1.5" {
			t.Errorf("EndpointSlices of default/web: %v, %v", web, err)
		}
		cidrs, err := agent.NodePodCIDRs(ctx, client, "node-1", zap.NewNop())
		if err != nil || !slices.Equal(cidrs, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) {
			t.Errorf("podCIDRs of node-1: %v, %v", cidrs, err)
		}
		// The apiserver makes its default ServiceCIDR object from its flag.
		var ranges []netip.Prefix
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			ranges, err = agent.ListServiceRanges(ctx, client, agent.Config{RouteServiceRanges: true})
			if err == nil && len(ranges) > 0 || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || !slices.Equal(ranges, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}) {
			t.Errorf("Service ranges %v, %v; want 10.96.0.0/16 from the ServiceCIDR", ranges, err)
		}
		for _, path := range []string{"/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices", "/api/v1/nodes",
			"/apis/networking.k8s.io/v1/servicecidrs"} {
			if got := seen.of(path); got != "application/vnd.kubernetes.protobuf" {
				t.Errorf("%s answered in %q, want protobuf", path, got)
			}
		}
	})

	t.Run("watch", func(t *testing.T) {
		list, err := client.Services().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		w, err := client.Services().Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 81}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatal("the watch ended before default/late came")
				}
				if svc, _ := ev.Object.(*corev1.Service); ev.Type == watch.Added && svc != nil && svc.Name == "late" {
					if len(svc.Spec.ClusterIPs) == 0 {
						t.Errorf("default/late watched without its clusterIPs: %+v", svc.Spec)
					}
					return
				}
			case <-wctx.Done():
				t.Fatal("no watch event for default/late within 30 s")
			}
		}
	})

	t.Run("events", func(t *testing.T) {
		recorder, stop := agent.NewEventRecorder(ctx, client, "node-1", zap.NewNop())
		defer stop()
		ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: ns, Name: "web"}
		// The second Event of the same object and reason patches the
		// first one's count.
		for want := int32(1); want <= 2; want++ {
			recorder.Event(ref, corev1.EventTypeWarning, "AgentClientTest", "written by the agent's client")
			var got []corev1.Event
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=AgentClientTest"})
				if err != nil {
					t.Fatal(err)
				}
				if got = evs.Items; len(got) == 1 && got[0].Count == want {
					break
				}
			}
			if len(got) != 1 || got[0].Count != want || got[0].Source.Host != "node-1" || got[0].InvolvedObject.Name != "web" {
				t.Fatalf("Events %+v; want one from node-1 about default/web, count %d", got, want)
			}
		}
	})

	t.Run("version", func(t *testing.T) {
		v, err := client.ServerVersion(ctx)
		if err != nil || !strings.HasPrefix(v.GitVersion, "v1.") {
			t.Errorf("version %+v, %v", v, err)
		}
	})
}
