// Package netlinkutil is ipvs-proxy's only door to the kernel's IPVS table and
// to the links and addresses that carry virtual IPs. It reads and writes the
// plain values of package proxier/model, so that the reconciler can be tested
// against a fake that records calls and injects errors (see package
// netlinkutil/fake) and the same behaviour shown against the real kernel.
package netlinkutil

import (
	"errors"
	"net/netip"
	"syscall"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Timeouts are IPVS's connection timeouts; zero leaves a value unchanged.
type Timeouts struct {
	TCP, TCPFin, UDP time.Duration
}

// SchedulerUnavailable reports whether an error of AddVirtualServer or
// UpdateVirtualServer means the kernel lacks the virtual server's scheduler:
// IPVS answers ENOENT when it cannot find or load module ip_vs_<name>.
func SchedulerUnavailable(err error) bool { return errors.Is(err, syscall.ENOENT) }

// IPVS is the kernel's IPVS table.
type IPVS interface {
	// ListVirtualServers dumps every virtual server in one netlink request.
	ListVirtualServers() ([]model.VirtualServer, error)
	// ListRealServers dumps the destinations of one virtual server.
	ListRealServers(vs model.VSKey) ([]model.RealServer, error)
	AddVirtualServer(vs model.VirtualServer) error
	UpdateVirtualServer(vs model.VirtualServer) error
	DeleteVirtualServer(vs model.VSKey) error
	AddRealServer(vs model.VSKey, rs model.RealServer) error
	UpdateRealServer(vs model.VSKey, rs model.RealServer) error
	DeleteRealServer(vs model.VSKey, rs model.RSKey) error
	SetTimeouts(t Timeouts) error
	Close()
}

// Links manages the dummy interface that holds virtual IPs, and reads the
// node's own addresses.
type Links interface {
	// EnsureDummy creates the dummy link if missing and sets it up.
	EnsureDummy(name string) error
	// DeleteLink removes a link; a missing link is not an error.
	DeleteLink(name string) error
	// ListAddresses lists the addresses bound to a link (nil if it does not
	// exist).
	ListAddresses(link string) ([]netip.Addr, error)
	AddAddress(link string, addr netip.Addr) error
	DeleteAddress(link string, addr netip.Addr) error
	// NodeAddresses lists the unicast addresses of every link but loopback
	// and the links named in exclude.
	NodeAddresses(exclude ...string) ([]netip.Addr, error)
}
