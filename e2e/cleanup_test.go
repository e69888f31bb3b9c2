package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// vmRun runs a command in the VM and fails the test if it fails.
func (e env) vmRun(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := e.VM.RunOK(context.Background(), argv...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// foreignState is what other tools put in the kernel; cleanup must leave it.
var foreignSetup = [][]string{
	// Another tool's sets, one of them named like ours but for the dash.
	{"ipset", "create", "FOREIGN-SET", "hash:ip"},
	{"ipset", "add", "FOREIGN-SET", "192.0.2.7"},
	{"ipset", "create", "IPVSPX-LOOKALIKE", "hash:ip"},
	// Another tool's chain and its jump, in both families' filter tables.
	{"iptables", "-N", "FOREIGN-CHAIN"},
	{"iptables", "-A", "FOREIGN-CHAIN", "-s", "192.0.2.7/32", "-j", "ACCEPT"},
	{"iptables", "-A", "INPUT", "-j", "FOREIGN-CHAIN"},
	{"ip6tables", "-N", "FOREIGN-CHAIN"},
	{"ip6tables", "-A", "FORWARD", "-j", "FOREIGN-CHAIN"},
	// Another tool's virtual servers: on an address of nobody, and on the
	// node's address outside the node-port range.
	{"ipvsadm", "-A", "-t", "192.0.2.50:80"},
	{"ipvsadm", "-A", "-t", nodeAddr + ":8081"},
	// kube-proxy's IPVS-mode leftovers, and kubelet's chain.
	{"ip", "link", "add", "kube-ipvs0", "type", "dummy"},
	{"ip", "addr", "add", "10.96.200.1/32", "dev", "kube-ipvs0"},
	{"ipvsadm", "-A", "-t", "10.96.200.1:443"},
	{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
	{"iptables", "-t", "nat", "-N", "KUBE-SERVICES"},
	{"iptables", "-t", "nat", "-A", "KUBE-SERVICES", "-m", "set", "--match-set", "KUBE-CLUSTER-IP", "dst,dst", "-j", "ACCEPT"},
	{"iptables", "-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"iptables", "-N", "KUBE-FIREWALL"},
	{"iptables", "-A", "KUBE-FIREWALL", "-m", "mark", "--mark", "0x8000/0x8000", "-j", "DROP"},
	{"iptables", "-A", "OUTPUT", "-j", "KUBE-FIREWALL"},
}

var foreignTeardown = [][]string{
	{"iptables", "-D", "INPUT", "-j", "FOREIGN-CHAIN"},
	{"iptables", "-F", "FOREIGN-CHAIN"},
	{"iptables", "-X", "FOREIGN-CHAIN"},
	{"ip6tables", "-D", "FORWARD", "-j", "FOREIGN-CHAIN"},
	{"ip6tables", "-X", "FOREIGN-CHAIN"},
	{"iptables", "-D", "OUTPUT", "-j", "KUBE-FIREWALL"},
	{"iptables", "-F", "KUBE-FIREWALL"},
	{"iptables", "-X", "KUBE-FIREWALL"},
	{"ipset", "destroy", "FOREIGN-SET"},
	{"ipset", "destroy", "IPVSPX-LOOKALIKE"},
	{"ipvsadm", "-D", "-t", "192.0.2.50:80"},
	{"ipvsadm", "-D", "-t", nodeAddr + ":8081"},
	// kube-proxy's, if the test failed before removing them
	{"iptables", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"iptables", "-t", "nat", "-F", "KUBE-SERVICES"},
	{"iptables", "-t", "nat", "-X", "KUBE-SERVICES"},
	{"ipset", "destroy", "KUBE-CLUSTER-IP"},
	{"ipvsadm", "-D", "-t", "10.96.200.1:443"},
	{"ip", "link", "del", "kube-ipvs0"},
}

// expectForeignIntact checks that other tools' objects are all there.
func (e env) expectForeignIntact(t *testing.T, when string) {
	t.Helper()
	if out := e.ipsetList(t, "FOREIGN-SET"); !strings.Contains(out, "\n192.0.2.7\n") {
		t.Errorf("%s: FOREIGN-SET lost its entry:\n%s", when, out)
	}
	e.ipsetList(t, "IPVSPX-LOOKALIKE")
	save := e.iptablesSave(t, "iptables-save")
	for _, l := range []string{"-A FOREIGN-CHAIN -s 192.0.2.7/32 -j ACCEPT", "-A INPUT -j FOREIGN-CHAIN",
		"-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP", "-A OUTPUT -j KUBE-FIREWALL"} {
		if !strings.Contains(save, l+"\n") {
			t.Errorf("%s: iptables lost %q:\n%s", when, l, save)
		}
	}
	if save6 := e.iptablesSave(t, "ip6tables-save"); !strings.Contains(save6, "-A FORWARD -j FOREIGN-CHAIN\n") {
		t.Errorf("%s: ip6tables lost the foreign jump:\n%s", when, save6)
	}
	table := e.ipvsadm(t)
	for _, vs := range []string{"192.0.2.50:80", nodeAddr + ":8081"} {
		if !strings.Contains(table, "TCP  "+vs) {
			t.Errorf("%s: the foreign virtual server %s is gone:\n%s", when, vs, table)
		}
	}
}

// expectKubeProxyLeftovers checks kube-proxy's objects: present or gone.
func (e env) expectKubeProxyLeftovers(t *testing.T, when string, present bool) {
	t.Helper()
	checks := map[string]bool{
		"kube-ipvs0 link": e.vmOK("ip", "link", "show", "kube-ipvs0"),
		"KUBE-CLUSTER-IP": e.vmOK("ipset", "list", "-n", "KUBE-CLUSTER-IP"),
		"KUBE-SERVICES":   strings.Contains(e.iptablesSave(t, "iptables-save"), ":KUBE-SERVICES "),
		"10.96.200.1:443": strings.Contains(e.ipvsadm(t), "10.96.200.1:443"),
	}
	for what, ok := range checks {
		if ok != present {
			t.Errorf("%s: kube-proxy's %s present=%v, want %v", when, what, ok, present)
		}
	}
}

// vmOK reports whether a command succeeds in the VM.
func (e env) vmOK(argv ...string) bool {
	_, err := e.VM.RunOK(context.Background(), argv...)
	return err == nil
}

// TestCleanup: other tools' sets, chains and virtual servers present before
// the agent starts survive its syncs and `ipvs-proxy cleanup`; cleanup
// removes ipvs-proxy's virtual servers, VIPs, interface, sets and chains,
// is fine run twice, and with --kube-proxy also removes kube-proxy's
// leftovers, not kubelet's. The shared agent is restarted afterwards.
func TestCleanup(t *testing.T) {
	e := setup(t)
	e.logGlueState(t)
	_, svc, bes := e.httpService(t, "clean", 1)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", addr, names(bes))

	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	restart := func() {
		t.Helper()
		if restarted {
			return
		}
		restarted = true
		if err := e.StartAgent(context.Background()); err != nil {
			t.Fatalf("restart the agent: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, argv := range foreignTeardown {
			_, _ = e.VM.RunOK(context.Background(), argv...)
		}
		restart()
	})
	for _, argv := range foreignSetup {
		e.vmRun(t, argv...)
	}

	// The agent starts on a node with other tools' state and syncs.
	if err := e.StartAgent(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.expectBackends(t, "tcp", addr, names(bes))
	e.expectForeignIntact(t, "after the agent's sync")
	e.expectKubeProxyLeftovers(t, "after the agent's sync", true)
	if err := e.StopAgent(); err != nil {
		t.Fatal(err)
	}

	// run marked its interface as its own: the mark cleanup goes by.
	if alias := e.vmRun(t, "cat", "/sys/class/net/"+proxyIface+"/ifalias"); strings.TrimSpace(alias) != "ipvs-proxy" {
		t.Errorf("%s has alias %q, want ipvs-proxy", proxyIface, alias)
	}
	// A dummy another tool made is not cleanup's, even when named.
	e.vmRun(t, "ip", "link", "add", "foreign0", "type", "dummy")
	t.Cleanup(func() { _, _ = e.VM.RunOK(context.Background(), "ip", "link", "del", "foreign0") })
	e.vmRun(t, "ip", "addr", "add", "192.0.2.50/32", "dev", "foreign0")
	r, err := e.VM.Run(context.Background(), bed.GuestBinary, "cleanup", "--interface", "foreign0")
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !strings.Contains(r.Stdout, "interface foreign0: left alone with its virtual servers: a dummy without ipvs-proxy's mark") {
		t.Errorf("cleanup --interface foreign0: exit %d, want non-zero, saying it left foreign0 alone:\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	if !e.vmOK("ip", "link", "show", "foreign0") {
		t.Errorf("cleanup --interface foreign0 deleted another tool's dummy:\n%s", r.Stdout)
	}
	e.expectForeignIntact(t, "after cleanup --interface foreign0") // 192.0.2.50:80 is on foreign0's address

	out := e.vmRun(t, bed.GuestBinary, "cleanup")
	t.Logf("ipvs-proxy cleanup:\n%s", out)
	expectNothingOurs := func(when string) {
		t.Helper()
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			if rules := ownRules(e.iptablesSave(t, tool)); len(rules) > 0 {
				t.Errorf("%s: %s still has:\n%s", when, tool, strings.Join(rules, "\n"))
			}
		}
		if sets := e.vmRun(t, "ipset", "list", "-n"); strings.Contains(sets, "IPVSP-") {
			t.Errorf("%s: sets left:\n%s", when, sets)
		}
		if e.vmOK("ip", "link", "show", proxyIface) {
			t.Errorf("%s: %s still exists", when, proxyIface)
		}
		if table := e.ipvsadm(t); strings.Contains(table, svc.Spec.ClusterIP) {
			t.Errorf("%s: the Service's virtual server is still there:\n%s", when, table)
		}
	}
	expectNothingOurs("after cleanup")
	e.expectForeignIntact(t, "after cleanup")
	e.expectKubeProxyLeftovers(t, "after cleanup", true)
	e.expectNoAnswer(t, "tcp", addr)

	out = e.vmRun(t, bed.GuestBinary, "cleanup")
	t.Logf("ipvs-proxy cleanup, again:\n%s", out)
	for _, want := range []string{"iptables: nothing to remove", "ipsets: nothing to remove",
		"ipvs: deleted 0 virtual servers", fmt.Sprintf("interface %s: not present", proxyIface)} {
		if !strings.Contains(out, want) {
			t.Errorf("second cleanup: no %q in:\n%s", want, out)
		}
	}

	out = e.vmRun(t, bed.GuestBinary, "cleanup", "--kube-proxy")
	t.Logf("ipvs-proxy cleanup --kube-proxy:\n%s", out)
	e.expectKubeProxyLeftovers(t, "after cleanup --kube-proxy", false)
	e.expectForeignIntact(t, "after cleanup --kube-proxy")
	expectNothingOurs("after cleanup --kube-proxy")

	// Back to work: the agent rebuilds everything.
	restart()
	e.expectBackends(t, "tcp", addr, names(bes))
}

// TestOneAgentPerNode: while the bed's agent runs, a second agent on the
// node, even with no metrics or health address to collide on, exits at
// once with an error naming the running one; `ipvs-proxy cleanup` refuses
// and removes nothing; the running agent keeps serving.
func TestOneAgentPerNode(t *testing.T) {
	e := setup(t)
	_, svc, bes := e.httpService(t, "oneagent", 1)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.expectBackends(t, "tcp", addr, names(bes))
	ctx := context.Background()
	pid := strings.Fields(e.vmRun(t, "pidof", "ipvs-proxy"))[0]
	holds := "process " + pid + " holds the lock @ipvs-proxy-agent"

	second := append([]string{bed.GuestBinary, "run", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName}, agentArgs...)
	second = append(second, "--metrics-bind-address=", "--healthz-bind-address=")
	r, err := e.VM.Exec(ctx, vm.Command{Argv: second, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case r.TimedOut:
		t.Errorf("a second agent, no addresses bound, still ran after a minute:\n%s", tailLines(r.Stderr, 20))
	case r.ExitCode == 0 || !strings.Contains(r.Stderr, holds):
		t.Errorf("second agent: exit %d, want non-zero with %q:\n%s", r.ExitCode, holds, tailLines(r.Stderr, 20))
	default:
		t.Logf("second agent refused: %s", strings.TrimSpace(lastLine(r.Stderr)))
	}

	r, err = e.VM.Run(ctx, bed.GuestBinary, "cleanup")
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "cleanup refused, nothing removed: "+holds) || r.Stdout != "" {
		t.Errorf("cleanup while the agent runs: exit %d, want non-zero, nothing done, naming process %s:\n%s%s", r.ExitCode, pid, r.Stdout, r.Stderr)
	}
	if !e.vmOK("ip", "link", "show", proxyIface) {
		t.Errorf("%s is gone after the refused cleanup", proxyIface)
	}
	e.expectBackends(t, "tcp", addr, names(bes))
	if now := strings.Fields(e.vmRun(t, "pidof", "ipvs-proxy")); len(now) != 1 || now[0] != pid {
		t.Errorf("ipvs-proxy processes %v, want the bed's agent %s alone", now, pid)
	}
}
