// Package preflight is `ipvs-proxy preflight`: it checks that the node has
// what ipvs-proxy needs (IPVS and its schedulers, conntrack, the ipset and
// dummy interface types, an iptables backend, the sysctls, capabilities),
// and says how to fix what is missing.
package preflight

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/kmod"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/probe"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/kube"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// Statuses of a preflight check. WARN passes; FAIL is a missing requirement.
const (
	statusOK   = "OK"
	statusWarn = "WARN"
	statusFail = "FAIL"
)

// Check is one line of the preflight report.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	// Remedy is one line that says how to fix a FAIL or WARN.
	Remedy string `json:"remedy,omitempty"`
}

// Report is what `ipvs-proxy preflight` prints.
type Report struct {
	Kernel string  `json:"kernel"`
	OK     bool    `json:"ok"`
	Failed int     `json:"failed"`
	Warned int     `json:"warned"`
	Checks []Check `json:"checks"`
}

// Err is the error of a report with a failed check: the requirements
// missing (nil when none is).
func (r Report) Err() error {
	if r.OK {
		return nil
	}
	var names []string
	for _, c := range r.Checks {
		if c.Status == statusFail {
			names = append(names, c.Name)
		}
	}
	return fmt.Errorf("preflight failed: %d requirement(s) missing: %s", len(names), strings.Join(names, ", "))
}

// moduleChecker tells the state of kernel modules and loads them
// (kmod.Checker).
type moduleChecker interface {
	Check(module string) kmod.Info
	Load(ctx context.Context, module string) error
	// Refresh forgets what was read (a probe may have loaded a module).
	Refresh()
}

// System is the node as preflight sees it. Each part is a probe
// that tests replace with a fake.
type System struct {
	kernel  string
	modules moduleChecker
	// ipvs looks up the IPVS generic netlink family.
	ipvs func() error
	// dummy creates and deletes a dummy interface; ipset an ipset of a type.
	dummy func() error
	ipset func(typ string) error
	// iptables runs the iptables tools, as the glue does.
	iptables glue.Runner
	// sysctl reads a parameter ("net/ipv4/ip_forward") under sysctlRoot;
	// sysctlWritable tells whether it could be written.
	sysctlRoot     string
	sysctl         func(name string) (string, error)
	sysctlWritable func(name string) error
	// capEff returns the effective capability set.
	capEff func() (uint64, error)
	// schedulersInUse maps the schedulers that Services' annotations name
	// to those Services; agent.ErrNoAPI when there is no configuration.
	schedulersInUse func(ctx context.Context) (map[string][]string, int, error)
}

// Config is what the checks depend on.
type Config struct {
	Scheduler       string
	IPv4, IPv6      bool
	StrictARP       bool
	IPTablesBackend string
	AllSchedulers   bool
	LoadModules     bool
	// DirectServerReturn (--direct-server-return): the node ends tunnels,
	// so what that needs is checked (and, with LoadModules, loaded); off,
	// ipip is not loaded (it would add a tunl0 to every network namespace).
	DirectServerReturn bool
	// SloppyTCP (--sloppy-tcp): run sets net.ipv4.vs.sloppy_tcp, so it is
	// checked as run's other settings are.
	SloppyTCP bool
	// ConfigWarning lists the settings of the config file that run
	// ignores, or says that its form is deprecated; nil if neither.
	ConfigWarning *config.Warning
}

// Linux capability numbers (linux/capability.h).
const (
	capNetAdmin  = 12
	capSysModule = 16
)

