// Package modeltest builds the plain values of package model from short
// strings (the kernel's value types with ktypestest), for the tests of
// every package that handles plans: the model, the reconciler, the glue.
package modeltest

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// VS is the plan of a TCP virtual server "addr:port" of a kind, with a
// scheduler and real servers parsed by RS.
func VS(kind model.AddressKind, addrPort, sched string, rss ...string) model.VSPlan {
	return model.VSPlan{VirtualServer: ktypes.VirtualServer{VSKey: ktypestest.VSKey(addrPort, ktypes.TCP), Scheduler: sched}, Kind: kind,
		RealServers: ktypestest.RSs(rss...)}
}

// Plan is a Service's plan with these virtual servers.
func Plan(name types.NamespacedName, vss ...model.VSPlan) *model.ServicePlan {
	return &model.ServicePlan{Service: name, VirtualServers: vss}
}
