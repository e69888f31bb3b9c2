package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/reconciler"
)

// TestSlowPartialSyncLogged: a partial sync is logged at info level (with
// its parts) when it took slowSync or more, as a full one always is; a
// quick partial sync only at debug level.
func TestSlowPartialSyncLogged(t *testing.T) {
	for _, tc := range []struct {
		name  string
		full  bool
		took  time.Duration
		lines int
	}{
		{"quick partial", false, 50 * time.Millisecond, 0},
		{"slow partial", false, slowSync, 1},
		{"quick full", true, 50 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			r := newReporter(NewMetrics(prometheus.NewRegistry()), nil, "node-1", clocktesting.NewFakeClock(time.Now()), zap.New(core))
			r.logSync(reconciler.SyncStats{Full: tc.full, Writes: 600, Duration: tc.took / 2}, syncTimes{build: tc.took / 4, consumers: tc.took / 3}, tc.took)
			got := logs.FilterMessage("synced").All()
			if len(got) != tc.lines {
				t.Fatalf("%d info lines \"synced\", want %d", len(got), tc.lines)
			}
			if m := got; tc.lines == 1 && (m[0].ContextMap()["writes"] != int64(600) || m[0].ContextMap()["build"] != tc.took/4) {
				t.Errorf("the line lacks the sync's parts: %v", got[0].ContextMap())
			}
		})
	}
}
