package netlinkutil

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nlbatch"
)

// kernelIPVS implements IPVS over generic netlink: virtual server calls
// and dumps with github.com/moby/ipvs, real server writes (batched or one
// at a time) on a socket of its own (package nlbatch), destination dumps
// decoded here (dumps; moby/ipvs knows no tunnel type), and the bulk read
// of destinations from /proc. The sockets and the /proc file belong to the
// network namespace of the calling thread at the time NewIPVS was called.
type kernelIPVS struct {
	h        *ipvs.Handle
	batch    *nlbatch.Socket
	dumps    *nl.SocketHandle
	familyID uint16
	table    *procTable
	// sys is this network namespace's /proc/sys (the agent's own), and
	// nodestRestore the value of expire_nodest_conn to set back after a
	// batch of moves ("" when nothing is held; see holdNodestConns).
	sys           Sysctls
	nodestRestore string
}

// NewIPVS opens a netlink socket to the IPVS of the current network
// namespace. It fails when the kernel has no IPVS (module ip_vs not loaded
// and not loadable).
func NewIPVS() (IPVS, error) {
	return NewIPVSWithSysctls("/proc/sys")
}

// NewIPVSWithSysctls is NewIPVS with the /proc/sys of this network
// namespace at root (the agent's container has the host's at
// /host/proc/sys, writable), where a batch that moves real servers holds
// expire_nodest_conn (see holdNodestConns).
func NewIPVSWithSysctls(root string) (IPVS, error) {
	// moby/ipvs only logs when the IPVS generic netlink family is missing,
	// and its calls then "succeed" without doing anything: ask first.
	fam, err := netlink.GenlFamilyGet("IPVS")
	if err != nil {
		return nil, fmt.Errorf("the kernel has no IPVS (generic netlink family IPVS not found; is the ip_vs module loaded?): %w", err)
	}
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket (is the ip_vs module loaded?): %w", err)
	}
	b, err := nlbatch.Open(unix.NETLINK_GENERIC)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open IPVS batch socket: %w", err)
	}
	dumps, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		h.Close()
		b.Close()
		return nil, fmt.Errorf("open IPVS dump socket: %w", err)
	}
	table, err := openProcTable()
	if err != nil {
		h.Close()
		b.Close()
		dumps.Close()
		return nil, err
	}
	return &kernelIPVS{h: h, batch: b, dumps: &nl.SocketHandle{Socket: dumps}, familyID: fam.ID, table: table,
		sys: Sysctls{Root: root}}, nil
}

func toService(k ktypes.VSKey) *ipvs.Service {
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

func toKernelVS(v ktypes.VirtualServer) *ipvs.Service {
	s := toService(v.VSKey)
	s.SchedName = v.Scheduler
	s.Flags = v.Flags & ktypes.FlagsCompared
	if v.Flags&ktypes.FlagPersistent != 0 {
		s.Timeout = v.Timeout
	}
	return s
}

func addrFromIP(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

func (k *kernelIPVS) ListVirtualServers() ([]ktypes.VirtualServer, error) {
	svcs, err := k.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("dump IPVS services: %w", err)
	}
	out := make([]ktypes.VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 {
			continue // fwmark services are never ours
		}
		a, ok := addrFromIP(s.Address)
		if !ok {
			continue
		}
		out = append(out, ktypes.VirtualServer{
			VSKey:     ktypes.VSKey{Address: a, Protocol: ktypes.Protocol(s.Protocol), Port: s.Port},
			Scheduler: s.SchedName,
			Flags:     s.Flags,
			Timeout:   s.Timeout,
		})
	}
	return out, nil
}

// VirtualServerStats implements StatsReader.
func (k *kernelIPVS) VirtualServerStats() (map[ktypes.VSKey]ktypes.Stats, error) {
	svcs, err := k.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("dump IPVS services: %w", err)
	}
	out := make(map[ktypes.VSKey]ktypes.Stats, len(svcs))
	for _, s := range svcs {
		a, ok := addrFromIP(s.Address)
		if s.FWMark != 0 || !ok {
			continue
		}
		out[ktypes.VSKey{Address: a, Protocol: ktypes.Protocol(s.Protocol), Port: s.Port}] = ktypes.Stats{
			Connections: uint64(s.Stats.Connections), PacketsIn: uint64(s.Stats.PacketsIn), PacketsOut: uint64(s.Stats.PacketsOut),
			BytesIn: s.Stats.BytesIn, BytesOut: s.Stats.BytesOut}
	}
	return out, nil
}

