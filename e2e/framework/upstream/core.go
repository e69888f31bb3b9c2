package upstream

import (
	"fmt"
	"regexp"
	"strings"
)

// core is the upstream core of `make test`: the [Conformance] tests of the
// focus that drive the proxy through its hardest paths (several ports of
// one endpoint, one port with two protocols, node ports, affinity switched
// on a live Service, an ExternalName Service turned into a NodePort one,
// several endpoint IPs in several slices), then the ones that only talk
// to the API and cost about a second each. The other [Conformance] tests
// of the focus run in `make conformance-ci`. Each entry is the end of a
// full test name, matched literally.
var core = []string{
	"Services should serve multiport endpoints from pods [Conformance]",
	"Services should serve endpoints on same port and different protocols [Conformance]",
	"Services should be able to create a functioning NodePort service [Conformance]",
	"Services should be able to switch session affinity for service with type clusterIP [LinuxOnly] [Conformance]",
	"Services should be able to change the type from ExternalName to NodePort [Conformance]",
	"EndpointSlice should support a Service with multiple endpoint IPs specified in multiple EndpointSlices [Conformance]",
	// API only.
	"API Server should have Endpoints and EndpointSlices pointing to API Server [Conformance]",
	"EndpointSlice should create and delete EndpointSlices for a Service with a selector that matches no pods [Conformance]",
	"EndpointSlice should support creating EndpointSlice API operations [Conformance]",
	"EndpointSliceMirroring should mirror a custom Endpoints resource through create update and delete [Conformance]",
	"Services should complete a service status lifecycle [Conformance]",
	"Services should delete a collection of services [Conformance]",
	"Services should find a service from listing all namespaces [Conformance]",
}

// CoreImages are the test images (archive names, as EnsureTestImages keys
// them) that the core's tests start: agnhost only (pause is the node's).
var CoreImages = []string{"agnhost.tar"}

// CoreSize is the number of tests in the core.
func CoreSize() int { return len(core) }

// NarrowToCore keeps only the core's tests (Narrow with their names,
// quoted).
func (p *Plan) NarrowToCore() error {
	quoted := make([]string, len(core))
	for i, name := range core {
		quoted[i] = regexp.QuoteMeta(name)
	}
	if err := p.Narrow(strings.Join(quoted, "|")); err != nil {
		return fmt.Errorf("the upstream core: %w", err)
	}
	return nil
}
