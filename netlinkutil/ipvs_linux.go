package netlinkutil

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernelIPVS implements IPVS over generic netlink with github.com/moby/ipvs.
// The socket belongs to the network namespace of the calling thread at the
// time NewIPVS was called.
type kernelIPVS struct {
	h *ipvs.Handle
}

// NewIPVS opens a netlink socket to the IPVS of the current network
// namespace. It fails when the kernel has no IPVS (module ip_vs not loaded
// and not loadable).
func NewIPVS() (IPVS, error) {
	// moby/ipvs only logs when the IPVS generic netlink family is missing,
	// and its calls then "succeed" without doing anything: ask first.
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		return nil, fmt.Errorf("the kernel has no IPVS (generic netlink family IPVS not found; is the ip_vs module loaded?): %w", err)
	}
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket (is the ip_vs module loaded?): %w", err)
	}
	return &kernelIPVS{h: h}, nil
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func toService(k model.VSKey) *ipvs.Service {
	s := &ipvs.Service{
		AddressFamily: family(k.Address),
		Address:       net.IP(k.Address.AsSlice()),
		Protocol:      uint16(k.Protocol),
		Port:          k.Port,
		Netmask:       0xffffffff,
	}
	if k.Address.Is6() {
		s.Netmask = 128
	}
	return s
}

func toKernelVS(v model.VirtualServer) *ipvs.Service {
	s := toService(v.VSKey)
	s.SchedName = v.Scheduler
	s.Flags = v.Flags & model.FlagsCompared
	if v.Flags&model.FlagPersistent != 0 {
		s.Timeout = v.Timeout
	}
	return s
}

func toDestination(rs model.RealServer) *ipvs.Destination {
	return &ipvs.Destination{
		AddressFamily:   family(rs.Address),
		Address:         net.IP(rs.Address.AsSlice()),
		Port:            rs.Port,
		Weight:          rs.Weight,
		ConnectionFlags: ipvs.ConnectionFlagMasq,
	}
}

func addrFromIP(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

func (k *kernelIPVS) ListVirtualServers() ([]model.VirtualServer, error) {
	svcs, err := k.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("dump IPVS services: %w", err)
	}
	out := make([]model.VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 {
			continue // fwmark services are never ours
		}
		a, ok := addrFromIP(s.Address)
		if !ok {
			continue
		}
		out = append(out, model.VirtualServer{
			VSKey:     model.VSKey{Address: a, Protocol: model.Protocol(s.Protocol), Port: s.Port},
			Scheduler: s.SchedName,
			Flags:     s.Flags,
			Timeout:   s.Timeout,
		})
	}
	return out, nil
}

func (k *kernelIPVS) ListRealServers(vs model.VSKey) ([]model.RealServer, error) {
	ds, err := k.h.GetDestinations(toService(vs))
	if err != nil {
		return nil, fmt.Errorf("dump IPVS destinations of %s: %w", vs, err)
	}
	out := make([]model.RealServer, 0, len(ds))
	for _, d := range ds {
		a, ok := addrFromIP(d.Address)
		if !ok {
			continue
		}
		out = append(out, model.RealServer{
			RSKey:         model.RSKey{Address: a, Port: d.Port},
			Weight:        d.Weight,
			ActiveConns:   d.ActiveConnections,
			InactiveConns: d.InactiveConnections,
		})
	}
	return out, nil
}

func (k *kernelIPVS) AddVirtualServer(vs model.VirtualServer) error {
	if err := k.h.NewService(toKernelVS(vs)); err != nil {
		return fmt.Errorf("add IPVS service %s: %w", vs, err)
	}
	return nil
}

func (k *kernelIPVS) UpdateVirtualServer(vs model.VirtualServer) error {
	if err := k.h.UpdateService(toKernelVS(vs)); err != nil {
		return fmt.Errorf("update IPVS service %s: %w", vs, err)
	}
	return nil
}

func (k *kernelIPVS) DeleteVirtualServer(vs model.VSKey) error {
	if err := k.h.DelService(toService(vs)); err != nil {
		return fmt.Errorf("delete IPVS service %s: %w", vs, err)
	}
	return nil
}

func (k *kernelIPVS) AddRealServer(vs model.VSKey, rs model.RealServer) error {
	if err := k.h.NewDestination(toService(vs), toDestination(rs)); err != nil {
		return fmt.Errorf("add IPVS destination %s to %s: %w", rs.RSKey, vs, err)
	}
	return nil
}

func (k *kernelIPVS) UpdateRealServer(vs model.VSKey, rs model.RealServer) error {
	if err := k.h.UpdateDestination(toService(vs), toDestination(rs)); err != nil {
		return fmt.Errorf("update IPVS destination %s of %s: %w", rs.RSKey, vs, err)
	}
	return nil
}

func (k *kernelIPVS) DeleteRealServer(vs model.VSKey, rs model.RSKey) error {
	if err := k.h.DelDestination(toService(vs), toDestination(model.RealServer{RSKey: rs})); err != nil {
		return fmt.Errorf("delete IPVS destination %s of %s: %w", rs, vs, err)
	}
	return nil
}

func (k *kernelIPVS) SetTimeouts(t Timeouts) error {
	if err := k.h.SetConfig(&ipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP}); err != nil {
		return fmt.Errorf("set IPVS timeouts: %w", err)
	}
	return nil
}

func (k *kernelIPVS) Close() { k.h.Close() }
