package reconciler

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

// Backoff is one retry schedule: failures in a row and the next attempt,
// the delay doubled per failure up to a maximum. The zero value has no
// failure.
type Backoff struct {
	failures int
	next     time.Time
}

// Fail records a failure at now: the next attempt is base after it, doubled
// per earlier failure in a row, at most maxDelay.
func (b *Backoff) Fail(now time.Time, base, maxDelay time.Duration) {
	b.failures++
	d := base
	for i := 1; i < b.failures && d < maxDelay; i++ {
		d *= 2
	}
	b.next = now.Add(min(d, maxDelay))
}

// Due reports whether a failure waits for its retry and the retry is due.
func (b *Backoff) Due(now time.Time) bool { return b.failures > 0 && !now.Before(b.next) }

// Next is when the retry is due; zero with no failure.
func (b *Backoff) Next() time.Time {
	if b.failures == 0 {
		return time.Time{}
	}
	return b.next
}

// serviceStatuses is the status of every Service with a plan: what its
// last attempt did, the backoff of those failing (retrying), the Services
// whose conflicts may have changed (conflictChanged) and those that lost
// one (conflicted).
type serviceStatuses struct {
	byName          map[types.NamespacedName]*ServiceStatus
	retrying        map[types.NamespacedName]*Backoff
	conflictChanged map[types.NamespacedName]bool
	conflicted      map[types.NamespacedName]bool
}

func newServiceStatuses() serviceStatuses {
	return serviceStatuses{byName: map[types.NamespacedName]*ServiceStatus{}, retrying: map[types.NamespacedName]*Backoff{},
		conflictChanged: map[types.NamespacedName]bool{}, conflicted: map[types.NamespacedName]bool{}}
}

// add gives a Service a status, if it has none, and marks its conflicts
// to be checked.
func (s *serviceStatuses) add(name types.NamespacedName) {
	if s.byName[name] == nil {
		s.byName[name] = &ServiceStatus{Service: name}
	}
	s.conflictChanged[name] = true
}

// remove forgets a Service.
func (s *serviceStatuses) remove(name types.NamespacedName) {
	delete(s.byName, name)
	delete(s.retrying, name)
	delete(s.conflictChanged, name)
	delete(s.conflicted, name)
}

// due lists, unsorted, the failing Services whose retry is due.
func (s *serviceStatuses) due(now time.Time) []types.NamespacedName {
	var out []types.NamespacedName
	for n, b := range s.retrying {
		if b.Due(now) {
			out = append(out, n)
		}
	}
	return out
}

// ConflictChanges returns, sorted, the Services whose conflicts changed
// since the last call; their Status holds the new ones.
func (r *Reconciler) ConflictChanges() []types.NamespacedName {
	s := &r.statuses
	var out []types.NamespacedName
	for n := range s.conflictChanged {
		st, p := s.byName[n], r.claims.plans[n]
		if st == nil || p == nil {
			continue
		}
		cs := r.claims.conflicts(n, p)
		if !slices.Equal(cs, st.Conflicts) {
			st.Conflicts = cs
			out = append(out, n)
		}
		if len(cs) > 0 {
			s.conflicted[n] = true
		} else {
			delete(s.conflicted, n)
		}
	}
	s.conflictChanged = emptied(s.conflictChanged)
	slices.SortFunc(out, compareNames)
	return out
}

// Status returns a Service's status.
func (r *Reconciler) Status(name types.NamespacedName) (ServiceStatus, bool) {
	st, ok := r.statuses.byName[name]
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
	_, ok := r.statuses.retrying[name]
	return ok
}

// Problems returns the status of every Service that is failing or lost a
// conflict, sorted by name; its cost is the number of such Services.
func (r *Reconciler) Problems() []ServiceStatus {
	names := map[types.NamespacedName]bool{}
	for n := range r.statuses.retrying {
		names[n] = true
	}
	for n := range r.statuses.conflicted {
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
func (r *Reconciler) record(st *SyncStats, names []types.NamespacedName, now time.Time) []error {
	var errs []error
	slices.SortFunc(names, compareNames)
	for _, n := range names {
		s := r.statuses.byName[n]
		err := st.Failed[n]
		if err == nil {
			delete(st.Failed, n)
			if s != nil {
				s.Applied, s.Failures, s.LastError, s.NextRetry = true, 0, "", time.Time{}
				delete(r.statuses.retrying, n)
			}
			st.Applied = append(st.Applied, n)
			continue
		}
		errs = append(errs, fmt.Errorf("service %s: %w", n, err))
		if s == nil { // removed: its leftovers are the orphan retry's
			continue
		}
		b := r.statuses.retrying[n]
		if b == nil {
			b = &Backoff{}
			r.statuses.retrying[n] = b
		}
		b.Fail(now, r.cfg.RetryBase, r.cfg.RetryMax)
		s.Applied, s.Failures, s.LastError, s.NextRetry = false, b.failures, err.Error(), b.next
		r.log.Warn("service not fully programmed; retrying it alone", zap.String("service", n.String()),
			zap.Int("failures", b.failures), zap.Duration("retryIn", b.next.Sub(now)), zap.Time("nextRetry", b.next), zap.Error(err))
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
