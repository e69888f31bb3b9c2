// Command coredns is CoreDNS (github.com/coredns/coredns, the released
// version go.mod requires) with only the plugins the bed's cluster DNS
// uses: the kubernetes plugin answers cluster.local from the apiserver,
// cache, errors, health and ready serve the Deployment's probes. It has no
// forward plugin: names outside the cluster's zones are refused, so no
// query leaves the machine. A module of its own (like e2e/tools/k8sbin), so
// CoreDNS's dependencies stay out of the main module.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives are the plugins this build knows, in CoreDNS's own order
// (core/dnsserver/zdirectives.go): the order a query goes through them.
var directives = []string{"ready", "health", "errors", "cache", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