// NewSystem returns the probes of the real node; newClient gives the
// client that reads the Services (agent.ErrNoAPI without a configuration).
func NewSystem(newClient func() (kube.Client, error), log *zap.Logger) (*System, error) {
	mods, err := kmod.NewChecker()
	if err != nil {
		return nil, err
	}
	rel, _ := kmod.Release()
	root := sysctls.Root() // where run reads and writes them
	return &System{
		kernel:  rel,
		modules: mods,
		ipvs:    probe.IPVS,
		dummy: func() error {
			where, err := probe.Dummy()
			log.Debug("probed the dummy interface type", zap.String("in", string(where)), zap.Error(err))
			return err
		},
		ipset: func(typ string) error {
			where, err := probe.IPSet(typ)
			log.Debug("probed an ipset type", zap.String("type", typ), zap.String("in", string(where)), zap.Error(err))
			return err
		},
		iptables:   glue.Exec{},
		sysctlRoot: root,
		sysctl: func(name string) (string, error) {
			b, err := os.ReadFile(filepath.Join(root, name))
			return strings.TrimSpace(string(b)), err
		},
		sysctlWritable: func(name string) error { return unix.Access(filepath.Join(root, name), unix.W_OK) },
		capEff:         readCapEff,
		schedulersInUse: func(ctx context.Context) (map[string][]string, int, error) {
			return schedulersInUse(ctx, newClient)
		},
	}, nil
}

// readCapEff reads the effective capabilities of this process.
func readCapEff() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("read capabilities: CapEff %q: %w", v, err)
			}
			return caps, nil
		}
	}
	return 0, fmt.Errorf("read capabilities: no CapEff in /proc/self/status")
}

// schedulersInUse lists the Services and returns the schedulers their
// annotations name, with the Services naming each, and the number of
// Services read.
func schedulersInUse(ctx context.Context, newClient func() (kube.Client, error)) (map[string][]string, int, error) {
	client, err := newClient()
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	services, err := agent.ListServices(ctx, client)
	if err != nil {
		return nil, 0, err
	}
	out := map[string][]string{}
	n := 0
	for i := range services {
		svc := &services[i]
		if model.Skip(model.ServiceOf(svc)) {
			continue
		}
		n++
		name, ok := svc.Annotations[scheduler.AnnotationScheduler]
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || scheduler.Validate(name) != nil {
			continue // unknown names fall back to --scheduler
		}
		out[name] = append(out[name], svc.Namespace+"/"+svc.Name)
	}
	return out, n, nil
}

// Run runs every check. It never fails: a probe that cannot run
// is a failed check.
func Run(ctx context.Context, sys *System, pc Config, log *zap.Logger) Report {
	p := &preflight{ctx: ctx, sys: sys, cfg: pc, log: log}
	p.runSteps()
	rep := Report{Kernel: sys.kernel, Checks: p.checks}
	for _, c := range p.checks {
		switch c.Status {
		case statusFail:
			rep.Failed++
		case statusWarn:
			rep.Warned++
		}
	}
	rep.OK = rep.Failed == 0
	return rep
}

// step is one part of the checks, named in the log line of their times.
type step struct {
	name string
	run  func()
}

// runSteps runs every check, and logs each step's time in one line: on a
// loaded node the init container can run for minutes (issue 45: more
// than 11 at 5,000 Services), and its log says where they went.
func (p *preflight) runSteps() {
	steps := []step{
		{"config", p.configFile}, {"ipv6", p.ipv6}, {"capabilities", p.capabilities}, {"ipvs", p.ipvsCore},
		{"schedulers", p.schedulers},
		{"conntrack", func() {
			p.module("nf_conntrack", "nf_conntrack", "connection tracking", "needed by IPVS's conntrack and the iptables rules", true)
		}},
		{"ipsets", p.ipsets}, {"dummy", p.dummyType}, {"iptables", p.iptables}, {"sysctls", p.sysctls},
	}
	if p.cfg.DirectServerReturn {
		steps = append(steps, step{"tunnels", p.tunnelEnds})
	}
	fields := make([]zap.Field, 0, len(steps)+1)
	began := time.Now()
	for _, st := range steps {
		start := time.Now()
		st.run()
		fields = append(fields, zap.Duration(st.name, time.Since(start)))
	}
	p.log.Info("preflight checks ran", append(fields, zap.Duration("took", time.Since(began)))...)
}

