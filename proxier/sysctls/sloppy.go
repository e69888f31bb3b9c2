package sysctls

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// SloppyTCP is the setting of --sloppy-tcp (directServerReturn.sloppyTCP):
// IPVS schedules a TCP flow on any packet but a reset, not only on its
// SYN (tcp_conn_schedule), so a flow that a router moves to another node
// mid-flow gets a connection there, to the same endpoint where the
// scheduler is a hash of the client (mh, sh) and every node's table is the
// same. It is per network namespace and applies to every virtual server
// of the node.
var SloppyTCP = Setting{"net/ipv4/vs/sloppy_tcp", "1"}

// Writer reads and writes kernel settings (netlinkutil.Sysctls under
// Root()).
type Writer interface {
	Get(name string) (string, error)
	// Ensure writes value unless the setting has it, and returns the old
	// value.
	Ensure(name, value string) (old string, err error)
}

// NodeWriter is the Writer of the node's settings, where run writes them.
func NodeWriter() Writer { return netlinkutil.Sysctls{Root: Root()} }

// EnsureSloppyTCP sets SloppyTCP when on and logs it. Off, the setting is
// left as it is (someone else may have set it); found on, it is logged as
// a warning, since every virtual server of the node then pays its cost.
func EnsureSloppyTCP(log *zap.Logger, w Writer, on bool) error {
	if !on {
		if v, err := w.Get(SloppyTCP.Name); err == nil && v != "0" {
			log.Warn("net.ipv4.vs.sloppy_tcp is set on this node though --sloppy-tcp is off (set by someone else, or by an earlier run with it): left as it is",
				zap.String("name", SloppyTCP.Name), zap.String("value", v))
		}
		return nil
	}
	old, err := w.Ensure(SloppyTCP.Name, SloppyTCP.Value)
	if err != nil {
		return fmt.Errorf("--sloppy-tcp: %w", err)
	}
	log.Info("set sysctl for --sloppy-tcp: IPVS schedules TCP flows on any packet, not only SYNs",
		zap.String("name", SloppyTCP.Name), zap.String("value", SloppyTCP.Value), zap.String("was", old))
	return nil
}
