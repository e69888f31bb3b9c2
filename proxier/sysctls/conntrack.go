package sysctls

import (
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// Conntrack is the node's connection tracking as kube-proxy's conntrack
// configuration sets it (KubeProxyConntrackConfiguration, the same
// defaults): the table's size and the timeouts of TCP and UDP entries.
// Every Service connection is tracked (IPVS with net.ipv4.vs.conntrack=1,
// masquerade), so these limits are the node proxy's to set. Zero leaves a
// setting as the kernel has it.
type Conntrack struct {
	// MaxPerCore entries per CPU, at least Min, make nf_conntrack_max.
	MaxPerCore, Min int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout: how long an idle
	// established connection, and one half-closed by its server (a
	// client that never closes), are kept.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal marks out-of-window packets INVALID no more (they are
	// then not dropped as such).
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout: unreplied and replied UDP flows.
	UDPTimeout, UDPStreamTimeout time.Duration
}

// DefaultConntrack is kube-proxy's default.
var DefaultConntrack = Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}

const (
	conntrackMax     = "net/netfilter/nf_conntrack_max"
	conntrackBuckets = "net/netfilter/nf_conntrack_buckets"
)

// Validate reports a setting that cannot be applied.
func (c Conntrack) Validate() error {
	if c.MaxPerCore < 0 || c.Min < 0 {
		return fmt.Errorf("conntrack: maxPerCore (%d) and min (%d) must not be negative", c.MaxPerCore, c.Min)
	}
	for name, d := range map[string]time.Duration{"tcpEstablishedTimeout": c.TCPEstablishedTimeout, "tcpCloseWaitTimeout": c.TCPCloseWaitTimeout,
		"udpTimeout": c.UDPTimeout, "udpStreamTimeout": c.UDPStreamTimeout} {
		if d < 0 || (d > 0 && d < time.Second) {
			return fmt.Errorf("conntrack: %s %s must be 0 or at least 1s", name, d)
		}
	}
	return nil
}

// maxLimit caps MaxPerCore × CPUs, as kube-proxy does: a table of more
// than 1M entries costs memory that many-core nodes need elsewhere.
const maxLimit = 1 << 20

// Max is the table size for cpus CPUs (0: leave the kernel's): MaxPerCore
// per CPU, at most 1M (whatever Min), at least Min, as kube-proxy computes
// it.
func (c Conntrack) Max(cpus int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	scaled := c.MaxPerCore * cpus
	if c.MaxPerCore > maxLimit || scaled > maxLimit {
		return maxLimit
	}
	return max(scaled, c.Min)
}

// Settings are the sysctls c sets on a node of cpus CPUs, in order.
func (c Conntrack) Settings(cpus int) []Setting {
	var out []Setting
	if m := c.Max(cpus); m > 0 {
		out = append(out, Setting{conntrackMax, strconv.Itoa(m)})
	}
	seconds := func(name string, d time.Duration) {
		if d > 0 {
			out = append(out, Setting{name, strconv.Itoa(int(d / time.Second))})
		}
	}
	seconds("net/netfilter/nf_conntrack_tcp_timeout_established", c.TCPEstablishedTimeout)
	seconds("net/netfilter/nf_conntrack_tcp_timeout_close_wait", c.TCPCloseWaitTimeout)
	if c.TCPBeLiberal {
		out = append(out, Setting{"net/netfilter/nf_conntrack_tcp_be_liberal", "1"})
	}
	seconds("net/netfilter/nf_conntrack_udp_timeout", c.UDPTimeout)
	seconds("net/netfilter/nf_conntrack_udp_timeout_stream", c.UDPStreamTimeout)
	return out
}

// EnsureConntrack sets c's sysctls on a node of cpus CPUs and logs each.
// As kube-proxy does, the hash table grows to a quarter of the table's
// size when it is smaller (nf_conntrack_buckets; never shrunk). A setting
// the kernel refuses (nf_conntrack not loaded; the table's size is
// read-only where the node itself runs in a network namespace, as kind's
// nodes do: set conntrackMaxPerCore to 0 there) is logged as a warning
// with the remedy and the others are still set: the Services are served
// either way, with the kernel's limits. Only an invalid c is an error.
func EnsureConntrack(log *zap.Logger, c Conntrack, cpus int) error {
	return ensureConntrack(log, netlinkutil.Sysctls{Root: Root()}, c, cpus)
}

func ensureConntrack(log *zap.Logger, s netlinkutil.Sysctls, c Conntrack, cpus int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	set := func(name, value string) {
		old, err := s.Ensure(name, value)
		if err != nil {
			log.Warn("connection tracking setting not applied; the kernel's stays (is nf_conntrack loaded? where the node's netfilter limits are read-only, set conntrackMaxPerCore: 0)",
				zap.String("name", name), zap.String("value", value), zap.Error(err))
			return
		}
		if old != value {
			log.Info("set sysctl", zap.String("name", name), zap.String("value", value), zap.String("was", old))
		}
	}
	if m := c.Max(cpus); m > 0 {
		cur, err := s.Get(conntrackBuckets)
		if n, perr := strconv.Atoi(cur); err == nil && perr == nil && n < m/4 {
			set(conntrackBuckets, strconv.Itoa(m/4))
		}
	}
	for _, sc := range c.Settings(cpus) {
		set(sc.Name, sc.Value)
	}
	return nil
}
