package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/bed"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// preflightJSON is the part of `ipvs-proxy preflight --output json` the
// tests read.
type preflightJSON struct {
	Kernel string `json:"kernel"`
	OK     bool   `json:"ok"`
	Checks []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Detail string `json:"detail"`
		Remedy string `json:"remedy"`
	} `json:"checks"`
}

func (p preflightJSON) status(name string) (status, detail string) {
	for _, c := range p.Checks {
		if c.Name == name {
			return c.Status, c.Detail
		}
	}
	return "", ""
}

// statusJSON is the part of `ipvs-proxy status --output json` the tests
// read.
type statusJSON struct {
	API struct {
		Available bool   `json:"available"`
		Error     string `json:"error"`
	} `json:"api"`
	DriftKnown     bool `json:"driftKnown"`
	VirtualServers []struct {
		Service     string `json:"service"`
		Kind        string `json:"kind"`
		Address     string `json:"address"`
		Protocol    string `json:"protocol"`
		Port        int    `json:"port"`
		Scheduler   string `json:"scheduler"`
		InKernel    bool   `json:"inKernel"`
		RealServers []struct {
			Address       string `json:"address"`
			Port          int    `json:"port"`
			Weight        int    `json:"weight"`
			ActiveConns   int    `json:"activeConns"`
			InactiveConns int    `json:"inactiveConns"`
			InKernel      bool   `json:"inKernel"`
			Drift         string `json:"drift"`
		} `json:"realServers"`
		Drift []string `json:"drift"`
	} `json:"virtualServers"`
	Drift []struct {
		Kind          string `json:"kind"`
		VirtualServer string `json:"virtualServer"`
		Service       string `json:"service"`
		Detail        string `json:"detail"`
	} `json:"drift"`
}

// noCrash fails the test when output shows a Go panic or stack trace.
func noCrash(t *testing.T, what, out string) {
	t.Helper()
	for _, bad := range []string{"goroutine ", "panic"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s printed %q (a crash or stack trace):\n%s", what, bad, out)
		}
	}
}

// versionedConfig heads an IPVSProxyConfiguration, the config file's form.
const versionedConfig = "apiVersion: config.ipvs-proxy.io/v1alpha1\nkind: IPVSProxyConfiguration\n"

