package cluster

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// runtimeLayer is the node's runtime: Debian 12's containerd, crun and CNI
// plugins, unpacked into an extra initramfs layer that only the cluster's
// VM boots with. The packages after crun are the libraries crun and
// libsystemd0 link (the layer takes each ELF file's libraries from the
// unpacked packages).
//
// The OCI runtime is crun, not runc: containerd's shim runs the runtime
// two or three times per container and once per exec, and runc is a Go
// binary that also re-executes itself to set up the container (runc init);
// under the bed's software emulation each of those starts costs seconds.
// crun is a small C program with the same command line.
var runtimeLayer = vm.LayerSpec{
	Name: "cluster-runtime",
	Packages: []string{"containerd", "crun", "containernetworking-plugins", "libc6", "libseccomp2", "libcap2",
		"libyajl2", "libsystemd0", "liblzma5", "libzstd1", "liblz4-1", "libgcrypt20", "libgpg-error0"},
	Files: []string{"usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr", guestOCIRuntime,
		"usr/lib/cni/bridge", "usr/lib/cni/host-local", "usr/lib/cni/loopback", "usr/lib/cni/portmap"},
}

// guestOCIRuntime is the OCI runtime's path, in the layer and in the guest.
const guestOCIRuntime = "usr/bin/crun"

// Guest paths of the node's files.
const (
	guestKubelet        = "/usr/local/bin/kubelet"
	guestKubeletConfig  = "/etc/kubernetes/kubelet.yaml"
	guestKubeconfig     = "/etc/kubernetes/kubelet.conf"
	guestContainerdConf = "/etc/containerd/config.toml"
	guestCNIConf        = "/etc/cni/net.d/10-bed.conflist"
	guestSetup          = "/etc/kubernetes/node-setup.sh"
	guestImages         = "/var/cache/images" // image archives, imported at boot
	containerdSock      = "/run/containerd/containerd.sock"
)

// nodeSetup prepares the VM to be a node: cgroup v2, the kernel modules and
// sysctls pods and Services need, tmpfs for the runtime's and kubelet's
// state. See the script for why each step is there.
//
//go:embed node-setup.sh
var nodeSetup []byte

// joinUnit is argv run in the node setup's cgroup for unit
// (system.slice/<unit>.service): the shell moves itself there and execs
// argv, so the process is the one started, in its own cgroup from its
// first instruction, as systemd would run a service.
func joinUnit(unit string, argv ...string) []string {
	return append([]string{"sh", "-c",
		`echo $$ >/sys/fs/cgroup/system.slice/` + unit + `.service/cgroup.procs && exec "$@"`, unit}, argv...)
}

// containerdConfig is containerd 1.6's configuration for the node.
//
// The OCI runtime cannot pivot_root out of the initramfs (the root file
// system is rootfs, which cannot be unmounted or moved), so it runs with
// NoPivotRoot (--no-pivot: it moves the container's root over / and
// chroots). containerd's runc shim drives crun as it would runc
// (BinaryName); the runtime stays named "runc" in the CRI configuration,
// as the shim's type is.
// Containers' root file systems are overlays (the overlayfs snapshotter,
// the overlay module loaded first): the native snapshotter copied the
// whole image for every container, 50 MiB for the e2e suite's agnhost,
// and a run of the suite filled the guest's RAM-backed root file system
// ("copy file range failed: no space").
func containerdConfig(pauseImage string) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.native"]

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/%s"
        NoPivotRoot = true
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
`, containerdSock, pauseImage, guestOCIRuntime)
}

// cniConfig gives pods an address of each of podCIDRs (one per family) on
// the bridge cni0, with the node as their gateway. ipMasq is off: pods
// keep their own addresses towards other nodes' pods (the node setup
// masquerades only what goes to the apiserver's forward on eth0).
func cniConfig(podCIDRs ...string) string {
	var ranges, routes []string
	for _, p := range podCIDRs {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet": %q}]`, p))
		if strings.Contains(p, ":") {
			routes = append(routes, `{"dst": "::/0"}`)
		} else {
			routes = append(routes, `{"dst": "0.0.0.0/0"}`)
		}
	}
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "bed",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [%s],
        "routes": [%s]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, strings.Join(ranges, ", "), strings.Join(routes, ", "))
}

// kubeletConfig is the kubelet's KubeletConfiguration. The apiserver
// reaches the kubelet only through the egress proxy, so anonymous requests
// are allowed; pods' nameserver is the kube-dns Service; eviction on disk thresholds is off (the node's disks are
// tmpfs); cgroups are managed through cgroupfs (there is no systemd).
func kubeletConfig() string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://` + containerdSock + `
failSwapOn: false
clusterDomain: ` + ClusterDomain + `
clusterDNS:
- ` + DNSServiceIP + `
resolvConf: ""
hairpinMode: hairpin-veth
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard:
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
`
}