type preflight struct {
	ctx    context.Context
	sys    *System
	cfg    Config
	log    *zap.Logger
	checks []Check
	// noIPv6: IPv6 is wanted (--ip-families) but the node's kernel has
	// none; run then serves IPv4 alone.
	noIPv6 bool
}

func (p *preflight) add(name, status, detail, remedy string) {
	if status == statusOK {
		remedy = ""
	}
	p.checks = append(p.checks, Check{Name: name, Status: status, Detail: detail, Remedy: remedy})
}

// configFile warns of the settings of the config file that run ignores,
// or of its deprecated form.
func (p *preflight) configFile() {
	if w := p.cfg.ConfigWarning; w != nil {
		p.add("config file", statusWarn, w.String(), w.Remedy())
	}
}

// safely runs a probe, turning a panic into an error.
func safely(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("probe failed: %v", r)
		}
	}()
	return fn()
}

func (p *preflight) capabilities() {
	caps, err := p.sys.capEff()
	if err != nil {
		p.add("capability CAP_NET_ADMIN", statusFail, err.Error(), "run ipvs-proxy where /proc/self/status is readable")
		return
	}
	has := func(c uint) bool { return caps&(1<<c) != 0 }
	if has(capNetAdmin) {
		p.add("capability CAP_NET_ADMIN", statusOK, "present (IPVS, addresses, ipsets, iptables)", "")
	} else {
		p.add("capability CAP_NET_ADMIN", statusFail, "missing: ipvs-proxy cannot program IPVS, addresses or iptables",
			"run as root, or add NET_ADMIN to the container's securityContext.capabilities")
	}
	if !p.cfg.LoadModules {
		return
	}
	if has(capSysModule) {
		p.add("capability CAP_SYS_MODULE", statusOK, "present (--load-modules)", "")
	} else {
		p.add("capability CAP_SYS_MODULE", statusFail, "missing: --load-modules cannot load kernel modules",
			"add SYS_MODULE to the container's capabilities, or load the modules on the node and drop --load-modules")
	}
}

// moduleState checks a module and, with --load-modules, loads it when it
// is not present. note says what happened.
func (p *preflight) moduleState(module string) (info kmod.Info, note string) {
	info = p.sys.modules.Check(module)
	if info.State.Present() || !p.cfg.LoadModules || info.State == kmod.Missing {
		return info, ""
	}
	err := safely(func() error { return p.sys.modules.Load(p.ctx, module) })
	if err != nil {
		p.log.Warn("could not load a kernel module", zap.String("module", module), zap.Error(err))
		return info, "; " + err.Error()
	}
	p.log.Info("loaded a kernel module", zap.String("module", module))
	after := p.sys.modules.Check(module)
	if after.State.Present() {
		return after, " (loaded now by modprobe)"
	}
	return after, ""
}

// moduleRemedy says how to get a module that is not there.
func moduleRemedy(info kmod.Info, what string) string {
	switch info.State {
	case kmod.Loadable:
		return "modprobe " + info.Name + " (or rerun with --load-modules)"
	case kmod.Unknown:
		return "mount /lib/modules read-only from the host, or modprobe " + info.Name + " on the node"
	}
	return "use a kernel built with " + what + " (module " + info.Name + ")"
}

// probed checks a feature by trying it, with its module's state as a note.
func (p *preflight) probed(name, module, what, tried string, try func() error) {
	info, note := p.moduleState(module)
	err := safely(try)
	if err != nil {
		p.add(name, statusFail, err.Error()+"; "+info.Detail+note, moduleRemedy(info, what))
		return
	}
	if !info.State.Present() {
		// Trying it may have made the kernel load the module; if not, the
		// module is built in without a trace in /sys/module.
		p.sys.modules.Refresh()
		if info = p.sys.modules.Check(module); !info.State.Present() {
			info.Detail = info.Name + " is in the kernel"
		}
	}
	p.add(name, statusOK, tried+"; "+info.Detail+note, "")
}