// TestPreflightInVM: against the VM's Debian kernel, preflight passes:
// exit 0, every check OK or WARN, every scheduler's module OK with
// --all-schedulers; a Service's scheduler annotation adds its scheduler;
// --config sets options and a bad config file is a clear error.
func TestPreflightInVM(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	base := []string{bed.GuestBinary, "preflight", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName}

	res, err := e.VM.Run(ctx, append(base, "--all-schedulers")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ipvs-proxy preflight --all-schedulers in the VM (exit %d):\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	noCrash(t, "preflight", res.Stdout+res.Stderr)
	if res.ExitCode != 0 {
		t.Fatalf("preflight failed in the VM (exit %d)", res.ExitCode)
	}

	res, err = e.VM.Run(ctx, append(base, "--all-schedulers", "--output", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("preflight --output json: exit %d:\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	var rep preflightJSON
	if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil {
		t.Fatalf("preflight --output json is not JSON: %v\n%s", err, res.Stdout)
	}
	if !rep.OK {
		t.Errorf("ok is false")
	}
	for _, c := range rep.Checks {
		if c.Status == "FAIL" {
			t.Errorf("check %s failed: %s (remedy: %s)", c.Name, c.Detail, c.Remedy)
		}
	}
	for _, s := range scheduler.Names() {
		if st, detail := rep.status("scheduler " + s); st != "OK" {
			t.Errorf("scheduler %s: %q %s, want OK", s, st, detail)
		}
	}
	for _, name := range []string{"IPVS core", "nf_conntrack", "dummy interface", "ipset hash:ip,port,net", "ipset bitmap:port",
		"iptables backend", "sysctl net.ipv4.vs.conntrack", "capability CAP_NET_ADMIN"} {
		if st, detail := rep.status(name); st != "OK" {
			t.Errorf("%s: %q %s, want OK", name, st, detail)
		}
	}

	// A module that is loadable but not loaded passes with a note;
	// --load-modules loads it with modprobe. No test uses ovf.
	if _, err := e.VM.RunOK(ctx, "rmmod", "ip_vs_ovf"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.VM.RunOK(context.Background(), "modprobe", "ip_vs_ovf") })
	for _, load := range []bool{false, true} {
		argv := append(slices.Clone(base), "--all-schedulers", "--output", "json")
		want := "ip_vs_ovf not loaded; loadable ("
		if load {
			argv = append(argv, "--load-modules")
			want = "ip_vs_ovf loaded (loaded now by modprobe)"
		}
		out, err := e.VM.RunOK(ctx, argv...)
		if err != nil {
			t.Fatal(err)
		}
		rep := preflightJSON{}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if st, detail := rep.status("scheduler ovf"); st != "OK" || !strings.Contains(detail, want) {
			t.Errorf("--load-modules=%v: scheduler ovf %q %q; want OK and %q", load, st, detail, want)
		}
	}
	if mods, err := e.VM.RunOK(ctx, "cat", "/proc/modules"); err != nil || !strings.Contains(mods, "ip_vs_ovf ") {
		t.Errorf("ip_vs_ovf is not loaded after --load-modules (%v)", err)
	}

	// Without --all-schedulers: the default and the annotated ones.
	ns := e.namespace(t)
	e.createService(t, ns, "hashed", []corev1.ServicePort{tcpPort("http", 80)}, func(s *corev1.Service) {
		s.Annotations = map[string]string{scheduler.AnnotationScheduler: "sh"}
	})
	out, err := e.VM.RunOK(ctx, append(base, "--output", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	rep = preflightJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if st, detail := rep.status("scheduler sh"); st != "OK" || !strings.Contains(detail, ns+"/hashed") {
		t.Errorf("scheduler sh: %q %q, want OK naming %s/hashed", st, detail, ns)
	}
	if st, _ := rep.status("scheduler rr"); st != "OK" {
		t.Errorf("scheduler rr (the default): %q, want OK", st)
	}
	if st, _ := rep.status("scheduler mh"); st != "" {
		t.Errorf("scheduler mh was checked without --all-schedulers or a Service naming it")
	}

	// A config file sets the options; a flag on the command line wins.
	const cfgFile = "/etc/ipvs-proxy/test-config.yaml"
	if err := e.VM.WriteFile(ctx, cfgFile, []byte(versionedConfig+"ipvs: {scheduler: wlc, strictARP: true}\niptables: {backend: auto}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = e.VM.RunOK(ctx, bed.GuestBinary, "preflight", "--config", cfgFile, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	rep = preflightJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if st, _ := rep.status("scheduler wlc"); st != "OK" {
		t.Errorf("scheduler wlc from the config file: %q, want OK", st)
	}
	if st, _ := rep.status("sysctl net.ipv4.conf.all.arp_ignore"); st == "" {
		t.Errorf("strictARP: true in the config file did not add the ARP sysctls")
	}
	out, err = e.VM.RunOK(ctx, bed.GuestBinary, "preflight", "--config", cfgFile, "--scheduler", "lc", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"scheduler lc"`) || strings.Contains(out, `"scheduler wlc"`) {
		t.Errorf("--scheduler lc did not override the file's scheduler:\n%s", out)
	}

	const badFile = "/etc/ipvs-proxy/bad-config.yaml"
	if err := e.VM.WriteFile(ctx, badFile, []byte(versionedConfig+"ipvs: {schedular: wlc, syncPeriod: soon}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = e.VM.Run(ctx, bed.GuestBinary, "preflight", "--config", badFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a bad config file (exit %d): %s", res.ExitCode, res.Stderr)
	noCrash(t, "preflight --config bad", res.Stdout+res.Stderr)
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, badFile) || !strings.Contains(res.Stderr, `unknown field "ipvs.schedular"`) ||
		!strings.Contains(res.Stderr, "ipvs.syncPeriod") {
		t.Errorf("a bad config file: exit %d, stderr %q; want a failure naming the file, ipvs.schedular and ipvs.syncPeriod", res.ExitCode, res.Stderr)
	}
}

// TestPreflightFailsOnHost: this machine's kernel has no IPVS; preflight
// run here fails with a message naming IPVS, a non-zero exit status and no
// stack trace, in both output formats.
func TestPreflightFailsOnHost(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("this machine's kernel has IPVS; the failing case needs one without")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "ipvs-proxy")
	if err := vm.BuildGoBinary(ctx, "github.com/ipvs-proxy/ipvs-proxy/cmd/ipvs-proxy", bin); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		var o, e strings.Builder
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.ExitCode()
		default:
			t.Fatalf("run %v: %v", args, err)
		}
		return o.String(), e.String(), code
	}

	stdout, stderr, code := run("preflight")
	t.Logf("ipvs-proxy preflight on this machine (exit %d):\n%s%s", code, stdout, stderr)
	noCrash(t, "preflight", stdout+stderr)
	if code == 0 {
		t.Errorf("preflight passed on a kernel without IPVS")
	}
	if !strings.Contains(stderr, "IPVS") {
		t.Errorf("the error does not name IPVS: %q", stderr)
	}
	if !regexp.MustCompile(`IPVS core +FAIL +the kernel has no IPVS`).MatchString(stdout) || !strings.Contains(stdout, "remedy:") {
		t.Errorf("the table does not show IPVS failing with a remedy:\n%s", stdout)
	}

	stdout, stderr, code = run("preflight", "--output", "json")
	noCrash(t, "preflight --output json", stdout+stderr)
	if code == 0 {
		t.Errorf("preflight --output json passed on a kernel without IPVS")
	}
	var rep preflightJSON
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("preflight --output json is not JSON: %v\n%s", err, stdout)
	}
	if st, detail := rep.status("IPVS core"); rep.OK || st != "FAIL" || !strings.Contains(detail, "IPVS") {
		t.Errorf("JSON: ok %v, IPVS core %q %q; want ok false and a FAIL naming IPVS", rep.OK, st, detail)
	}

	// status needs the kernel's IPVS too: a clear error, no crash.
	stdout, stderr, code = run("status", "--kubeconfig", "/nonexistent")
	noCrash(t, "status", stdout+stderr)
	if code == 0 || !strings.Contains(stderr, "IPVS") {
		t.Errorf("status on a kernel without IPVS: exit %d, stderr %q; want a failure naming IPVS", code, stderr)
	}
}

// TestStatusShowsServicesAndDrift: status joins the kernel with the
// Services: a test Service by name with its real servers and no drift;
// a real server deleted by hand (agent stopped, so it is not repaired) is
// reported as drift; without API access the kernel's view is still shown.
func TestStatusShowsServicesAndDrift(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	ns, svc, bes := e.httpService(t, "web", 2)
	ip := svc.Spec.ClusterIP
	vip := hostPort(ip, 80)
	// (Not `ipvsadm -Ln -t VIP`: it fails until the virtual server exists.)
	e.expectTable(t, []string{"TCP  " + vip + " rr", "-> " + hostPort(bes[0].Addr, backendPort), "-> " + hostPort(bes[1].Addr, backendPort)}, nil)

	// The same options as the agent, so that status wants what it wants.
	args := append([]string{bed.GuestBinary, "status", "--kubeconfig", guestKubecfg, "--hostname-override", nodeName}, agentArgs...)
	status := func(extra ...string) statusJSON {
		t.Helper()
		out, err := e.VM.RunOK(ctx, append(append(slices.Clone(args), "--output", "json"), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		var st statusJSON
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --output json is not JSON: %v\n%s", err, out)
		}
		return st
	}
	name := ns + "/web:http"
	// ours checks our virtual server and returns its drift and the drift
	// entries about it.
	ours := func(st statusJSON, wantInKernel map[string]bool) (vsDrift []string, drift []string, err error) {
		found := false
		for _, vs := range st.VirtualServers {
			if vs.Address != ip || vs.Port != 80 || vs.Protocol != "TCP" {
				continue
			}
			found = true
			if vs.Service != name || vs.Kind != "ClusterIP" || vs.Scheduler != "rr" || !vs.InKernel {
				return nil, nil, fmt.Errorf("virtual server %s: service %q kind %q scheduler %q inKernel %v; want %s ClusterIP rr in the kernel",
					vip, vs.Service, vs.Kind, vs.Scheduler, vs.InKernel, name)
			}
			got := map[string]bool{}
			for _, rs := range vs.RealServers {
				if rs.Port != backendPort || rs.Weight != 1 {
					return nil, nil, fmt.Errorf("real server %s:%d weight %d", rs.Address, rs.Port, rs.Weight)
				}
				got[rs.Address] = rs.InKernel
			}
			if fmt.Sprint(got) != fmt.Sprint(wantInKernel) {
				return nil, nil, fmt.Errorf("real servers (address: in kernel) %v, want %v", got, wantInKernel)
			}
			vsDrift = vs.Drift
		}
		if !found {
			return nil, nil, fmt.Errorf("status does not show %s", vip)
		}
		for _, d := range st.Drift {
			if d.VirtualServer == vip+"/TCP" || d.Service == name {
				drift = append(drift, d.Kind+": "+d.Detail)
			}
		}
		return vsDrift, drift, nil
	}

	both := map[string]bool{bes[0].Addr: true, bes[1].Addr: true}
	eventually(t, 30*time.Second, func() error {
		st := status()
		if !st.API.Available || !st.DriftKnown {
			return fmt.Errorf("API not available: %s", st.API.Error)
		}
		vsDrift, drift, err := ours(st, both)
		if err == nil && (len(vsDrift) > 0 || len(drift) > 0) {
			err = fmt.Errorf("drift %v %v, want none", vsDrift, drift)
		}
		if err == nil && len(st.Drift) > 0 {
			t.Logf("drift elsewhere (other tests' Services): %+v", st.Drift)
		}
		return err
	})
	// Connections show in the counters (closed ones as inactive).
	e.expectBackends(t, "tcp", vip, names(bes))
	conns := 0
	for _, vs := range status().VirtualServers {
		if vs.Address == ip && vs.Port == 80 {
			for _, rs := range vs.RealServers {
				conns += rs.ActiveConns + rs.InactiveConns
			}
		}
	}
	if conns == 0 {
		t.Errorf("no active or inactive connections counted after connecting to %s", vip)
	}
	table, err := e.VM.RunOK(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ipvs-proxy status:\n%s", table)
	if !regexp.MustCompile(regexp.QuoteMeta(name) + ` +ClusterIP +` + regexp.QuoteMeta(vip) + `/TCP +rr +`).MatchString(table) {
		t.Errorf("the table does not show %s on %s", name, vip)
	}

	// Drift: stop the agent so that it does not repair, delete a real
	// server by hand.
	if err := e.StopAgent(); err != nil {
		t.Fatalf("stop the agent: %v", err)
	}
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		if err := e.StartAgent(context.Background()); err != nil {
			t.Errorf("restart the agent: %v", err)
		}
	}
	t.Cleanup(restart)
	gone := hostPort(bes[0].Addr, backendPort)
	if _, err := e.VM.RunOK(ctx, "ipvsadm", "-d", "-t", vip, "-r", gone); err != nil {
		t.Fatal(err)
	}
	st := status()
	vsDrift, drift, err := ours(st, map[string]bool{bes[0].Addr: false, bes[1].Addr: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(vsDrift, "missing-real-server") || len(drift) != 1 || !strings.Contains(drift[0], gone) {
		t.Errorf("after ipvsadm -d: drift %v %v; want one missing-real-server naming %s", vsDrift, drift, gone)
	}
	table, err = e.VM.RunOK(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ipvs-proxy status with a real server deleted by hand:\n%s", table)
	if !strings.Contains(table, "missing-real-server "+vip+"/TCP ("+name+")") {
		t.Errorf("the table does not report the missing real server")
	}

	// Without API access: the kernel's view, no names, drift unknown.
	st = status("--kubeconfig", "/nonexistent")
	if st.API.Available || st.DriftKnown || st.API.Error == "" {
		t.Errorf("with a missing kubeconfig: api %+v driftKnown %v; want unavailable with the reason", st.API, st.DriftKnown)
	}
	found := false
	for _, vs := range st.VirtualServers {
		if vs.Address == ip && vs.Port == 80 {
			found = true
			if vs.Service != "" || len(vs.RealServers) != 1 || vs.RealServers[0].Address != bes[1].Addr {
				t.Errorf("without API access: %+v; want no name and the one real server left", vs)
			}
		}
	}
	if !found {
		t.Errorf("without API access, status does not show %s", vip)
	}

	// The agent repairs the drift; status agrees.
	restart()
	e.expectTable(t, []string{"-> " + gone}, nil)
	eventually(t, 30*time.Second, func() error {
		vsDrift, drift, err := ours(status(), both)
		if err == nil && (len(vsDrift) > 0 || len(drift) > 0) {
			err = fmt.Errorf("drift %v %v after the agent's repair, want none", vsDrift, drift)
		}
		return err
	})
}
