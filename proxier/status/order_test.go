package status

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// TestStatusOrderDrift: an sh virtual server whose real servers are out of
// canonical order (here the second one added again, so at the head) is
// one drift row naming the move, not an extra and a missing real server.
func TestStatusOrderDrift(t *testing.T) {
	objs := []runtime.Object{
		stService("hashed", "10.96.0.30", func(s *corev1.Service) {
			s.Annotations = map[string]string{scheduler.AnnotationScheduler: "sh"}
		}), stSlice("hashed", "10.0.4.1", "10.0.4.2"),
	}
	ipvs, links := programmed(t, objs)
	k := vsKey("10.96.0.30", 80)
	must(t, ipvs.DeleteRealServer(k, rsKey("10.0.4.2")))
	must(t, ipvs.AddRealServer(k, ktypes.RealServer{RSKey: rsKey("10.0.4.2"), Weight: 1}))
	rep := collect(t, ipvs, links, k8sfake.NewClientset(objs...), nil)
	var kinds []string
	for _, d := range rep.Drift {
		kinds = append(kinds, d.Kind)
	}
	if diff := cmp.Diff([]string{driftOrder}, kinds); diff != "" {
		t.Errorf("drift kinds (-want +got):\n%s\n%+v", diff, rep.Drift)
	}
	rows := map[string]string{}
	for _, rs := range findVS(rep, k).RealServers {
		rows[rs.Address] = rs.Drift
	}
	if diff := cmp.Diff(map[string]string{"10.0.4.1": "order", "10.0.4.2": ""}, rows); diff != "" {
		t.Errorf("real server rows' drift (-want +got):\n%s", diff)
	}
}
