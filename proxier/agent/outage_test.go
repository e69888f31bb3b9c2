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
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube/kubetest"
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

func runtimeRaw(o any) k8sruntime.RawExtension {
	b, _ := json.Marshal(o)
	return k8sruntime.RawExtension{Raw: b}
}

// client is the agent's client of this server (TuneClientConfig, as
// NewClient makes it).
func (f *fakeAPIServer) client() kube.Client {
	cfg := &rest.Config{Host: (&url.URL{Scheme: "http", Host: f.addr}).String()}
	TuneClientConfig(cfg, "ipvs-proxy-test")
	c, err := kube.NewForConfig(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func outageService(port int32) corev1.Service {
	return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}}}
}

// TestRefusedConnectionsWaitedFor: an apiserver taken down for real (its
// connections refused, its watches cut, client-go's own errors) is waited
// for in untilReachable, not by the reflector, and a Service changed while
// it was gone reaches the agent's Service informer within 10 s of its
// return. Real time, about 3 s; TestUntilReachableAfterOutage times long
// outages.
func TestRefusedConnectionsWaitedFor(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	f := newFakeAPIServer(t)
	f.set(outageService(80))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan int32, 16)
	var infs informerSet
	if _, err := infs.add(serviceInformer(f.client(), newReacher(clock.RealClock{}, zap.New(core))), handler(func(o any, _ bool) {
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
	time.Sleep(2 * time.Second)
	f.up()
	back := time.Now()
	if err := waitPort(seen, 8080, 30*time.Second); err != nil {
		t.Fatal("after the outage:", err)
	}
	t.Logf("after a 2 s outage the change arrived %.1f s after the apiserver's return", time.Since(back).Seconds())
	if d := time.Since(back); d > 2*maxStep(t) {
		t.Errorf("the change arrived %.1f s after the apiserver's return, want within %v", d.Seconds(), 2*maxStep(t))
	}
	if n := logs.FilterMessage("apiserver unreachable; trying again every 5 to 10 s at most").Len(); n == 0 {
		t.Errorf("untilReachable never waited: the reflector did (logged: %v)", logs.All())
	}
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

// maxStep is the longest step of newReacher's backoff.
func maxStep(t *testing.T) time.Duration {
	t.Helper()
	return newReacher(clock.RealClock{}, zap.NewNop()).backoff.Cap
}

// refusedErr is the error of a list or watch whose connection the
// apiserver's host refused, as client-go returns it.
func refusedErr() error {
	return &url.Error{Op: "Get", URL: "https://apiserver/api/v1/services",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
}

// clockedAPIServer lists and watches (no) Services on a fake clock, and
// refuses every connection until a time on it, as a stopped apiserver
// does: a reflector over it lives through outages of minutes in
// milliseconds.
type clockedAPIServer struct {
	clk *clocktesting.FakeClock

	mu   sync.Mutex
	upAt time.Time          // connections are refused before it
	back time.Time          // the first list or watch served at or after upAt
	w    *watch.FakeWatcher // the open watch, nil when none
}

func (s *clockedAPIServer) serve() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	if now.Before(s.upAt) {
		return refusedErr()
	}
	if s.back.IsZero() {
		s.back = now
	}
	return nil
}

func (s *clockedAPIServer) list(context.Context, metav1.ListOptions) (k8sruntime.Object, error) {
	if err := s.serve(); err != nil {
		return nil, err
	}
	return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
}

func (s *clockedAPIServer) watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	if err := s.serve(); err != nil {
		return nil, err
	}
	w := watch.NewFake()
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
	return w, nil
}

// watching is the open watch, nil when none.
func (s *clockedAPIServer) watching() *watch.FakeWatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

func (s *clockedAPIServer) backAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.back
}

// outage waits (in real time) for the reflector's watch, lets a minute
// pass on the clock, then cuts the watch and refuses connections for d.
// It steps the clock by step while the reflector waits on it, and returns
// how long after the outage's end, on the clock, the reflector listed or
// watched again (to within step).
func (s *clockedAPIServer) outage(t *testing.T, d, step time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.watching() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the reflector does not watch")
		}
		time.Sleep(time.Millisecond)
	}
	s.clk.Step(time.Minute) // a watch of a minute, not a "very short watch"
	s.mu.Lock()
	upAt, w := s.clk.Now().Add(d), s.w
	s.upAt, s.back, s.w = upAt, time.Time{}, nil
	s.mu.Unlock()
	w.Stop()
	for s.backAt().IsZero() {
		if time.Now().After(deadline.Add(time.Minute)) {
			t.Fatalf("the reflector has not called again %v after a %v outage", s.clk.Since(upAt), d)
		}
		if s.clk.HasWaiters() {
			s.clk.Step(step)
		} else {
			runtime.Gosched()
		}
	}
	return s.backAt().Sub(upAt)
}

