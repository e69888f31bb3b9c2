package kube

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

const protobuf = "application/vnd.kubernetes.protobuf"

// apiserver answers as kube-apiserver does, in protobuf, encoded with
// client-go's full scheme (not the client's own): the lists and watches of
// the four resources the agent reads, Events written, /version, and a
// 404 Status for the rest. It records each request.
type apiserver struct {
	t *testing.T

	mu   sync.Mutex
	seen []request
}

type request struct {
	method, path, query, accept, contentType, userAgent string
	body                                                []byte
}

func (a *apiserver) requests() []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]request(nil), a.seen...)
}

func (a *apiserver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.seen = append(a.seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), r.Header.Get("Content-Type"),
		r.Header.Get("User-Agent"), body})
	a.mu.Unlock()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "7"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	switch {
	case r.URL.Path == "/version":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
	case r.URL.Path == "/api/v1/services" && r.URL.Query().Get("watch") == "true":
		a.watch(r.Context(), w, corev1.SchemeGroupVersion, svc)
	case r.URL.Path == "/api/v1/services":
		a.write(w, http.StatusOK, corev1.SchemeGroupVersion, &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "7", Continue: "next"},
			Items: []corev1.Service{*svc}})
	case r.URL.Path == "/apis/discovery.k8s.io/v1/endpointslices":
		a.write(w, http.StatusOK, discoveryv1.SchemeGroupVersion, &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-1", Labels: map[string]string{discoveryv1.LabelServiceName: "a"}},
			Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"10.0.1.2"}}}}}})
	case r.URL.Path == "/api/v1/nodes":
		a.write(w, http.StatusOK, corev1.SchemeGroupVersion, &corev1.NodeList{Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
			Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}}})
	case r.URL.Path == "/apis/networking.k8s.io/v1/servicecidrs":
		a.write(w, http.StatusOK, networkingv1.SchemeGroupVersion, &networkingv1.ServiceCIDRList{Items: []networkingv1.ServiceCIDR{{
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}})
	case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/ns/events"):
		a.write(w, http.StatusOK, corev1.SchemeGroupVersion, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e1",
			ResourceVersion: "9"}, Count: 2})
	default:
		a.write(w, http.StatusNotFound, schema.GroupVersion{Version: "v1"}, &metav1.Status{Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: r.URL.Path + " not found"})
	}
}

func (a *apiserver) protobuf() runtime.SerializerInfo {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), protobuf)
	if !ok {
		a.t.Fatal("client-go's scheme has no protobuf serializer")
	}
	return info
}

