package netlinkutil

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// ConnReuseModeSysctl is the IPVS setting that decides what a new
// connection from a client port still in IPVS's connection table does.
const ConnReuseModeSysctl = "net/ipv4/vs/conn_reuse_mode"

// Kernel releases that bound the conn_reuse_mode rule (kube-proxy's).
var (
	// connReuseMin is the first kernel with the setting.
	connReuseMin = version.MustParseGeneric("4.1")
	// connReuseFixed is the first kernel whose default (1) no longer
	// stalls a reused port for a second (kubernetes/kubernetes#93297).
	connReuseFixed = version.MustParseGeneric("5.9")
)

// ConnReuseMode decides conn_reuse_mode for a kernel release, as
// /proc/sys/kernel/osrelease shows it ("6.1.0-18-amd64"). set is false
// before 4.1, where the setting does not exist. From 5.9 value is the
// kernel's default "1" (the one-second stall that made kube-proxy choose
// 0 is gone, and a new connection from a reused port is scheduled afresh;
// with 0, kernels before the late-2021 fix "ipvs: Fix reuse connection if
// RS weight is 0" sent it to the old real server even at weight 0,
// draining): kube-proxy leaves it alone there, ipvs-proxy restores it, so
// that a 0 an older ipvs-proxy forced on every kernel does not outlive the
// upgrade. Between the two, value is "0": the stall of 1 costs more than
// the rare reuse that reaches a draining real server.
func ConnReuseMode(release string) (value string, set bool, err error) {
	v, err := version.ParseGeneric(strings.TrimSpace(release))
	if err != nil {
		return "", false, fmt.Errorf("kernel release %q: %w", release, err)
	}
	switch {
	case v.LessThan(connReuseMin):
		return "", false, nil
	case v.AtLeast(connReuseFixed):
		return "1", true, nil
	}
	return "0", true, nil
}
