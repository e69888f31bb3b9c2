package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSoakRoundsChurnOnlyTheirs runs the soak's rounds against a fake API
// (no VM): each round scales, restarts every other round, keeps two
// batches of its Services and moves a window of bulk slices; the end
// leaves only the Deployments' Services; the live Service is never
// written.
func TestSoakRoundsChurnOnlyTheirs(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	s := &soak{nodesBed: &nodesBed{ctx: ctx, fast: cs, size: 30}, batch: 5}
	live, err := cs.CoreV1().Services(chaosNodesNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "live"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.fakeServices(chaosNodesBulkNS, "bulk-", 0, s.size); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{soakScaled, soakRestarted} {
		if _, err := cs.AppsV1().Deployments(chaosSoakNS).Create(ctx, soakDeployment(name, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 4 {
		s.round(k)
		s.churn.rounds++
	}
	if got, want := soakServices(t, s), []string{"soak-100010", "soak-100014", "soak-100019"}; !slices.Equal(got, want) {
		t.Errorf("after 4 rounds the soak's Services are %v (first, fifth, last); want rounds 2 and 3's batches %v", got, want)
	}
	scaled, err := cs.AppsV1().Deployments(chaosSoakNS).Get(ctx, soakScaled, metav1.GetOptions{})
	if err != nil || *scaled.Spec.Replicas != 3 {
		t.Errorf("after round 3 the scaled Deployment wants %v replicas (%v); want 3", scaled.Spec.Replicas, err)
	}
	restarted, err := cs.AppsV1().Deployments(chaosSoakNS).Get(ctx, soakRestarted, metav1.GetOptions{})
	if err != nil || restarted.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] == "" {
		t.Errorf("the restarted Deployment's template has no restartedAt (%v)", err)
	}
	es, err := cs.DiscoveryV1().EndpointSlices(chaosNodesBulkNS).Get(ctx, "bulk-7-ipv4", metav1.GetOptions{})
	if err != nil || len(es.Endpoints) != 2 || es.Endpoints[1].Addresses[0] == fakeEndpoints(7, 2)[1] {
		t.Errorf("bulk-7's slice (in round 0's window) was not given a new second endpoint: %+v (%v)", es, err)
	}
	s.endBatches()
	if got := soakServices(t, s); len(got) != 0 {
		t.Errorf("after the end's deletions the soak's Services are %v; want none", got)
	}
	ch := s.churn
	if ch.errs != 0 || ch.scales != 4 || ch.restarts != 2 || ch.created != 20 || ch.deleted != 20 || ch.slices != 40 {
		t.Errorf("churn counts %+v; want 0 errors, 4 scales, 2 restarts, 20 Services created and deleted, 40 slices changed", ch)
	}
	now, err := cs.CoreV1().Services(chaosNodesNS).Get(ctx, "live", metav1.GetOptions{})
	if err != nil || now.ResourceVersion != live.ResourceVersion {
		t.Errorf("the live Service was written by the churn: %v -> %v (%v)", live.ResourceVersion, now.ResourceVersion, err)
	}
}

// soakServices are the soak's own Services (soak-*) in the soak's
// namespace: the first, the fifth and the last, sorted, or none.
func soakServices(t *testing.T, s *soak) []string {
	t.Helper()
	l, err := s.fast.CoreV1().Services(chaosSoakNS).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range l.Items {
		if strings.HasPrefix(svc.Name, "soak-") {
			names = append(names, svc.Name)
		}
	}
	slices.Sort(names)
	if len(names) < 5 {
		return names
	}
	return []string{names[0], names[4], names[len(names)-1]}
}
