package agent

// Services that fail outside the reconciler: refused by the model (over a
// limit, model.Limits) or by a consumer (consumer.ServiceReporter: the
// glue's set limit, entries the kernel refused). Each is that Service's
// failure alone: reported like a failed IPVS write (the status's problems,
// ipvs_proxy_services_failing, an Event on the Service, a log line), never
// the node's health.

import (
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// serviceFailures holds why each such Service fails. Only the sync loop
// touches it.
type serviceFailures struct {
	refused  map[types.NamespacedName]string // the plans' Refused
	consumer map[types.NamespacedName]string // the consumers', as of their last Sync
	reported map[types.NamespacedName]string // what the last Events said
}

func newServiceFailures() *serviceFailures {
	return &serviceFailures{refused: map[types.NamespacedName]string{}, consumer: map[types.NamespacedName]string{},
		reported: map[types.NamespacedName]string{}}
}

// setPlan records whether a Service's plan is refused (nil: it is gone).
func (f *serviceFailures) setPlan(name types.NamespacedName, plan *model.ServicePlan) {
	if plan == nil || plan.Refused == "" {
		delete(f.refused, name)
		return
	}
	f.refused[name] = plan.Refused
}

// fromConsumers takes the consumers' failures after their Sync.
func (f *serviceFailures) fromConsumers(list []consumer.Consumer) {
	clear(f.consumer)
	for _, c := range list {
		sr, ok := c.(consumer.ServiceReporter)
		if !ok {
			continue
		}
		for name, why := range sr.ServiceFailures() {
			why = c.Name() + ": " + why
			if old, ok := f.consumer[name]; ok {
				why = old + "; " + why
			}
			f.consumer[name] = why
		}
	}
}

// why is everything a Service fails for ("" if nothing).
func (f *serviceFailures) why(name types.NamespacedName) string {
	var parts []string
	for _, m := range []map[types.NamespacedName]string{f.refused, f.consumer} {
		if w := m[name]; w != "" {
			parts = append(parts, w)
		}
	}
	return strings.Join(parts, "; ")
}

// changes returns the Services whose failure changed since the last call,
// with why ("" for a Service that no longer fails), and records them.
func (f *serviceFailures) changes() map[types.NamespacedName]string {
	out := map[types.NamespacedName]string{}
	for _, m := range []map[types.NamespacedName]string{f.refused, f.consumer, f.reported} {
		for name := range m {
			if w := f.why(name); w != f.reported[name] {
				out[name] = w
			}
		}
	}
	for name, w := range out {
		if w == "" {
			delete(f.reported, name)
		} else {
			f.reported[name] = w
		}
	}
	return out
}

// failingOutcome is the reconciler's outcome with these failures added: the
// reporter counts and lists them with the reconciler's, and observes no
// programming latency for them.
type failingOutcome struct {
	outcome
	f *serviceFailures
}

func (o failingOutcome) Problems() []reconciler.ServiceStatus {
	out := o.outcome.Problems()
	if len(o.f.reported) == 0 {
		return out
	}
	at := make(map[types.NamespacedName]int, len(out))
	for i, s := range out {
		at[s.Service] = i
	}
	for _, name := range slices.SortedFunc(maps.Keys(o.f.reported), compareNames) {
		why := o.f.reported[name]
		if i, ok := at[name]; ok {
			out[i].Failures = max(out[i].Failures, 1)
			out[i].LastError = strings.TrimPrefix(out[i].LastError+"; "+why, "; ")
			continue
		}
		out = append(out, reconciler.ServiceStatus{Service: name, Failures: 1, LastError: why})
	}
	slices.SortFunc(out, func(a, b reconciler.ServiceStatus) int { return compareNames(a.Service, b.Service) })
	return out
}

func (o failingOutcome) Failing(name types.NamespacedName) bool {
	return o.outcome.Failing(name) || o.f.reported[name] != ""
}

func compareNames(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// serviceFailed logs a change of a Service's failure and raises an Event on
// it (why "": it no longer fails).
func (r *reporter) serviceFailed(name types.NamespacedName, svc *model.Service, why string) {
	if why == "" {
		r.log.Info("service no longer failing", zap.String("service", name.String()))
		if r.recorder != nil && svc != nil {
			r.recorder.Event(svc.Ref(), corev1.EventTypeNormal, "ServiceProgrammed", "ipvs-proxy programs the Service again")
		}
		return
	}
	r.log.Warn("service not programmed", zap.String("service", name.String()), zap.String("reason", why))
	if r.recorder != nil && svc != nil {
		r.recorder.Event(svc.Ref(), corev1.EventTypeWarning, "ServiceNotProgrammed", why)
	}
}

// reportFailures raises the Events of the failures that changed.
func (p *Proxier) reportFailures() {
	for name, why := range p.failures.changes() {
		p.reporter.serviceFailed(name, p.tracker.service(name), why)
	}
}
