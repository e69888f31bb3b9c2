package sysctls

import (
	"os"
	"path/filepath"
)

// HostProcSys is where deploy/daemonset.yaml mounts the node's
// /proc/sys/net: container runtimes mount /proc/sys read-only in an
// unprivileged container, and Kubernetes refuses net.* sysctls for pods on
// the host network, so that mount is how an unprivileged ipvs-proxy sets
// ip_forward and net.ipv4.vs.* (only net.* settings are written). The
// files act on the network namespace of the process that opens them: the
// node's, since the pod shares it.
const HostProcSys = "/host/proc/sys"

// Root is the /proc/sys to read and write kernel settings under:
// HostProcSys when the node's /proc/sys/net is mounted there, else
// /proc/sys.
func Root() string {
	return sysctlRootIn(HostProcSys)
}

func sysctlRootIn(host string) string {
	if st, err := os.Stat(filepath.Join(host, "net")); err == nil && st.IsDir() {
		return host
	}
	return "/proc/sys"
}