func (a *apiserver) write(w http.ResponseWriter, code int, gv schema.GroupVersion, obj runtime.Object) {
	b, err := runtime.Encode(scheme.Codecs.EncoderForVersion(a.protobuf().Serializer, gv), obj)
	if err != nil {
		a.t.Errorf("encode %T: %v", obj, err)
	}
	w.Header().Set("Content-Type", protobuf)
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// watch sends one ADDED event, framed as the apiserver frames a protobuf
// watch, and holds the stream until the client goes.
func (a *apiserver) watch(ctx context.Context, w http.ResponseWriter, gv schema.GroupVersion, obj runtime.Object) {
	info := a.protobuf()
	raw, err := runtime.Encode(scheme.Codecs.EncoderForVersion(info.Serializer, gv), obj)
	if err != nil {
		a.t.Errorf("encode %T: %v", obj, err)
	}
	w.Header().Set("Content-Type", protobuf+";stream=watch")
	w.WriteHeader(http.StatusOK)
	fw := info.StreamSerializer.Framer.NewFrameWriter(w)
	if err := info.StreamSerializer.Encode(&metav1.WatchEvent{Type: string(watch.Added), Object: runtime.RawExtension{Raw: raw}}, fw); err != nil {
		a.t.Errorf("encode the watch event: %v", err)
	}
	w.(http.Flusher).Flush()
	<-ctx.Done()
}

func newTestClient(t *testing.T, cfg rest.Config) (Client, *apiserver) {
	t.Helper()
	a := &apiserver{t: t}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	cfg.Host = srv.URL
	c, err := NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, a
}

// agentConfig is the configuration the agent gives its client
// (agent.TuneClientConfig): protobuf, a user agent, QPS 50 and burst 100.
func agentConfig() rest.Config {
	return rest.Config{UserAgent: "ipvs-proxy/test", ContentConfig: rest.ContentConfig{
		AcceptContentTypes: protobuf + ",application/json", ContentType: protobuf}, QPS: 50, Burst: 100}
}

// TestListsInProtobuf: each resource is listed at its group's path with
// the options as query parameters, in protobuf, with the agent's user
// agent, and decoded whole; a resource the apiserver does not serve is a
// NotFound error the callers tell (apierrors).
func TestListsInProtobuf(t *testing.T) {
	c, a := newTestClient(t, agentConfig())
	ctx := context.Background()
	opts := metav1.ListOptions{LabelSelector: "!service.kubernetes.io/headless", Limit: 500}
	svcs, err := c.Services().List(ctx, opts)
	if err != nil || len(svcs.Items) != 1 || svcs.Items[0].Spec.ClusterIP != "10.96.0.10" || svcs.Continue != "next" {
		t.Fatalf("Services: %+v, %v", svcs, err)
	}
	slices, err := c.EndpointSlices().List(ctx, opts)
	if err != nil || len(slices.Items) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != "10.0.1.2" {
		t.Fatalf("EndpointSlices: %+v, %v", slices, err)
	}
	nodes, err := c.Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=node-1"})
	if err != nil || len(nodes.Items) != 1 || nodes.Items[0].Spec.PodCIDRs[0] != "10.244.1.0/24" {
		t.Fatalf("Nodes: %+v, %v", nodes, err)
	}
	cidrs, err := c.ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil || len(cidrs.Items) != 1 || cidrs.Items[0].Spec.CIDRs[0] != "10.96.0.0/16" {
		t.Fatalf("ServiceCIDRs: %+v, %v", cidrs, err)
	}
	want := []string{
		"/api/v1/services?labelSelector=%21service.kubernetes.io%2Fheadless&limit=500",
		"/apis/discovery.k8s.io/v1/endpointslices?labelSelector=%21service.kubernetes.io%2Fheadless&limit=500",
		"/api/v1/nodes?fieldSelector=metadata.name%3Dnode-1",
		"/apis/networking.k8s.io/v1/servicecidrs",
	}
	got := a.requests()
	if len(got) != len(want) {
		t.Fatalf("%d requests, want %d: %+v", len(got), len(want), got)
	}
	for i, r := range got {
		if u := strings.TrimSuffix(r.path+"?"+r.query, "?"); r.method != http.MethodGet || u != want[i] {
			t.Errorf("request %d: %s %s, want GET %s", i, r.method, u, want[i])
		}
		if !strings.HasPrefix(r.accept, protobuf) || r.userAgent != "ipvs-proxy/test" {
			t.Errorf("request %d: Accept %q, User-Agent %q; want protobuf first and the agent's user agent", i, r.accept, r.userAgent)
		}
	}
	// A 1.32 apiserver has no ServiceCIDRs: the Status it answers is the
	// error, as the agent tells it (probeServiceCIDRs).
	a404 := &apiserver{t: t}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { r.URL.Path = "/none"; a404.ServeHTTP(w, r) }))
	defer srv.Close()
	cfg := agentConfig()
	cfg.Host = srv.URL
	old, err := NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.ServiceCIDRs().List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an apiserver without ServiceCIDRs: %v, want NotFound", err)
	}
}