func (p *preflight) ipvsCore() {
	p.probed("IPVS core", "ip_vs", "IPVS", "generic netlink family IPVS found", func() error {
		if err := p.sys.ipvs(); err != nil {
			return fmt.Errorf("the kernel has no IPVS: %w", err)
		}
		return nil
	})
}

func (p *preflight) schedulers() {
	users := map[string][]string{}
	users[p.cfg.Scheduler] = []string{"--scheduler"}
	if p.cfg.AllSchedulers {
		for _, s := range scheduler.Names() {
			if _, ok := users[s]; !ok {
				users[s] = []string{"--all-schedulers"}
			}
		}
	} else {
		inUse, n, err := p.sys.schedulersInUse(p.ctx)
		switch {
		case errors.Is(err, agent.ErrNoAPI):
			p.add("schedulers in use", statusOK, "no Kubernetes configuration: only --scheduler is checked", "")
		case err != nil:
			p.add("schedulers in use", statusWarn, "cannot read Services' scheduler annotations: "+err.Error()+"; only --scheduler is checked",
				"check --kubeconfig and the API server, or use --all-schedulers")
		default:
			var named []string
			for s, svcs := range inUse {
				users[s] = append(users[s], svcs...)
				named = append(named, s)
			}
			slices.Sort(named)
			detail := fmt.Sprintf("%d Services read; annotation %s names no scheduler", n, scheduler.AnnotationScheduler)
			if len(named) > 0 {
				detail = fmt.Sprintf("%d Services read; annotations name %s", n, strings.Join(named, ", "))
			}
			p.add("schedulers in use", statusOK, detail, "")
		}
	}
	names := make([]string, 0, len(users))
	for s := range users {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, s := range names {
		by := users[s]
		if len(by) > 3 {
			by = append(by[:3:3], fmt.Sprintf("%d more", len(users[s])-3))
		}
		module, _ := scheduler.Module(s)
		name, what, usedBy := "scheduler "+s, "the IPVS scheduler "+s, "used by "+strings.Join(by, ", ")
		// Named by annotations only: run gives those Services --scheduler
		// instead, with an Event, so a missing module must not keep the
		// agent off the node (preflight is the DaemonSet's init container).
		required := slices.Contains(users[s], "--scheduler") || slices.Contains(users[s], "--all-schedulers")
		if !required {
			usedBy += "; without it run gives them --scheduler, with an Event"
		}
		p.module(name, module, what, usedBy, required)
	}
}

// module checks a module with no functional probe: loaded or built in is
// OK; loadable is OK with a note (the kernel loads it on first use);
// unknown is a warning; missing fails when required, else warns. what
// names the feature, usedBy says what needs it.
func (p *preflight) module(name, module, what, usedBy string, required bool) {
	info, note := p.moduleState(module)
	detail := info.Detail + note + "; " + usedBy
	switch info.State {
	case kmod.Loaded, kmod.Builtin:
		p.add(name, statusOK, detail, "")
	case kmod.Loadable:
		if p.cfg.LoadModules { // modprobe failed
			p.add(name, statusWarn, detail, "modprobe "+info.Name+" on the node")
			return
		}
		p.add(name, statusOK, detail+"; the kernel loads it on first use", "")
	case kmod.Unknown:
		p.add(name, statusWarn, detail, moduleRemedy(info, what))
	default: // missing: a failure unless run can do without it
		status := statusWarn
		if required {
			status = statusFail
		}
		p.add(name, status, detail, moduleRemedy(info, what))
	}
}

func (p *preflight) ipsets() {
	for _, typ := range probe.IPSetTypes() {
		p.probed("ipset "+typ, probe.IPSetModule(typ), "the ipset type "+typ, "created and destroyed a trial set",
			func() error { return p.sys.ipset(typ) })
	}
}

func (p *preflight) dummyType() {
	p.probed("dummy interface", "dummy", "dummy interfaces", "created and deleted a trial dummy interface", p.sys.dummy)
}

// iptablesBackend is what one iptables backend holds.
type iptablesBackend struct {
	backend glue.Backend
	err     error // not installed, or its save failed
	rules   int
	hint    bool // kubelet's KUBE-IPTABLES-HINT chain is there
}

func (b iptablesBackend) String() string {
	if b.err != nil {
		return "iptables-" + string(b.backend) + ": " + b.err.Error()
	}
	s := fmt.Sprintf("iptables-%s: %d rules", b.backend, b.rules)
	if b.hint {
		s += " and kubelet's KUBE-IPTABLES-HINT"
	}
	return s
}

// kubeletHint is the chain kubelet creates in the mangle table of the
// backend it uses, for other components to follow.
const kubeletHint = "KUBE-IPTABLES-HINT"

// readBackend reads one backend's IPv4 tables with the glue's tools.
func (p *preflight) readBackend(b glue.Backend) iptablesBackend {
	out := iptablesBackend{backend: b}
	t, err := glue.NewIPTables(p.sys.iptables, b, ipset.IPv4)
	if err != nil {
		out.err = err
		return out
	}
	saved, err := t.Save(p.ctx)
	if err != nil {
		out.err = err
		return out
	}
	out.rules = saved.RuleCount()
	if m := saved["mangle"]; m != nil && slices.Contains(m.Chains, kubeletHint) {
		out.hint = true
	}
	return out
}

// iptables checks the backend run would use, chosen as the glue chooses
// it (glue.DetectBackend), and that it works.
func (p *preflight) iptables() {
	const name = "iptables backend"
	const install = "install iptables (iptables-nft or iptables-legacy tools, iptables 1.8 or later)"
	backends := map[glue.Backend]iptablesBackend{}
	for _, b := range []glue.Backend{glue.NFT, glue.Legacy} {
		backends[b] = p.readBackend(b)
	}
	facts := backends[glue.NFT].String() + "; " + backends[glue.Legacy].String()
	chosen, reason, err := glue.DetectBackend(p.sys.iptables, p.cfg.IPTablesBackend)
	if err != nil {
		p.add(name, statusFail, "no usable iptables: "+facts, install)
		return
	}
	use := backends[chosen]
	if use.err != nil {
		p.add(name, statusFail, "run would use "+string(chosen)+" ("+reason+"), which does not work: "+facts,
			install+", or choose another --iptables-backend")
		return
	}
	if p.cfg.IPv6 && !p.noIPv6 {
		t, err := glue.NewIPTables(p.sys.iptables, chosen, ipset.IPv6)
		if err == nil {
			_, err = t.Save(p.ctx)
		}
		if err != nil {
			p.add(name, statusFail, "run would use "+string(chosen)+" ("+reason+"), but its IPv6 tools do not work: "+err.Error(),
				"install ip6tables, or drop IPv6 from --ip-families")
			return
		}
	}
	for other, b := range backends {
		if other != chosen && b.hint && !use.hint {
			p.add(name, statusWarn, "run would use "+string(chosen)+" ("+reason+"), but kubelet uses "+string(other)+": "+facts,
				"use --iptables-backend "+string(other))
			return
		}
	}
	p.add(name, statusOK, "run uses "+string(chosen)+" ("+reason+"); "+facts, "")
}

// ipv6 tells what run does with IPv6 on this node: nothing without the
// kernel's IPv6 (a warning: IPv6 Services get an Event), and IPv6
// forwarding set only once an IPv6 Service is served.
func (p *preflight) ipv6() {
	if !p.cfg.IPv6 {
		return
	}
	const name = "IPv6"
	fwd := strings.ReplaceAll(sysctls.IPv6Forwarding.Name, "/", ".")
	val, err := p.sys.sysctl(sysctls.IPv6Forwarding.Name)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !p.cfg.IPv4:
		p.noIPv6 = true
		p.add(name, statusFail, "the node's kernel has no IPv6 (booted with ipv6.disable=1?), and --ip-families is IPv6 alone: run cannot start",
			"add IPv4 to --ip-families on such nodes, or enable IPv6")
	case errors.Is(err, fs.ErrNotExist):
		p.noIPv6 = true
		p.add(name, statusWarn, "the node's kernel has no IPv6 (booted with ipv6.disable=1?): run serves IPv4 only here, and each Service with IPv6 addresses gets an Event",
			"drop IPv6 from --ip-families on such nodes, or enable IPv6")
	case err != nil:
		p.add(name, statusFail, "cannot read "+fwd+": "+err.Error(), "run as root with /proc/sys readable")
	case val == sysctls.IPv6Forwarding.Value:
		p.add(name, statusOK, fwd+" = "+val+" already", "")
	default:
		detail := fmt.Sprintf("%s = %s: run sets %s once the node serves an IPv6 Service, and never on an IPv4-only cluster", fwd, val, sysctls.IPv6Forwarding.Value)
		if err := p.sys.sysctlWritable(sysctls.IPv6Forwarding.Name); err != nil {
			p.add(name, statusWarn, detail+"; not writable: "+err.Error(), sysctlRemedy+" so that run can set it for IPv6 Services")
			return
		}
		p.add(name, statusOK, detail+"; writable", "")
	}
}

