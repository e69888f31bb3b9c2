#!/bin/sh
# Makes the bed's VM a Kubernetes node (run once, by the agent, after boot).
set -e

# cgroup v2, with every controller the kubelet manages delegated below the
# root (kubelet --cgroup-driver=cgroupfs makes /kubepods.slice... itself).
mkdir -p /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control
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

[ -s /etc/machine-id ] || cat /proc/sys/kernel/random/uuid | tr -d - >/etc/machine-id
