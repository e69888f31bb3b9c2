// nettest is a module of its own because the agent's netlinkutil tests
// (root module) import it beside the bed (e2e module): neither module may
// hold it without the other requiring the whole of it.
module github.com/ipvs-proxy/ipvs-proxy/e2e/framework/nettest

go 1.26.8

require (
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)