// sysctlRemedy says how to make the sysctls writable in a container.
const sysctlRemedy = "mount the node's /proc/sys/net writable at " + sysctls.HostProcSys + "/net (as deploy/daemonset.yaml does)"

// preflightSysctl is one kernel setting run needs.
type preflightSysctl struct{ name, value, why string }

func (p *preflight) wantedSysctls() []preflightSysctl {
	var out []preflightSysctl
	want := sysctls.IPVS
	// conn_reuse_mode as run decides it (the release from uname, as run
	// reads it); an unknown release: no check.
	if w, err := sysctls.ForKernel(p.sys.kernel); err == nil {
		want = w
	}
	for _, s := range want {
		out = append(out, preflightSysctl{s.Name, s.Value, "run"})
	}
	if p.cfg.StrictARP {
		for _, s := range sysctls.StrictARP {
			out = append(out, preflightSysctl{s.Name, s.Value, "--strict-arp"})
		}
	}
	if p.cfg.SloppyTCP {
		out = append(out, preflightSysctl{sysctls.SloppyTCP.Name, sysctls.SloppyTCP.Value, "--sloppy-tcp"})
	}
	return out
}

func (p *preflight) sysctls() {
	for _, s := range p.wantedSysctls() {
		name := "sysctl " + strings.ReplaceAll(s.name, "/", ".")
		val, err := p.sys.sysctl(s.name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			remedy := "use a kernel that has it"
			if strings.HasPrefix(s.name, "net/ipv4/vs/") {
				remedy = "load IPVS (modprobe ip_vs): the net.ipv4.vs settings come with it"
			}
			p.add(name, statusFail, "does not exist", remedy)
			continue
		case err != nil:
			p.add(name, statusFail, "cannot read it: "+err.Error(), "run as root with /proc/sys readable")
			continue
		}
		detail := fmt.Sprintf("= %s, %s sets %s", val, s.why, s.value)
		if val == s.value {
			detail = fmt.Sprintf("= %s, as %s sets it", val, s.why)
		}
		if err := p.sys.sysctlWritable(s.name); err != nil {
			if val == s.value {
				p.add(name, statusWarn, detail+"; not writable: "+err.Error(), sysctlRemedy+" so that run can keep it set")
			} else {
				p.add(name, statusFail, detail+"; not writable: "+err.Error(), sysctlRemedy+", or set it on the node")
			}
			continue
		}
		where := ""
		if p.sys.sysctlRoot != "" && p.sys.sysctlRoot != "/proc/sys" {
			where = " (under " + p.sys.sysctlRoot + ")"
		}
		p.add(name, statusOK, detail+"; writable"+where, "")
	}
}

