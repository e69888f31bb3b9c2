package tunnelend

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// NodeKernel is the node's kernel as the agent reaches it: iptables of
// backend (the glue's), netlink in the agent's network namespace, and
// sysctls under root (sysctls.Root()).
func NodeKernel(backend glue.Backend, sysctlRoot string) (Kernel, error) {
	ipt, err := glue.NewIPTables(glue.Exec{}, backend, ipset.IPv4)
	if err != nil {
		return Kernel{}, fmt.Errorf("tunnel ends: %w", err)
	}
	return Kernel{Tables: ipt, Net: Netlink{H: &netlink.Handle{}}, Sysctls: netlinkutil.Sysctls{Root: sysctlRoot}}, nil
}

// Open returns tunnel ends on the node's kernel.
func Open(cfg Config, backend glue.Backend, sysctlRoot string, log *zap.Logger) (*TunnelEnd, error) {
	k, err := NodeKernel(backend, sysctlRoot)
	if err != nil {
		return nil, err
	}
	return New(cfg, k, log.Named("tunnelend"))
}