// gapsAfterOutages runs a reflector over the ListerWatcher that lw makes
// of a clockedAPIServer, on its fake clock, through n outages of d each,
// and returns how long after each outage's end the reflector got through
// again.
func gapsAfterOutages(t *testing.T, n int, d time.Duration, lw func(*clockedAPIServer) cache.ListerWatcher) []time.Duration {
	const step = 50 * time.Millisecond
	s := &clockedAPIServer{clk: clocktesting.NewFakeClock(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))}
	r := cache.NewReflectorWithOptions(lw(s), nil, cache.NewStore(cache.MetaNamespaceKeyFunc), cache.ReflectorOptions{Clock: s.clk})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), zapr.NewLogger(zap.NewNop())))
	done := make(chan struct{})
	go func() { r.RunWithContext(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	gaps := make([]time.Duration, n)
	for i := range gaps {
		gaps[i] = s.outage(t, d, step)
	}
	return gaps
}

// reflectorListWatch is what the reflector got before untilReachable:
// lists and watches whose errors it handles itself.
type reflectorListWatch struct{ s *clockedAPIServer }

func (l reflectorListWatch) List(o metav1.ListOptions) (k8sruntime.Object, error) {
	return l.s.list(context.Background(), o)
}
func (l reflectorListWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return l.s.watch(context.Background(), o)
}
func (l reflectorListWatch) IsWatchListSemanticsUnSupported() bool { return true }

const (
	outages     = 10
	outageLimit = 5 * time.Minute
)

// TestUntilReachableAfterOutage: after each of ten outages of 5 minutes
// (connections refused), the reflector over the agent's pagedListWatch
// lists or watches again within twice the backoff's cap (10 s) of the
// apiserver's return: a change made during an outage reaches the agent
// then. Over client-go's own backoff the same outages end with gaps of up
// to 60 s (TestReflectorBackoffAfterOutage).
func TestUntilReachableAfterOutage(t *testing.T) {
	gaps := gapsAfterOutages(t, outages, outageLimit, func(s *clockedAPIServer) cache.ListerWatcher {
		return &pagedListWatch{list: s.list, watch: s.watch, transform: model.Compact, page: listPage,
			reach: newReacher(s.clk, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))}
	})
	t.Logf("after %d outages of %v, listed or watched again after %s", outages, outageLimit, seconds(gaps))
	if m := slices.Max(gaps); m > 2*maxStep(t)+50*time.Millisecond {
		t.Errorf("listed or watched again %.1f s after an outage's end, want within %v", m.Seconds(), 2*maxStep(t))
	}
}

// TestReflectorBackoffAfterOutage: the same outages over client-go's own
// backoff (the reflector's: 0.8 s doubling to a 30 s cap, waits of 30 to
// 60 s): at least one of ten gaps is longer than 10 s (each is, about 4
// times in 5). Were this to fail, client-go would wait no longer than
// untilReachable, which could go.
func TestReflectorBackoffAfterOutage(t *testing.T) {
	gaps := gapsAfterOutages(t, outages, outageLimit, func(s *clockedAPIServer) cache.ListerWatcher {
		return reflectorListWatch{s}
	})
	t.Logf("after %d outages of %v, client-go listed or watched again after %s", outages, outageLimit, seconds(gaps))
	if m := slices.Max(gaps); m <= 2*maxStep(t) {
		t.Errorf("client-go listed or watched again within %.1f s of every outage's end: untilReachable is not needed", m.Seconds())
	}
}

// seconds formats durations as seconds, one decimal.
func seconds(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
	}
	return strings.Join(out, ", ") + " s"
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

// TestServiceCIDRInformerWaitsForTheApiserver: the ServiceCIDR informer's
// lists go through untilReachable as the other informers' do: refused
// twice, its list is waited for on the reacher's clock, not handed to the
// reflector's backoff.
func TestServiceCIDRInformerWaitsForTheApiserver(t *testing.T) {
	client := fake.NewClientset(&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}})
	var mu sync.Mutex
	refusals := 2
	client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if refusals == 0 {
			return false, nil, nil
		}
		refusals--
		return true, nil, refusedErr()
	})
	core, logs := observer.New(zap.InfoLevel)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	inf := serviceCIDRInformer(kubetest.New(client), newReacher(clk, zap.New(core)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { inf.RunWithContext(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for !inf.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatalf("not synced; logged: %v", logs.All())
		}
		if clk.HasWaiters() {
			clk.Step(100 * time.Millisecond)
		}
		time.Sleep(time.Millisecond)
	}
	if n := logs.FilterMessage("apiserver reachable again").Len(); n != 1 {
		t.Errorf("%d \"apiserver reachable again\" logged, want 1: the reflector, not untilReachable, waited", n)
	}
	if got := len(inf.GetStore().List()); got != 1 {
		t.Errorf("%d ServiceCIDRs listed, want 1", got)
	}
}
