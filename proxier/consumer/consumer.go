// Package consumer is what the agent's sync loop drives besides the IPVS
// reconciler: the parts of the node's data plane that follow the same plans
// (the iptables glue, the health-check server) implement Consumer, and a
// consumer that reads the kernel off the loop uses OffLoop. It is a leaf:
// the agent imports it to drive consumers, and the consumers import it to be
// driven, so neither imports the other.
package consumer

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Consumer is another part of the node's data plane driven by the same
// plans: the iptables glue and the health-check server. It is told of every
// plan change, then synced after the IPVS reconciler. A failed Sync is
// retried with a full Sync of that consumer alone, after its own backoff.
type Consumer interface {
	// Name names the consumer in logs and errors.
	Name() string
	// SetPlan records the plan of a Service; nil means it is gone.
	SetPlan(name types.NamespacedName, plan *model.ServicePlan)
	// Sync applies what changed; full re-reads and repairs all of it.
	Sync(full bool) error
}

// ServiceReporter is a Consumer that can fail for single Services (a Service
// over a limit of the consumer's, an entry the kernel refused) without
// failing its Sync: it tells which Services it could not program as of its
// last Sync, and why. The agent reports them as failing, each on its own
// Service.
type ServiceReporter interface {
	Consumer
	ServiceFailures() map[types.NamespacedName]string
	// Retry reports whether some of those failures may pass at a later
	// Sync (a write the kernel refused): the consumer is then synced
	// again after its backoff, as after a failed Sync. Failures that
	// stand until the Service changes (over a limit) ask for none.
	Retry() bool
}

// AsBuilt is a Consumer that is given Services' plans as built, not as
// IPVS is (the agent holds new tunnels back as NAT for a few seconds, so
// that their ends exist first): the tunnel ends, which are that first.
type AsBuilt interface {
	Consumer
	AsBuilt()
}

// AfterReconciler is a Consumer that syncs after the reconciler in each
// sync, not beside it: the health-check server, whose 200 tells a load
// balancer to send the node traffic that IPVS must already serve.
type AfterReconciler interface {
	Consumer
	AfterReconciler()
}

// BackgroundConsumer is a Consumer whose periodic full sync reads the kernel
// off the sync loop, so that it holds no change up: Sync(true) starts the
// read and returns; when the read is done the consumer calls wake, and the
// loop's next sync, partial, applies what it found.
type BackgroundConsumer interface {
	Consumer
	// SetWake gives the function that asks the loop for a sync.
	SetWake(wake func())
	// Pending reports that a finished read waits for a sync.
	Pending() bool
}

// Yielder is a BackgroundConsumer whose repair of a finished read can wait
// one sync: the loop asks it to (Yield) before a sync that carries
// Service changes, so that they are not held up by the repair; the next
// sync, which comes at once, makes it. Asked at every sync, it yields
// every other one, so that the repair is made under constant changes too.
type Yielder interface {
	BackgroundConsumer
	Yield()
}
