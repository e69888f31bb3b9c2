#!/bin/sh
# /init of the ipvs-proxy test VM: busybox sh as PID 1 (it reaps orphans).
# Packed into every boot's initramfs by Start, so editing it needs no
# rebuild of the cached assets. Failures go to /run/vm-init.errors, which
# the agent's ping reports to the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
ERR=/run/vm-init.errors
: >$ERR
fail() { echo "vm-init: $*"; echo "$*" >>$ERR; }
uptime() { cut -d' ' -f1 /proc/uptime; }
echo "vm-init: start, uptime $(uptime)s"

# let the kernel load modules by itself (ip_vs_<scheduler>, ...)
echo /sbin/modprobe >/proc/sys/kernel/modprobe
# one modprobe for all (much faster than one each); on failure, one each to
# tell which
if ! modprobe -a $(cat /etc/vm/modules) 2>/dev/null; then
	for m in $(cat /etc/vm/modules); do
		out=$(modprobe "$m" 2>&1) || fail "modprobe $m: $out"
	done
fi
echo "vm-init: modules loaded, uptime $(uptime)s"

# the host name: vm.hostname= on the kernel command line (a cluster names
# each node's VM after its Node: upstream tests compare a host-network
# pod's hostname with its node's name), else ipvs-proxy-vm
name=ipvs-proxy-vm
for arg in $(cat /proc/cmdline); do
	case "$arg" in vm.hostname=?*) name=${arg#vm.hostname=} ;; esac
done
hostname "$name" || fail "hostname $name"
ip link set lo up || fail "lo up"
# QEMU user networking, restrict=on. No default route on purpose: only the
# host's forwards (agent, apiserver at 10.0.2.100) are reachable.
ip link set eth0 up || fail "eth0 up"
ip addr add 10.0.2.15/24 dev eth0 || fail "eth0 address"
echo "vm-init: starting vmagent, uptime $(uptime)s"
/usr/bin/vmagent agent </dev/null
echo "vm-init: vmagent exited with status $?, powering off"
sync
poweroff -f
