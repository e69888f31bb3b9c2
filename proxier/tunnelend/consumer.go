package tunnelend

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/consumer"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Consumer drives TunnelEnd from the agent's plans: Ends picks a plan's
// tunnel ends on this node; the plan's NodeEndpoints are the endpoint
// addresses whose ends are held for the grace when they leave.
type Consumer struct {
	*TunnelEnd
	Ends func(*model.ServicePlan) []End
}

var _ consumer.ServiceReporter = Consumer{}

// SetPlan implements consumer.Consumer.
func (c Consumer) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	if plan == nil {
		c.SetEnds(name, nil, nil)
		return
	}
	c.SetEnds(name, c.Ends(plan), plan.NodeEndpoints)
}
