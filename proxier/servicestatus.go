package proxier

// The per-Service status: what the last attempt did, the backoff of a
// failing Service, and the conflicts it lost.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// ServiceStatus is what the reconciler knows of one Service.
type ServiceStatus struct {
	Service types.NamespacedName
	// Applied: the last attempt wrote everything the Service holds.
	Applied bool
	// Failures counts the attempts that failed in a row; the Service is
	// retried alone at NextRetry (an exponential backoff).
	Failures  int
	LastError string
	NextRetry time.Time
	// Conflicts are the virtual servers it wants and an older Service
	// holds.
	Conflicts []model.Conflict
}

// backoff is one retry schedule: failures in a row and the next attempt.
type backoff struct {
	failures int
	next     time.Time
}

func (b *backoff) fail(now time.Time, base, max time.Duration) {
	b.failures++
	d := base
	for i := 1; i < b.failures && d < max; i++ {
		d *= 2
	}
	b.next = now.Add(min(d, max))
}

func (b *backoff) due(now time.Time) bool { return b.failures > 0 && !now.Before(b.next) }

// ConflictChanges returns, sorted, the Services whose conflicts changed
// since the last call; their Status holds the new ones.
func (r *Reconciler) ConflictChanges() []types.NamespacedName {
	var out []types.NamespacedName
	for n := range r.conflictChanged {
		st, p := r.status[n], r.claims.plans[n]
		if st == nil || p == nil {
			continue
		}
		cs := r.claims.conflicts(n)
		if !slices.Equal(cs, st.Conflicts) {
			st.Conflicts = cs
			out = append(out, n)
		}
		if len(cs) > 0 {
			r.conflicted[n] = true
		} else {
			delete(r.conflicted, n)
		}
	}
	r.conflictChanged = emptied(r.conflictChanged)
	slices.SortFunc(out, compareNames)
	return out
}

// Status returns a Service's status.
func (r *Reconciler) Status(name types.NamespacedName) (ServiceStatus, bool) {
	st, ok := r.status[name]
	if !ok {
		return ServiceStatus{}, false
	}
	out := *st
	out.Conflicts = slices.Clone(st.Conflicts)
	return out, true
}

// Failing reports whether a Service's last attempt failed (it waits for a
// retry).
func (r *Reconciler) Failing(name types.NamespacedName) bool {
	_, ok := r.retrying[name]
	return ok
}

// Problems returns the status of every Service that is failing or lost a
// conflict, sorted by name; its cost is the number of such Services.
func (r *Reconciler) Problems() []ServiceStatus {
	names := map[types.NamespacedName]bool{}
	for n := range r.retrying {
		names[n] = true
	}
	for n := range r.conflicted {
		names[n] = true
	}
	out := make([]ServiceStatus, 0, len(names))
	for n := range names {
		if st, ok := r.Status(n); ok {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b ServiceStatus) int { return compareNames(a.Service, b.Service) })
	return out
}

// record updates the status of the Services in scope after a sync: those
// with failures are scheduled for a retry, the others are applied. It
// returns their errors, naming each Service.
func (r *Reconciler) record(st *SyncStats, services map[types.NamespacedName]bool, now time.Time) []error {
	var errs []error
	names := make([]types.NamespacedName, 0, len(services))
	for n := range services {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	for _, n := range names {
		s := r.status[n]
		err := st.Failed[n]
		if err == nil {
			delete(st.Failed, n)
			if s != nil {
				s.Applied, s.Failures, s.LastError, s.NextRetry = true, 0, "", time.Time{}
				delete(r.retrying, n)
			}
			st.Applied = append(st.Applied, n)
			continue
		}
		errs = append(errs, fmt.Errorf("service %s: %w", n, err))
		if s == nil { // removed: its leftovers are the orphan retry's
			continue
		}
		b := r.retrying[n]
		if b == nil {
			b = &backoff{}
			r.retrying[n] = b
		}
		b.fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
		s.Applied, s.Failures, s.LastError, s.NextRetry = false, b.failures, err.Error(), b.next
		r.log.Warn("service not fully programmed; retrying it alone", zap.String("service", n.String()),
			zap.Int("failures", b.failures), zap.Time("nextRetry", b.next), zap.Error(err))
	}
	return errs
}

// emptied returns m empty: cleared in place when it is small, a new map
// when it held many entries. Go's maps never shrink, and clearing or
// iterating one costs its size at its largest: a set that held every
// Service once (a full sync) would make every later partial sync cost
// that much.
func emptied[K comparable, V any](m map[K]V) map[K]V {
	if len(m) > 64 {
		return make(map[K]V)
	}
	clear(m)
	return m
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}
