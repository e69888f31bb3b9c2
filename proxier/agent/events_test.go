package agent

import (
	"fmt"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
)

// TestEventsBoundedPerNode: 1,000 bad Services on one node send at most the
// node's burst of Events at once; the rest are dropped and logged as a
// count (the first drop logs, then at most once a minute).
func TestEventsBoundedPerNode(t *testing.T) {
	fake := record.NewFakeRecorder(2000)
	core, logs := observer.New(zap.WarnLevel)
	r := newLimitedRecorder(fake, flowcontrol.NewTokenBucketPassiveRateLimiter(0.001, eventsPerNodeBurst), zap.New(core))
	for i := range 1000 {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("s", i)}}
		r.Event(svc, corev1.EventTypeWarning, "ServiceNotProgrammed", "over a limit")
	}
	if n := len(fake.Events); n != eventsPerNodeBurst {
		t.Errorf("%d Events recorded for 1,000 Services, want the node's burst, %d", n, eventsPerNodeBurst)
	}
	if got := logs.FilterMessageSnippet("Events dropped").Len(); got != 1 {
		t.Errorf("%d log lines about dropped Events, want 1 (at most one a minute)", got)
	}
	// The end of a failure is never dropped by the node's bucket.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s0"}}
	r.Event(svc, corev1.EventTypeNormal, "ServiceProgrammed", "programmed again")
	if n := len(fake.Events); n != eventsPerNodeBurst+1 {
		t.Errorf("a Normal Event past the node's burst was dropped (%d recorded)", n)
	}
}
