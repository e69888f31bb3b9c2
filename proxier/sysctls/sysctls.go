// Package sysctls holds the kernel settings the agent needs and sets, and
// where it reads and writes them (Root).
package sysctls

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/kmod"
)

// Setting is one kernel setting, named by its path under /proc/sys.
type Setting struct{ Name, Value string }

// IPVS are the kernel settings IPVS needs, as kube-proxy sets them:
// conntrack for IPVS connections so that iptables can masquerade them; drop
// connections to a deleted real server at once instead of black-holing
// them; expire persistence templates of a quiescent real server; forward
// packets to backends. conn_reuse_mode depends on the kernel (ForKernel).
var IPVS = []Setting{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv4/vs/conntrack", "1"},
	{"net/ipv4/vs/expire_nodest_conn", "1"},
	{"net/ipv4/vs/expire_quiescent_template", "1"},
}

// IPv6Forwarding is the setting IPv6 adds to IPVS: set by IPv6Forwarder,
// only once the node serves an IPv6 virtual server.
var IPv6Forwarding = Setting{"net/ipv6/conf/all/forwarding", "1"}

// StrictARP are the kernel settings of --strict-arp: answer ARP only for
// addresses of the receiving interface (not for the VIPs on the dummy), and
// announce the interface's own address as the sender.
var StrictARP = []Setting{
	{"net/ipv4/conf/all/arp_ignore", "1"},
	{"net/ipv4/conf/all/arp_announce", "2"},
}

// ForKernel returns the settings IPVS needs on a kernel of this release
// (uname -r): IPVS, and conn_reuse_mode as netlinkutil.ConnReuseMode
// decides it (0 before 5.9, the kernel's default 1 from then on).
func ForKernel(release string) ([]Setting, error) {
	all := slices.Clone(IPVS)
	v, set, err := netlinkutil.ConnReuseMode(release)
	if err != nil {
		return nil, err
	}
	if set {
		all = append(all, Setting{netlinkutil.ConnReuseModeSysctl, v})
	}
	return all, nil
}

// Ensure sets and logs the settings IPVS needs on the running kernel
// (ForKernel).
func Ensure(log *zap.Logger) error {
	s := netlinkutil.Sysctls{Root: Root()} // /host/proc/sys in the DaemonSet (container.go)
	// From uname, not kernel/osrelease: the DaemonSet mounts only the
	// node's /proc/sys/net under Root.
	release, err := kmod.Release()
	if err != nil {
		return err
	}
	all, err := ForKernel(release)
	if err != nil {
		return err
	}
	for _, sc := range all {
		old, err := s.Ensure(sc.Name, sc.Value)
		if err != nil {
			return err
		}
		if old != sc.Value {
			log.Info("set sysctl", zap.String("name", sc.Name), zap.String("value", sc.Value), zap.String("was", old))
		} else {
			log.Info("sysctl already set", zap.String("name", sc.Name), zap.String("value", sc.Value))
		}
	}
	return nil
}

// EnsureStrictARP sets and logs the settings of --strict-arp, when on.
func EnsureStrictARP(log *zap.Logger, strictARP bool) error {
	if !strictARP {
		return nil
	}
	s := netlinkutil.Sysctls{Root: Root()} // as Ensure
	for _, sc := range StrictARP {
		old, err := s.Ensure(sc.Name, sc.Value)
		if err != nil {
			return fmt.Errorf("--strict-arp: %w", err)
		}
		log.Info("set sysctl", zap.String("name", sc.Name), zap.String("value", sc.Value), zap.String("was", old))
	}
	return nil
}
