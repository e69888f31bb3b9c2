// Package healthcheck serves the health-check node ports of Services with
// externalTrafficPolicy Local, as kube-proxy does: an HTTP server on each
// Service's spec.healthCheckNodePort answers 200 while this node has local
// endpoints of the Service and 503 otherwise, so that an external load
// balancer sends traffic only to nodes that can serve it without a second
// hop. The body is kube-proxy's:
//
//	{"service":{"namespace":"ns","name":"svc"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// Server is a consumer.Consumer: it learns of every Service plan and opens
// and closes its listeners when the proxier syncs.
package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Config configures a Server.
type Config struct {
	// Addresses to listen on; empty means every address of the node (as
	// kube-proxy does when --nodeport-addresses is not set).
	Addresses []netip.Addr
	// ProxyHealthy reports whether the proxier itself is healthy; a health
	// check answers 503 while it is not. Nil means always healthy.
	ProxyHealthy func() bool
	// Recorder receives a warning Event on a Service whose port cannot be
	// opened. Nil: no Events.
	Recorder record.EventRecorder
	// Listen opens a listener (default net.Listen); tests replace it.
	Listen func(network, address string) (net.Listener, error)
}

// Server is the set of health-check servers, one per Service with a
// health-check node port. Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	log *zap.Logger

	mu     sync.RWMutex
	want   map[types.NamespacedName]wanted    // from the plans
	open   map[types.NamespacedName]*instance // serving
	failed map[types.NamespacedName]string    // last error reported for a port that would not open
}

type wanted struct {
	port      uint16
	endpoints int
}

type instance struct {
	port      uint16
	endpoints int
	srv       *http.Server
}

var _ consumer.Consumer = (*Server)(nil)

// New returns a Server with no ports open.
func New(cfg Config, log *zap.Logger) *Server {
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	return &Server{
		cfg:    cfg,
		log:    log.With(zap.String("component", "healthcheck")),
		want:   map[types.NamespacedName]wanted{},
		open:   map[types.NamespacedName]*instance{},
		failed: map[types.NamespacedName]string{},
	}
}

// Name implements consumer.Consumer.
func (s *Server) Name() string { return "health-check node ports" }

// AfterReconciler implements consumer.AfterReconciler: a Service's local
// endpoints are counted (and answered with 200) only once IPVS has them.
func (s *Server) AfterReconciler() {}

// SetPlan implements consumer.Consumer: it records the Service's
// health-check node port and local endpoint count; Sync applies them.
func (s *Server) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if plan == nil || plan.HealthCheckNodePort == 0 {
		delete(s.want, name)
		return
	}
	s.want[name] = wanted{port: plan.HealthCheckNodePort, endpoints: plan.LocalEndpoints}
}

// Sync implements consumer.Consumer: it closes the servers no longer wanted,
// updates the counts, and opens the missing servers. A port that cannot be
// opened (another process holds it) is logged and reported as an Event on
// the Service, and retried at every later Sync; it is not a sync failure,
// since resyncing IPVS cannot fix it.
func (s *Server) Sync(bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, in := range s.open {
		if w, ok := s.want[name]; !ok || w.port != in.port {
			s.log.Info("closing health check", zap.String("service", name.String()), zap.Uint16("port", in.port))
			if err := in.srv.Close(); err != nil {
				s.log.Warn("close health check", zap.String("service", name.String()), zap.Error(err))
			}
			delete(s.open, name)
		}
	}
	for name := range s.failed {
		if _, ok := s.want[name]; !ok {
			delete(s.failed, name)
		}
	}
	for name, w := range s.want {
		if in, ok := s.open[name]; ok {
			in.endpoints = w.endpoints
			continue
		}
		in, err := s.serve(name, w.port)
		if err != nil {
			msg := fmt.Sprintf("cannot open health check node port %d: %v", w.port, err)
			if s.failed[name] != msg {
				s.failed[name] = msg
				s.log.Error("open health check", zap.String("service", name.String()), zap.Uint16("port", w.port), zap.Error(err))
				if s.cfg.Recorder != nil {
					ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: name.Namespace, Name: name.Name}
					s.cfg.Recorder.Event(ref, corev1.EventTypeWarning, "FailedToStartServiceHealthcheck", msg)
				}
			}
			continue
		}
		delete(s.failed, name)
		in.endpoints = w.endpoints
		s.open[name] = in
		s.log.Info("opened health check", zap.String("service", name.String()), zap.Uint16("port", w.port))
	}
	return nil
}

// serve opens the Service's port on every configured address and serves
// it; on any failure nothing stays open.
func (s *Server) serve(name types.NamespacedName, port uint16) (*instance, error) {
	type bind struct{ network, addr string }
	addrs := []bind{{"tcp", net.JoinHostPort("", strconv.Itoa(int(port)))}}
	if len(s.cfg.Addresses) > 0 {
		addrs = addrs[:0]
		for _, a := range s.cfg.Addresses {
			// One family per socket: "tcp6" on [::] is IPv6 only, so it
			// and IPv4 addresses of the same port do not collide.
			network := "tcp6"
			if a.Is4() {
				network = "tcp4"
			}
			addrs = append(addrs, bind{network, netip.AddrPortFrom(a, port).String()})
		}
	}
	var lns []net.Listener
	for _, b := range addrs {
		ln, err := s.cfg.Listen(b.network, b.addr)
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			return nil, fmt.Errorf("listen on %s: %w", b.addr, err)
		}
		lns = append(lns, ln)
	}
	in := &instance{port: port}
	in.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { s.answer(w, name) }),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       30 * time.Second,
	}
	for _, ln := range lns {
		go func() {
			if err := in.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check server stopped", zap.String("service", name.String()), zap.Stringer("address", ln.Addr()), zap.Error(err))
			}
		}()
	}
	return in, nil
}

// Response is the body of a health check's answer.
type Response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *Server) answer(w http.ResponseWriter, name types.NamespacedName) {
	s.mu.RLock()
	in, ok := s.open[name]
	count := 0
	if ok {
		count = in.endpoints
	}
	s.mu.RUnlock()
	healthy := s.cfg.ProxyHealthy == nil || s.cfg.ProxyHealthy()
	var r Response
	r.Service.Namespace, r.Service.Name = name.Namespace, name.Name
	r.LocalEndpoints, r.ServiceProxyHealthy = count, healthy
	body, err := json.Marshal(r)
	if err != nil { // plain strings and numbers: cannot fail
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if ok && count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(append(body, '\n'))
}

// Ports returns the open health-check ports by Service.
func (s *Server) Ports() map[types.NamespacedName]uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[types.NamespacedName]uint16, len(s.open))
	for n, in := range s.open {
		out[n] = in.port
	}
	return out
}

// Close closes every server.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for n, in := range s.open {
		if err := in.srv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close health check of %s: %w", n, err))
		}
		delete(s.open, n)
	}
	return errors.Join(errs...)
}
