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

var (
	_ consumer.ServiceReporter = Consumer{}
	_ consumer.AsBuilt         = Consumer{}
)

// AsBuilt implements consumer.AsBuilt: the ends exist before any node
// tunnels to them, while the ingress still holds the tunnels back.
func (Consumer) AsBuilt() {}

// SetPlan implements consumer.Consumer.
func (c Consumer) SetPlan(name types.NamespacedName, plan *model.ServicePlan) {
	if plan == nil {
		c.SetEnds(name, nil, nil)
		return
	}
	c.SetEnds(name, c.Ends(plan), plan.NodeEndpoints)
}

// PlanEnds are a plan's tunnel ends on this node (model.TunnelEnds): the
// Ends of the agent's Consumer.
func PlanEnds(plan *model.ServicePlan) []End {
	ends := model.TunnelEnds(plan)
	if len(ends) == 0 {
		return nil
	}
	out := make([]End, len(ends))
	for i, e := range ends {
		out[i] = End(e)
	}
	return out
}
