package tunnelend

import (
	"context"
	"fmt"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// Tables reads and writes iptables (a *glue.IPTables of the IPv4 family).
type Tables interface {
	Save(ctx context.Context) (glue.Saved, error)
	Restore(ctx context.Context, input string) error
}

// Rule is the policy rule: packets whose mark has Mark under Mask look up
// Table, at Priority.
type Rule struct {
	Priority   int
	Mark, Mask uint32
	Table      int
}

func (r Rule) String() string {
	return fmt.Sprintf("%d: fwmark %#x/%#x lookup %d", r.Priority, r.Mark, r.Mask, r.Table)
}

// Route is a route of the agent's table; only "local 0.0.0.0/0 dev lo" is
// written, any other found there is removed.
type Route struct {
	Table int
	// Local is a local route (RTN_LOCAL) of Dst through Dev.
	Local    bool
	Dst, Dev string
}

func (r Route) String() string {
	kind := "unicast"
	if r.Local {
		kind = "local"
	}
	return fmt.Sprintf("%s %s dev %s table %d", kind, r.Dst, r.Dev, r.Table)
}

// Link is the state of an interface.
type Link struct{ Exists, Up bool }

// Net is the routing side of the kernel: rules, routes, the tunnel device
// and fou's receive ports. Each call is one netlink request.
type Net interface {
	// Rules lists the IPv4 policy rules at a priority.
	Rules(priority int) ([]Rule, error)
	AddRule(r Rule) error
	DelRule(r Rule) error
	// Routes lists the IPv4 routes of a table.
	Routes(table int) ([]Route, error)
	AddRoute(r Route) error
	DelRoute(r Route) error
	Link(name string) (Link, error)
	SetUp(name string) error
	// FouPorts lists fou's IPv4 GUE receive ports.
	FouPorts() ([]uint16, error)
	AddFou(port uint16) error
	DelFou(port uint16) error
}

// Sysctls reads and sets kernel parameters ("net/ipv4/conf/all/rp_filter";
// netlinkutil.Sysctls).
type Sysctls interface {
	Get(name string) (string, error)
	Ensure(name, value string) (old string, err error)
}

// The sysctls: rp_filter's effective value on tunl0 is the larger of all's
// and tunl0's, and an address-less tunl0 fails even loose mode (DSR.md).
const (
	sysctlAllRPFilter    = "net/ipv4/conf/all/rp_filter"
	sysctlDeviceRPFilter = "net/ipv4/conf/" + Device + "/rp_filter"
)

// Kernel is everything Sync touches.
type Kernel struct {
	Tables  Tables
	Net     Net
	Sysctls Sysctls
}