// TestWatchDecodesProtobufEvents: a watch asks watch=true with the
// reflector's version and decodes the apiserver's framed protobuf events
// into the typed object.
func TestWatchDecodesProtobufEvents(t *testing.T) {
	c, a := newTestClient(t, agentConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := c.Services().Watch(ctx, metav1.ListOptions{ResourceVersion: "7", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		svc, ok := ev.Object.(*corev1.Service)
		if ev.Type != watch.Added || !ok || svc.Name != "a" || svc.Spec.ClusterIP != "10.96.0.10" {
			t.Errorf("event %s %#v, want ADDED ns/a", ev.Type, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	r := a.requests()[0]
	if r.path != "/api/v1/services" || !strings.Contains(r.query, "watch=true") || !strings.Contains(r.query, "resourceVersion=7") ||
		!strings.Contains(r.query, "allowWatchBookmarks=true") {
		t.Errorf("watch asked %s?%s", r.path, r.query)
	}
}

// TestEventSink: the recorder's Events are created, patched (strategic
// merge) and updated in the Event's own namespace, the objects in
// protobuf.
func TestEventSink(t *testing.T) {
	c, a := newTestClient(t, agentConfig())
	sink := c.Events()
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e1"}, Reason: "ServiceNotProgrammed",
		InvolvedObject: corev1.ObjectReference{Kind: "Service", Namespace: "ns", Name: "a"}}
	if got, err := sink.Create(e); err != nil || got.ResourceVersion != "9" {
		t.Fatalf("create: %+v, %v", got, err)
	}
	if _, err := sink.Patch(e, []byte(`{"count":2}`)); err != nil {
		t.Fatalf("patch: %v", err)
	}
	if _, err := sink.Update(e); err != nil {
		t.Fatalf("update: %v", err)
	}
	got := a.requests()
	want := []struct{ method, path, contentType string }{
		{http.MethodPost, "/api/v1/namespaces/ns/events", protobuf},
		{http.MethodPatch, "/api/v1/namespaces/ns/events/e1", "application/strategic-merge-patch+json"},
		{http.MethodPut, "/api/v1/namespaces/ns/events/e1", protobuf},
	}
	if len(got) != len(want) {
		t.Fatalf("%d requests, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].method != w.method || got[i].path != w.path || got[i].contentType != w.contentType {
			t.Errorf("request %d: %s %s (%s), want %s %s (%s)", i, got[i].method, got[i].path, got[i].contentType, w.method, w.path, w.contentType)
		}
	}
	sent := &corev1.Event{}
	if err := runtime.DecodeInto(scheme.Codecs.UniversalDecoder(corev1.SchemeGroupVersion), got[0].body, sent); err != nil ||
		sent.Reason != "ServiceNotProgrammed" || sent.InvolvedObject.Name != "a" {
		t.Errorf("created %+v (%v), want the Event sent", sent, err)
	}
	if string(got[1].body) != `{"count":2}` {
		t.Errorf("patch body %q", got[1].body)
	}
}

// TestServerVersion reads /version, the operations server's probe.
func TestServerVersion(t *testing.T) {
	c, _ := newTestClient(t, agentConfig())
	v, err := c.ServerVersion(context.Background())
	if err != nil || v.GitVersion != "v1.36.3" {
		t.Errorf("version %+v, %v", v, err)
	}
}

// TestOneRateLimiter: the groups' clients share one rate limiter, as the
// Clientset's do: at 4 requests a second with a burst of 1, a list of
// each of three groups waits about half a second in all (each group its
// own limiter: none).
func TestOneRateLimiter(t *testing.T) {
	cfg := agentConfig()
	cfg.QPS, cfg.Burst = 4, 1
	c, _ := newTestClient(t, cfg)
	ctx := context.Background()
	start := time.Now()
	for _, list := range []func() error{
		func() error { _, err := c.Services().List(ctx, metav1.ListOptions{}); return err },
		func() error { _, err := c.EndpointSlices().List(ctx, metav1.ListOptions{}); return err },
		func() error { _, err := c.ServiceCIDRs().List(ctx, metav1.ListOptions{}); return err },
	} {
		if err := list(); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("three lists took %v at 4 a second with a burst of 1: the groups do not share the limiter", took)
	}
	cfg.Burst = 0
	if _, err := NewForConfig(&cfg); err == nil {
		t.Error("QPS without burst accepted")
	}
}
