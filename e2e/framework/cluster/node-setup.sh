#!/bin/sh
# Makes the bed's VM a Kubernetes node (run once, by the agent, after boot).
# Arguments: the cluster's pod CIDR; on several nodes also the segment's
# interface, its MAC and the node's address on it (ADDR/LEN); on a
# dual-stack cluster also the node's IPv6 address on it (ADDR/LEN).
set -e
CLUSTER_CIDR=$1 SEG_IFACE=$2 SEG_MAC=$3 SEG_ADDR=$4 SEG_ADDR6=$5

# cgroup v2, with every controller the kubelet manages delegated below the
# root (kubelet --cgroup-driver=cgroupfs makes /kubepods.slice... itself).
mkdir -p /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control
done
# The node's own processes in cgroups of their own at the default weight,
# as systemd's services on a production node: containerd and the kubelet
# each in its unit (the cluster starts them through joinUnit), and
# everything else the VM runs (init, the bed's agent and all it starts:
# the tests' traffic clients and load) in bed.service. Left in the root,
# each of the bed's processes weighed as much as all of kubepods (issue
# 45: 66 processes at 100 each against kubepods' 79, so pods, the agent
# among them, starved whenever the bed loaded a node); in one cgroup with
# the kubelet, that load starved the kubelet's probes instead.
# The CPU controller below system.slice too: without it the units' weights
# mean nothing and their threads compete one by one again.
mkdir -p /sys/fs/cgroup/system.slice
echo +cpu >/sys/fs/cgroup/system.slice/cgroup.subtree_control
for unit in bed containerd kubelet; do
	mkdir -p /sys/fs/cgroup/system.slice/$unit.service
done
# Kernel threads cannot move and stay in the root. Twice: a process forked
# by one not yet moved during the first pass is caught by the second.
for pass in 1 2; do
	for p in $(cat /sys/fs/cgroup/cgroup.procs); do
		echo "$p" >/sys/fs/cgroup/system.slice/bed.service/cgroup.procs 2>/dev/null || true
	done
done

# The runtime's and the kubelet's state on tmpfs: statfs of the initramfs
# root tells the kubelet nothing useful about free space.
mkdir -p /var/lib /var/log
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /var/log
mkdir -p /var/lib/kubelet /var/lib/containerd /var/log/pods /run/containerd /etc/cni/net.d

# Pods on a bridge: bridged traffic must pass netfilter (IPVS and the
# masquerade rules), and the node forwards between pods and Services.
modprobe bridge
modprobe br_netfilter
sysctl -w net.ipv4.ip_forward=1 >/dev/null
sysctl -w net.bridge.bridge-nf-call-iptables=1 >/dev/null
sysctl -w net.bridge.bridge-nf-call-ip6tables=1 >/dev/null
if [ -n "$SEG_ADDR6" ]; then
	# IPv6 forwarding, and no duplicate address detection on what is
	# made from now on (the segment's address, cni0, pods' veths): an
	# address is usable at once, not seconds later.
	sysctl -w net.ipv6.conf.all.forwarding=1 >/dev/null
	sysctl -w net.ipv6.conf.default.accept_dad=0 >/dev/null
	sysctl -w net.ipv6.conf."$SEG_IFACE".accept_dad=0 >/dev/null
fi

[ -s /etc/machine-id ] || cat /proc/sys/kernel/random/uuid | tr -d - >/etc/machine-id

# Pods reach the apiserver (10.0.2.100, a forward of QEMU's user network
# on eth0) masqueraded: the forward answers the node's own address only.
# Nothing else pods send is masqueraded here: between nodes, pods see
# each other's own addresses (the CNI bridge's ipMasq is off).
iptables -t nat -A POSTROUTING -s "$CLUSTER_CIDR" -o eth0 -j MASQUERADE

# The nodes' segment: eth1 (checked by its MAC) with the node's address.
if [ -n "$SEG_ADDR" ]; then
	mac=$(cat /sys/class/net/"$SEG_IFACE"/address)
	if [ "$mac" != "$SEG_MAC" ]; then
		echo "node setup: $SEG_IFACE has MAC $mac, want $SEG_MAC" >&2
		exit 1
	fi
	ip link set "$SEG_IFACE" up
	ip addr add "$SEG_ADDR" dev "$SEG_IFACE"
	if [ -n "$SEG_ADDR6" ]; then
		ip addr add "$SEG_ADDR6" dev "$SEG_IFACE"
	fi
fi