// ListRealServers implements IPVS: one destination dump.
func (k *kernelIPVS) ListRealServers(vs ktypes.VSKey) ([]ktypes.RealServer, error) {
	return k.dumpRealServers(vs)
}

// one makes a single write with fn and gives its error the write's context.
func one(w Write, fn func() error) error {
	if err := fn(); err != nil {
		return WrapWrite(w, err)
	}
	return nil
}

func (k *kernelIPVS) AddVirtualServer(vs ktypes.VirtualServer) error {
	return one(Write{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs}, func() error { return k.h.NewService(toKernelVS(vs)) })
}

func (k *kernelIPVS) UpdateVirtualServer(vs ktypes.VirtualServer) error {
	return one(Write{Kind: ktypes.OpUpdateVirtualServer, VirtualServer: vs}, func() error { return k.h.UpdateService(toKernelVS(vs)) })
}

func (k *kernelIPVS) DeleteVirtualServer(vs ktypes.VSKey) error {
	return one(Write{Kind: ktypes.OpDeleteVirtualServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}},
		func() error { return k.h.DelService(toService(vs)) })
}

// AddRealServer, UpdateRealServer and DeleteRealServer are batches of one:
// the encoder is the one place that renders a destination, its forwarding
// method included.
func (k *kernelIPVS) AddRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	return k.Apply([]Write{{Kind: ktypes.OpAddRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}, RealServer: rs}})[0]
}

func (k *kernelIPVS) UpdateRealServer(vs ktypes.VSKey, rs ktypes.RealServer) error {
	return k.Apply([]Write{{Kind: ktypes.OpUpdateRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs}, RealServer: rs}})[0]
}

func (k *kernelIPVS) DeleteRealServer(vs ktypes.VSKey, rs ktypes.RSKey) error {
	return k.Apply([]Write{{Kind: ktypes.OpDeleteRealServer, VirtualServer: ktypes.VirtualServer{VSKey: vs},
		RealServer: ktypes.RealServer{RSKey: rs}}})[0]
}

func (k *kernelIPVS) SetTimeouts(t Timeouts) error {
	if err := k.h.SetConfig(&ipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP}); err != nil {
		return fmt.Errorf("set IPVS timeouts: %w", err)
	}
	return nil
}

func (k *kernelIPVS) Close() {
	k.h.Close()
	k.batch.Close()
	k.dumps.Socket.Close()
	k.table.Close()
}

// ListAllRealServers implements IPVS. /proc/net/ip_vs names a tunnel
// destination's method ("Tunnel") but not its type nor port: a virtual
// server with one is read again by a destination dump, so a table
// without tunnels costs the one read of the file, as before tunnels.
func (k *kernelIPVS) ListAllRealServers() (map[ktypes.VSKey][]ktypes.RealServer, error) {
	all, err := k.table.read()
	if err != nil {
		return nil, err
	}
	for vs, rss := range all {
		if !hasTunnel(rss) {
			continue
		}
		if all[vs], err = k.dumpRealServers(vs); err != nil {
			return nil, err
		}
	}
	return all, nil
}

func hasTunnel(rss []ktypes.RealServer) bool {
	for _, rs := range rss {
		if rs.Forward == ktypes.ForwardTunnel {
			return true
		}
	}
	return false
}
