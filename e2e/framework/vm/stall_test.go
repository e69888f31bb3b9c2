package vm

import "testing"

func TestKernelStall(t *testing.T) {
	for _, tc := range []struct {
		name, console, want string
	}{
		{"clean boot", "[    0.000000] Linux version 6.1.0\n[    2.1] virtio_net virtio0 eth0: renamed\n", ""},
		{"soft lockup", "[    3.0] ok\n[  121.206554] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [kubelet:200]\n[  141.3] more\n",
			"[  121.206554] watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [kubelet:200]"},
		{"rcu self-detected", "[  116.427723] rcu: INFO: rcu_preempt self-detected stall on CPU\n[  121.2] watchdog: BUG: soft lockup - CPU#0 stuck for 26s!\n",
			"[  116.427723] rcu: INFO: rcu_preempt self-detected stall on CPU"},
		{"rcu detected", "[   80.1] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n", "[   80.1] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:"},
		{"hung task is not a stall", "[  300.0] INFO: task kworker/0:1:12 blocked for more than 120 seconds.\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KernelStall(tc.console); got != tc.want {
				t.Errorf("KernelStall() = %q, want %q", got, tc.want)
			}
		})
	}
}
