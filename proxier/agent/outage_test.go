package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// fakeAPIServer serves Services over HTTP as an apiserver does (a paged
// list, a watch from a resourceVersion), in JSON, and can be taken down
// (its listener closed, every connection cut: connections are refused)
// and brought back on the same address.
type fakeAPIServer struct {
	t    *testing.T
	addr string

	mu      sync.Mutex
	rv      int
	svcs    map[string]corev1.Service
	events  []watch.Event // every change, in order; the object's version is its place
	changed chan struct{} // closed and replaced on each change
	srv     *http.Server
	watches int // watch requests served
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{t: t, svcs: map[string]corev1.Service{}, changed: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = l.Addr().String()
	f.serve(l)
	t.Cleanup(f.down)
	return f
}

func (f *fakeAPIServer) serve(l net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(f.handle)}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// down closes the listener and every connection: the client's next dial is
// refused.
func (f *fakeAPIServer) down() {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// up listens again on the same address.
func (f *fakeAPIServer) up() {
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.serve(l)
}

// set adds or replaces a Service, as a new version.
func (f *fakeAPIServer) set(s corev1.Service) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	s.TypeMeta = metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}
	s.ResourceVersion = strconv.Itoa(f.rv)
	typ := watch.Modified
	if _, ok := f.svcs[s.Name]; !ok {
		typ = watch.Added
	}
	f.svcs[s.Name] = s
	f.events = append(f.events, watch.Event{Type: typ, Object: &s})
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeAPIServer) handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/services" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		f.watch(w, r)
		return
	}
	f.mu.Lock()
	l := corev1.ServiceList{TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)}}
	for _, s := range f.svcs {
		l.Items = append(l.Items, s)
	}
	f.mu.Unlock()
	_ = json.NewEncoder(w).Encode(&l)
}

// watch streams the changes after the asked version, then each change as
// it comes, until the connection is cut.
func (f *fakeAPIServer) watch(w http.ResponseWriter, r *http.Request) {
	from, _ := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	f.mu.Lock()
	f.watches++
	f.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	enc := json.NewEncoder(w)
	for {
		f.mu.Lock()
		evs, changed := f.events[min(from, len(f.events)):], f.changed
		from = len(f.events)
		f.mu.Unlock()
		for _, e := range evs {
			if err := enc.Encode(&metav1.WatchEvent{Type: string(e.Type), Object: runtimeRaw(e.Object)}); err != nil {
				return
			}
		}
		fl.Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func runtimeRaw(o any) runtime.RawExtension {
	b, _ := json.Marshal(o)
	return runtime.RawExtension{Raw: b}
}

// client is the agent's client of this server (TuneClientConfig, as
// NewClient makes it).
func (f *fakeAPIServer) client() kubernetes.Interface {
	cfg := &rest.Config{Host: (&url.URL{Scheme: "http", Host: f.addr}).String()}
	TuneClientConfig(cfg, "ipvs-proxy-test")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return cs
}

func outageService(port int32) corev1.Service {
	return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}}}
}

// afterOutage runs the agent's Service informer (serviceInformer, with its
// transform, as informerSet.add sets it up) against a fake apiserver, takes
// the apiserver down for outage, changes a Service meanwhile, brings it
// back and returns how long after its return the informer delivered the
// change.
func afterOutage(t *testing.T, outage time.Duration) time.Duration {
	f := newFakeAPIServer(t)
	f.set(outageService(80))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan int32, 16)
	var infs informerSet
	if _, err := infs.add(serviceInformer(f.client()), handler(func(o any, _ bool) {
		if s, ok := o.(*model.Service); ok && len(s.Spec.Ports) > 0 {
			seen <- s.Spec.Ports[0].Port
		}
	})); err != nil {
		t.Fatal(err)
	}
	infs.start(ctx)
	defer func() { cancel(); infs.wait() }()
	if err := waitPort(seen, 80, 10*time.Second); err != nil {
		t.Fatal("initial list:", err)
	}
	f.down()
	f.set(outageService(8080)) // the change made while the apiserver is gone
	time.Sleep(outage)
	f.up()
	back := time.Now()
	if err := waitPort(seen, 8080, 2*time.Minute); err != nil {
		t.Fatal("after the outage:", err)
	}
	return time.Since(back)
}

func waitPort(seen <-chan int32, want int32, within time.Duration) error {
	timeout := time.After(within)
	for {
		select {
		case p := <-seen:
			if p == want {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("port %d not seen within %v", want, within)
		}
	}
}

// TestChangeAfterOutage: a Service changed while the apiserver was gone
// reaches the agent within 10 s of the apiserver's return (the longest
// wait of unreachableBackoff; client-go's reflector alone waited up to
// 60 s, 2.5 to 12.8 s after this 30 s outage and 11 to 48 s after 90 s).
func TestChangeAfterOutage(t *testing.T) {
	const outage = 30 * time.Second
	d := afterOutage(t, outage)
	t.Logf("after a %v outage the change arrived %.1f s after the apiserver's return", outage, d.Seconds())
	if d > 12*time.Second {
		t.Errorf("the change arrived %.1f s after the apiserver's return, want within 10 s", d.Seconds())
	}
}

// TestUnreachable: only an apiserver that is not there or says it is
// unavailable is waited for in untilReachable; its other answers (an
// expired list, a refusal, load shed) and an ended context go to the
// reflector.
func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	refused := &url.Error{Op: "Get", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	gr := schema.GroupResource{Resource: "services"}
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"nil", ctx, nil, false},
		{"refused", ctx, refused, true},
		{"reset", ctx, &url.Error{Op: "Get", URL: "http://x", Err: syscall.ECONNRESET}, true},
		{"EOF", ctx, &url.Error{Op: "Get", URL: "http://x", Err: io.ErrUnexpectedEOF}, true},
		{"no such host", ctx, &url.Error{Op: "Get", URL: "http://x", Err: &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}}, true},
		{"503", ctx, apierrors.NewServiceUnavailable("starting"), true},
		{"410", ctx, apierrors.NewResourceExpired("continue token expired"), false},
		{"403", ctx, apierrors.NewForbidden(gr, "", errors.New("no")), false},
		{"429", ctx, apierrors.NewTooManyRequests("slow down", 1), false},
		{"500", ctx, apierrors.NewInternalError(errors.New("etcd")), false},
		{"context ended", ended, refused, false},
	} {
		if got := unreachable(c.ctx, c.err); got != c.want {
			t.Errorf("%s: unreachable = %v, want %v", c.name, got, c.want)
		}
	}
}