// tunnelEnds reports what ending tunnels needs on this node (Services with
// ipvs-proxy.io/forwarding tunnel or gue; proxier/tunnelend), as warnings
// only: a tenant's annotation never keeps the agent off a node. Where it
// is missing, those Services fail on the node with an Event.
func (p *preflight) tunnelEnds() {
	const usedBy = "needed to end the tunnels of Services with ipvs-proxy.io/forwarding "
	info, note := p.moduleState("ipip")
	switch info.State {
	case kmod.Loaded, kmod.Builtin:
		p.add("tunnel ends: ipip", statusOK, info.Detail+note+"; "+usedBy+"tunnel or gue (its tunl0 decapsulates)", "")
	default: // run has no CAP_SYS_MODULE, and tunl0 comes only with the module
		p.add("tunnel ends: ipip", statusWarn, info.Detail+note+"; "+usedBy+"tunnel or gue (its tunl0 decapsulates): not loaded, such Services fail here",
			"run ipvs-proxy preflight --load-modules (the DaemonSet's init container does), or modprobe ipip on the node")
	}
	p.module("tunnel ends: fou", "fou", "GUE decapsulation", usedBy+"gue", false)
	p.module("tunnel ends: xt_TCPMSS", "xt_TCPMSS", "the TCPMSS target", usedBy+"tunnel or gue (the pods' SYN-ACK MSS clamp)", false)
	p.tunnelRPFilter()
}

