package tunnelend

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// The plan's NodeEndpoints decide the hold: the pod still on the node
// keeps its end for the grace after the plan stops tunnelling; a nil plan
// (the Service is gone) removes it at once.
func TestConsumerHoldsByTheNodeEndpointsOfThePlan(t *testing.T) {
	te, k, _ := newTest(t, Config{Grace: time.Minute})
	tunnel := true
	c := Consumer{TunnelEnd: te, Ends: func(*model.ServicePlan) []End {
		if !tunnel {
			return nil
		}
		return []End{ipip("192.168.56.210", 80, pod1, 8080)}
	}}
	plan := &model.ServicePlan{Service: svcA, NodeEndpoints: []netip.Addr{pod1}}
	c.SetPlan(svcA, plan)
	if err := c.Sync(false); err != nil {
		t.Fatal(err)
	}
	programmed := k.dump()
	tunnel = false
	c.SetPlan(svcA, plan)
	if err := c.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(programmed, k.dump()); diff != "" {
		t.Errorf("held (-want +got):\n%s", diff)
	}
	c.SetPlan(svcA, nil)
	if err := c.Sync(false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cleaned, k.dump()); diff != "" {
		t.Errorf("after the Service went (-want +got):\n%s", diff)
	}
}