// tunnelRPFilter reports the reverse path filter that tunnel ends meet: the
// effective value on tunl0 is the larger of all's and tunl0's, and run
// sets only tunl0's.
func (p *preflight) tunnelRPFilter() {
	const all, dev = "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/tunl0/rp_filter"
	for _, name := range []string{all, dev} {
		check := "tunnel ends: sysctl " + strings.ReplaceAll(name, "/", ".")
		v, err := p.sys.sysctl(name)
		switch {
		case name == dev && errors.Is(err, fs.ErrNotExist):
			p.add(check, statusOK, "no tunl0 yet (it comes with the ipip module); run sets it to 0 when it ends a tunnel", "")
		case err != nil:
			p.add(check, statusWarn, "cannot read it: "+err.Error(), "run as root with /proc/sys readable")
		case name == all && v != "0":
			p.add(check, statusWarn, "= "+v+": Services with ipvs-proxy.io/forwarding tunnel or gue are refused on this node (an Event each): "+
				"decapsulated packets come from clients tunl0 has no route to, and fail the reverse path check",
				"set net.ipv4.conf.all.rp_filter=0 on the node if it may end tunnels (run never lowers it)")
		case name == all:
			p.add(check, statusOK, "= 0, as tunnel ends need it", "")
		default:
			p.add(check, statusOK, "= "+v+"; run sets it to 0 when it ends a tunnel", "")
		}
	}
}

// Write prints the report as a table or JSON.
func Write(w io.Writer, rep Report, output string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
		return nil
	}
	nameW, statusW := len("CHECK"), len("STATUS")
	for _, c := range rep.Checks {
		nameW = max(nameW, len(c.Name))
		statusW = max(statusW, len(c.Status))
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%-*s  %-*s  %s\n", nameW, "CHECK", statusW, "STATUS", "DETAIL")
	for _, c := range rep.Checks {
		fmt.Fprintf(bw, "%-*s  %-*s  %s\n", nameW, c.Name, statusW, c.Status, c.Detail)
		if c.Remedy != "" {
			fmt.Fprintf(bw, "%-*s  %-*s  remedy: %s\n", nameW, "", statusW, "", c.Remedy)
		}
	}
	verdict := "ready for ipvs-proxy"
	if !rep.OK {
		verdict = "NOT ready for ipvs-proxy"
	}
	fmt.Fprintf(bw, "\nkernel %s: %d checks, %d failed, %d warnings: %s\n", rep.Kernel, len(rep.Checks), rep.Failed, rep.Warned, verdict)
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	return nil
}
