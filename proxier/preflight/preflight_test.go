package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/kmod"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/agent"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/config"
	"github.com/ipvs-proxy/ipvs-proxy/proxier/sysctls"
	"github.com/ipvs-proxy/ipvs-proxy/scheduler"
)

// fakeModules is a node's modules: every module is loaded unless state
// says otherwise. Load turns a loadable module into a loaded one, unless
// loadErr is set.
type fakeModules struct {
	state   map[string]kmod.State
	loadErr error
	loads   []string
}

func (f *fakeModules) Check(m string) kmod.Info {
	st, ok := f.state[m]
	if !ok {
		st = kmod.Loaded
	}
	return kmod.Info{Name: m, State: st, Detail: m + " " + st.String()}
}

func (f *fakeModules) Load(_ context.Context, m string) error {
	f.loads = append(f.loads, m)
	if f.loadErr != nil {
		return f.loadErr
	}
	if f.state[m] == kmod.Loadable {
		f.state[m] = kmod.Loaded
	}
	return nil
}

func (f *fakeModules) Refresh() {}

// fakeNode builds a System whose every probe succeeds.
type fakeNode struct {
	mods     *fakeModules
	commands map[string]bool   // installed commands
	saves    map[string]string // iptables-save output by command
	saveErr  map[string]error
	sysctls  map[string]string // missing: does not exist
	readOnly bool
	caps     uint64
	inUse    func(context.Context) (map[string][]string, int, error)
	ipvsErr  error
	dummyErr error
	ipsetErr map[string]error
	panicky  bool // the dummy probe panics
	kernel   string
}

func newFakeNode() *fakeNode {
	n := &fakeNode{
		mods:     &fakeModules{state: map[string]kmod.State{}},
		commands: map[string]bool{},
		saves:    map[string]string{},
		saveErr:  map[string]error{},
		sysctls:  map[string]string{},
		caps:     1<<capNetAdmin | 1<<capSysModule,
		inUse:    func(context.Context) (map[string][]string, int, error) { return nil, 0, agent.ErrNoAPI },
		ipsetErr: map[string]error{},
	}
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, b := range []string{"nft", "legacy"} {
			n.commands[base+"-"+b+"-save"] = true
			n.commands[base+"-"+b+"-restore"] = true
		}
	}
	for _, s := range sysctls.IPVS {
		n.sysctls[s.Name] = s.Value
	}
	n.kernel = "5.4.0-150-generic" // before 5.9: run sets conn_reuse_mode=0
	n.sysctls["net/ipv4/vs/conn_reuse_mode"] = "0"
	n.sysctls["net/ipv6/conf/all/forwarding"] = "1"
	n.sysctls["net/ipv4/conf/all/arp_ignore"] = "0"
	n.sysctls["net/ipv4/conf/all/arp_announce"] = "0"
	n.sysctls["net/ipv4/conf/all/rp_filter"] = "0"
	return n
}

func (n *fakeNode) system() *System {
	return &System{
		kernel:  n.kernel,
		modules: n.mods,
		ipvs:    func() error { return n.ipvsErr },
		dummy: func() error {
			if n.panicky {
				panic("the dummy probe panicked")
			}
			return n.dummyErr
		},
		ipset:    func(typ string) error { return n.ipsetErr[typ] },
		iptables: fakeIPTables{n},
		sysctl: func(name string) (string, error) {
			v, ok := n.sysctls[name]
			if !ok {
				return "", &fs.PathError{Op: "open", Path: "/proc/sys/" + name, Err: fs.ErrNotExist}
			}
			return v, nil
		},
		sysctlWritable: func(string) error {
			if n.readOnly {
				return errors.New("read-only file system")
			}
			return nil
		},
		capEff:          func() (uint64, error) { return n.caps, nil },
		schedulersInUse: func(ctx context.Context) (map[string][]string, int, error) { return n.inUse(ctx) },
	}
}

// uninstall removes the tools of an iptables backend.
func (n *fakeNode) uninstall(backend string) {
	for c := range n.commands {
		if strings.Contains(c, "-"+backend+"-") {
			delete(n.commands, c)
		}
	}
}

// fakeIPTables runs the node's iptables tools (glue.Runner).
type fakeIPTables struct{ n *fakeNode }

func (f fakeIPTables) LookPath(name string) error {
	if f.n.commands[name] {
		return nil
	}
	return fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}

func (f fakeIPTables) Run(_ context.Context, name string, _ []string, _ []byte) ([]byte, error) {
	if !f.n.commands[name] {
		return nil, fmt.Errorf("%s: not found", name)
	}
	return []byte(f.n.saves[name]), f.n.saveErr[name]
}

// expect is what one check must show.
type expect struct {
	status string
	detail string // a substring; "" checks nothing
	remedy string // a substring
}

func TestPreflight(t *testing.T) {
	base := Config{Scheduler: "rr", IPv4: true, IPTablesBackend: "auto"}
	tests := []struct {
		name   string
		cfg    func(*Config)
		node   func(*fakeNode)
		ok     bool
		expect map[string]expect
		absent []string // checks that must not be there
	}{
		{
			name: "a node with everything",
			ok:   true,
			expect: map[string]expect{
				"capability CAP_NET_ADMIN":                     {status: statusOK},
				"IPVS core":                                    {statusOK, "generic netlink family IPVS found; ip_vs loaded", ""},
				"schedulers in use":                            {statusOK, "no Kubernetes configuration", ""},
				"scheduler rr":                                 {statusOK, "ip_vs_rr loaded; used by --scheduler", ""},
				"nf_conntrack":                                 {status: statusOK},
				"ipset hash:ip":                                {statusOK, "created and destroyed a trial set", ""},
				"ipset hash:ip,port,ip":                        {status: statusOK},
				"ipset bitmap:port":                            {status: statusOK},
				"dummy interface":                              {statusOK, "created and deleted a trial dummy interface", ""},
				"iptables backend":                             {statusOK, "iptables-nft: 0 rules; iptables-legacy: 0 rules", ""},
				"sysctl net.ipv4.ip_forward":                   {statusOK, "= 1, as run sets it; writable", ""},
				"sysctl net.ipv4.vs.conntrack":                 {status: statusOK},
				"sysctl net.ipv4.vs.conn_reuse_mode":           {statusOK, "= 0", ""},
				"sysctl net.ipv4.vs.expire_nodest_conn":        {status: statusOK},
				"sysctl net.ipv4.vs.expire_quiescent_template": {status: statusOK},
			},
			absent: []string{"capability CAP_SYS_MODULE", "sysctl net.ipv6.conf.all.forwarding", "scheduler wrr", "sysctl net.ipv4.conf.all.arp_ignore", "config file"},
		},
		{
			name: "settings of the config file that run ignores warn",
			ok:   true,
			cfg: func(c *Config) {
				c.ConfigWarning = &config.Warning{File: "/var/lib/kube-proxy/config.conf", Kind: "KubeProxyConfiguration",
					Ignored: []string{"conntrack.maxPerCore: 32768", "mode: iptables (ipvs-proxy programs IPVS whatever the mode)"}}
			},
			expect: map[string]expect{
				"config file": {statusWarn, "config file /var/lib/kube-proxy/config.conf (KubeProxyConfiguration): ipvs-proxy ignores 2 setting(s) it does not support: " +
					"conntrack.maxPerCore: 32768; mode: iptables (ipvs-proxy programs IPVS whatever the mode)", "ipvs-proxy has no equivalent of these settings"},
				"IPVS core": {status: statusOK},
			},
		},
		{
			name: "a deprecated config file warns, with the command that converts it",
			ok:   true,
			cfg: func(c *Config) {
				c.ConfigWarning = &config.Warning{File: "/etc/ipvs-proxy/config.yaml", Deprecated: "flat options are deprecated"}
			},
			expect: map[string]expect{
				"config file": {statusWarn, "config file /etc/ipvs-proxy/config.yaml: flat options are deprecated",
					"ipvs-proxy config convert --config /etc/ipvs-proxy/config.yaml"},
			},
		},
		{
			name: "from kernel 5.9 conn_reuse_mode is the kernel's 1",
			ok:   true,
			node: func(n *fakeNode) {
				n.kernel = "6.1.0-18-amd64"
				n.sysctls["net/ipv4/vs/conn_reuse_mode"] = "1"
			},
			expect: map[string]expect{"sysctl net.ipv4.vs.conn_reuse_mode": {statusOK, "= 1, as run sets it", ""}},
		},
		{
			name: "from kernel 5.9 a conn_reuse_mode forced to 0 is restored by run",
			ok:   true,
			node: func(n *fakeNode) {
				n.kernel = "6.1.0-18-amd64"
				n.sysctls["net/ipv4/vs/conn_reuse_mode"] = "0"
			},
			expect: map[string]expect{"sysctl net.ipv4.vs.conn_reuse_mode": {statusOK, "= 0, run sets 1", ""}},
		},
		{
			name: "no IPVS",
			node: func(n *fakeNode) {
				n.ipvsErr = errors.New("generic netlink family IPVS not found: no such file or directory")
				n.mods.state["ip_vs"] = kmod.Missing
				n.mods.state["ip_vs_rr"] = kmod.Missing
				for _, s := range sysctls.IPVS {
					if strings.HasPrefix(s.Name, "net/ipv4/vs/") {
						delete(n.sysctls, s.Name)
					}
				}
			},
			expect: map[string]expect{
				"IPVS core":                    {statusFail, "the kernel has no IPVS: generic netlink family IPVS not found", "use a kernel built with IPVS (module ip_vs)"},
				"scheduler rr":                 {statusFail, "ip_vs_rr missing", "use a kernel built with the IPVS scheduler rr (module ip_vs_rr)"},
				"sysctl net.ipv4.vs.conntrack": {statusFail, "does not exist", "load IPVS (modprobe ip_vs)"},
				"sysctl net.ipv4.ip_forward":   {status: statusOK},
			},
		},
		{
			name: "loadable modules pass with a note",
			ok:   true,
			node: func(n *fakeNode) {
				n.mods.state["ip_vs"] = kmod.Loadable
				n.mods.state["ip_vs_rr"] = kmod.Loadable
				n.mods.state["nf_conntrack"] = kmod.Builtin
			},
			expect: map[string]expect{
				"IPVS core":    {statusOK, "generic netlink family IPVS found; ip_vs is in the kernel", ""},
				"scheduler rr": {statusOK, "ip_vs_rr loadable; used by --scheduler; the kernel loads it on first use", ""},
				"nf_conntrack": {statusOK, "nf_conntrack built in", ""},
			},
		},
		{
			name: "a module whose loadability is unknown warns",
			ok:   true,
			node: func(n *fakeNode) { n.mods.state["ip_vs_rr"] = kmod.Unknown },
			expect: map[string]expect{
				"scheduler rr": {statusWarn, "ip_vs_rr unknown", "mount /lib/modules read-only from the host"},
			},
		},
		{
			name: "--load-modules loads what is missing",
			ok:   true,
			cfg:  func(c *Config) { c.LoadModules = true },
			node: func(n *fakeNode) {
				n.mods.state["ip_vs_rr"] = kmod.Loadable
				n.mods.state["dummy"] = kmod.Loadable
			},
			expect: map[string]expect{
				"capability CAP_SYS_MODULE": {status: statusOK},
				"scheduler rr":              {statusOK, "ip_vs_rr loaded (loaded now by modprobe)", ""},
				"dummy interface":           {statusOK, "dummy loaded (loaded now by modprobe)", ""},
			},
		},
		{
			name: "a node ready to end tunnels",
			ok:   true,
			cfg:  func(c *Config) { c.DirectServerReturn = true },
			expect: map[string]expect{
				"tunnel ends: ipip":                                 {statusOK, "ipip loaded; needed to end the tunnels", ""},
				"tunnel ends: fou":                                  {statusOK, "fou loaded", ""},
				"tunnel ends: xt_TCPMSS":                            {statusOK, "xt_TCPMSS loaded", ""},
				"tunnel ends: sysctl net.ipv4.conf.all.rp_filter":   {statusOK, "= 0", ""},
				"tunnel ends: sysctl net.ipv4.conf.tunl0.rp_filter": {statusOK, "no tunl0 yet", ""},
			},
		},
		{
			name: "what tunnel ends lack only warns: ipip not loaded, fou missing, rp_filter strict",
			ok:   true,
			cfg:  func(c *Config) { c.DirectServerReturn = true },
			node: func(n *fakeNode) {
				n.mods.state["ipip"] = kmod.Loadable
				n.mods.state["fou"] = kmod.Missing
				n.sysctls["net/ipv4/conf/all/rp_filter"] = "1"
				n.sysctls["net/ipv4/conf/tunl0/rp_filter"] = "2"
			},
			expect: map[string]expect{
				"tunnel ends: ipip": {statusWarn, "not loaded, such Services fail here", "preflight --load-modules"},
				"tunnel ends: fou":  {statusWarn, "fou missing", ""},
				"tunnel ends: sysctl net.ipv4.conf.all.rp_filter":   {statusWarn, "= 1: Services with ipvs-proxy.io/forwarding tunnel or gue are refused", "run never lowers it"},
				"tunnel ends: sysctl net.ipv4.conf.tunl0.rp_filter": {statusOK, "= 2; run sets it to 0", ""},
			},
		},
		{
			name: "--load-modules loads ipip for tunnel ends",
			ok:   true,
			cfg:  func(c *Config) { c.LoadModules, c.DirectServerReturn = true, true },
			node: func(n *fakeNode) { n.mods.state["ipip"] = kmod.Loadable },
			expect: map[string]expect{
				"tunnel ends: ipip": {statusOK, "ipip loaded (loaded now by modprobe)", ""},
			},
		},
		{
			// Off, ipip is neither checked nor loaded: it would give every
			// network namespace a tunl0.
			name:   "--load-modules without --direct-server-return leaves ipip",
			ok:     true,
			cfg:    func(c *Config) { c.LoadModules = true },
			node:   func(n *fakeNode) { n.mods.state["ipip"] = kmod.Loadable },
			absent: []string{"tunnel ends: ipip", "tunnel ends: fou", "tunnel ends: sysctl net.ipv4.conf.all.rp_filter"},
		},
		{
			name: "--load-modules when modprobe fails",
			ok:   true,
			cfg:  func(c *Config) { c.LoadModules = true },
			node: func(n *fakeNode) {
				n.mods.state["ip_vs_rr"] = kmod.Loadable
				n.mods.loadErr = errors.New("modprobe ip_vs_rr: exit status 1: FATAL")
			},
			expect: map[string]expect{
				"scheduler rr": {statusWarn, "modprobe ip_vs_rr: exit status 1: FATAL", "modprobe ip_vs_rr on the node"},
			},
		},
		{
			name: "--load-modules without CAP_SYS_MODULE",
			cfg:  func(c *Config) { c.LoadModules = true },
			node: func(n *fakeNode) { n.caps = 1 << capNetAdmin },
			expect: map[string]expect{
				"capability CAP_NET_ADMIN":  {status: statusOK},
				"capability CAP_SYS_MODULE": {statusFail, "missing", "add SYS_MODULE"},
			},
		},
		{
			name: "no CAP_NET_ADMIN",
			node: func(n *fakeNode) { n.caps = 0 },
			expect: map[string]expect{
				"capability CAP_NET_ADMIN": {statusFail, "missing", "NET_ADMIN"},
			},
			absent: []string{"capability CAP_SYS_MODULE"},
		},
		{
			name: "no dummy interfaces",
			node: func(n *fakeNode) {
				n.dummyErr = errors.New("create a dummy interface: the kernel has no dummy interface type: operation not supported")
				n.mods.state["dummy"] = kmod.Missing
			},
			expect: map[string]expect{
				"dummy interface": {statusFail, "no dummy interface type", "use a kernel built with dummy interfaces (module dummy)"},
			},
		},
		{
			name: "a probe that panics is a failed check",
			node: func(n *fakeNode) { n.panicky = true },
			expect: map[string]expect{
				"dummy interface":  {statusFail, "probe failed: the dummy probe panicked", ""},
				"iptables backend": {status: statusOK},
			},
		},
		{
			name: "one ipset type missing",
			node: func(n *fakeNode) {
				n.ipsetErr["hash:ip,port,net"] = errors.New("create an ipset of type hash:ip,port,net: invalid type")
				n.mods.state["ip_set_hash_ipportnet"] = kmod.Missing
			},
			expect: map[string]expect{
				"ipset hash:ip,port,net": {statusFail, "invalid type", "the ipset type hash:ip,port,net (module ip_set_hash_ipportnet)"},
				"ipset hash:ip,port":     {status: statusOK},
			},
		},
		{
			name: "no iptables at all",
			node: func(n *fakeNode) { clear(n.commands) },
			expect: map[string]expect{
				"iptables backend": {statusFail, "no usable iptables: iptables-nft: iptables: no nft backend tools", "install iptables"},
			},
		},
		{
			name: "only iptables-nft, with rules",
			ok:   true,
			node: func(n *fakeNode) {
				n.uninstall("legacy")
				n.saves["iptables-nft-save"] = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A FORWARD -j ACCEPT\nCOMMIT\n"
			},
			expect: map[string]expect{
				"iptables backend": {statusOK, "run uses nft (only nft is available (2 rules)); iptables-nft: 2 rules; iptables-legacy: iptables: no legacy backend tools", ""},
			},
		},
		{
			name: "auto follows the backend with more rules",
			ok:   true,
			node: func(n *fakeNode) {
				n.saves["iptables-nft-save"] = "*filter\n-A INPUT -j ACCEPT\n"
				n.saves["iptables-legacy-save"] = "*filter\n-A INPUT -j DROP\n-A FORWARD -j DROP\n"
			},
			expect: map[string]expect{
				"iptables backend": {statusOK, "run uses legacy (legacy holds 2 rules, nft 1)", ""},
			},
		},
		{
			name: "auto picks nft, kubelet's hint is in legacy",
			ok:   true,
			node: func(n *fakeNode) {
				n.saves["iptables-nft-save"] = "*filter\n-A INPUT -j ACCEPT\n-A FORWARD -j ACCEPT\n"
				n.saves["iptables-legacy-save"] = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n*filter\n-A INPUT -j DROP\n"
			},
			expect: map[string]expect{
				"iptables backend": {statusWarn, "but kubelet uses legacy: iptables-nft: 2 rules; iptables-legacy: 1 rules and kubelet's KUBE-IPTABLES-HINT",
					"use --iptables-backend legacy"},
			},
		},
		{
			name: "--iptables-backend legacy where kubelet uses legacy",
			ok:   true,
			cfg:  func(c *Config) { c.IPTablesBackend = "legacy" },
			node: func(n *fakeNode) { n.saves["iptables-legacy-save"] = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n" },
			expect: map[string]expect{
				"iptables backend": {statusOK, "run uses legacy (--iptables-backend legacy)", ""},
			},
		},
		{
			name: "--iptables-backend legacy, not installed",
			cfg:  func(c *Config) { c.IPTablesBackend = "legacy" },
			node: func(n *fakeNode) { n.uninstall("legacy") },
			expect: map[string]expect{
				"iptables backend": {statusFail, "run would use legacy (--iptables-backend legacy), which does not work", "choose another --iptables-backend"},
			},
		},
		{
			name: "a backend whose save fails is unusable",
			node: func(n *fakeNode) {
				n.uninstall("legacy")
				n.saveErr["iptables-nft-save"] = errors.New("exit status 1: Could not fetch rule set generation id")
			},
			expect: map[string]expect{
				"iptables backend": {statusFail, "Could not fetch rule set generation id", "install iptables"},
			},
		},
		{
			name: "IPv6 without ip6tables",
			cfg:  func(c *Config) { c.IPv6 = true },
			node: func(n *fakeNode) {
				delete(n.commands, "ip6tables-nft-save")
			},
			expect: map[string]expect{
				"iptables backend": {statusFail, "its IPv6 tools do not work", "install ip6tables"},
			},
		},
		{
			name: "sysctls read-only",
			node: func(n *fakeNode) {
				n.readOnly = true
				n.sysctls["net/ipv4/vs/conntrack"] = "0"
			},
			expect: map[string]expect{
				"sysctl net.ipv4.ip_forward":   {statusWarn, "= 1, as run sets it; not writable: read-only file system", "mount the node's /proc/sys/net writable at /host/proc/sys/net"},
				"sysctl net.ipv4.vs.conntrack": {statusFail, "= 0, run sets 1; not writable", "/host/proc/sys/net (as deploy/daemonset.yaml does), or set it on the node"},
			},
		},
		{
			name: "IPv6 forwarding is left to the first IPv6 Service; strict ARP adds its sysctls",
			ok:   true,
			cfg:  func(c *Config) { c.IPv6, c.StrictARP = true, true },
			node: func(n *fakeNode) { n.sysctls["net/ipv6/conf/all/forwarding"] = "0" },
			expect: map[string]expect{
				"IPv6":                                  {statusOK, "net.ipv6.conf.all.forwarding = 0: run sets 1 once the node serves an IPv6 Service, and never on an IPv4-only cluster; writable", ""},
				"sysctl net.ipv4.conf.all.arp_ignore":   {statusOK, "= 0, --strict-arp sets 1; writable", ""},
				"sysctl net.ipv4.conf.all.arp_announce": {statusOK, "= 0, --strict-arp sets 2", ""},
			},
		},
		{
			name: "--sloppy-tcp adds net.ipv4.vs.sloppy_tcp",
			ok:   true,
			cfg:  func(c *Config) { c.DirectServerReturn, c.SloppyTCP = true, true },
			node: func(n *fakeNode) { n.sysctls["net/ipv4/vs/sloppy_tcp"] = "0" },
			expect: map[string]expect{
				"sysctl net.ipv4.vs.sloppy_tcp": {statusOK, "= 0, --sloppy-tcp sets 1; writable", ""},
			},
		},
		{
			name:   "without --sloppy-tcp, sloppy_tcp is not checked",
			ok:     true,
			cfg:    func(c *Config) { c.DirectServerReturn = true },
			node:   func(n *fakeNode) { n.sysctls["net/ipv4/vs/sloppy_tcp"] = "0" },
			absent: []string{"sysctl net.ipv4.vs.sloppy_tcp"},
		},
		{
			// A node booted with ipv6.disable=1: a warning, not a
			// failure (run serves IPv4), and the IPv6 glue is not tried.
			name: "IPv6 missing",
			ok:   true,
			cfg:  func(c *Config) { c.IPv6 = true },
			node: func(n *fakeNode) {
				delete(n.sysctls, "net/ipv6/conf/all/forwarding")
				delete(n.commands, "ip6tables-nft-save")
			},
			expect: map[string]expect{
				"IPv6":             {statusWarn, "the node's kernel has no IPv6", "drop IPv6 from --ip-families"},
				"iptables backend": {status: statusOK},
			},
			absent: []string{"sysctl net.ipv6.conf.all.forwarding"},
		},
		{
			name: "IPv6 alone on a node without IPv6: run cannot start",
			cfg:  func(c *Config) { c.IPv4, c.IPv6 = false, true },
			node: func(n *fakeNode) { delete(n.sysctls, "net/ipv6/conf/all/forwarding") },
			expect: map[string]expect{
				"IPv6": {statusFail, "--ip-families is IPv6 alone", "add IPv4 to --ip-families"},
			},
		},
		{
			name: "IPv6 forwarding already on",
			ok:   true,
			cfg:  func(c *Config) { c.IPv6 = true },
			node: func(n *fakeNode) { n.sysctls["net/ipv6/conf/all/forwarding"] = "1" },
			expect: map[string]expect{
				"IPv6": {statusOK, "net.ipv6.conf.all.forwarding = 1 already", ""},
			},
		},
		{
			name: "schedulers named by annotations",
			ok:   true,
			node: func(n *fakeNode) {
				n.inUse = func(context.Context) (map[string][]string, int, error) {
					return map[string][]string{"sh": {"a/one", "a/two", "b/three", "b/four", "c/five"}, "rr": {"d/six"}}, 9, nil
				}
				n.mods.state["ip_vs_sh"] = kmod.Loadable
			},
			expect: map[string]expect{
				"schedulers in use": {statusOK, "9 Services read; annotations name rr, sh", ""},
				"scheduler rr":      {statusOK, "used by --scheduler, d/six", ""},
				"scheduler sh":      {statusOK, "used by a/one, a/two, b/three, 2 more", ""},
			},
			absent: []string{"scheduler wrr"},
		},
		{
			// A tenant's annotation must not keep the agent off the node:
			// run gives those Services --scheduler (it failed here before).
			name: "a scheduler only annotations name is missing: a warning",
			ok:   true,
			node: func(n *fakeNode) {
				n.inUse = func(context.Context) (map[string][]string, int, error) {
					return map[string][]string{"mh": {"a/one"}}, 1, nil
				}
				n.mods.state["ip_vs_mh"] = kmod.Missing
			},
			expect: map[string]expect{
				"scheduler mh": {statusWarn, "ip_vs_mh missing; used by a/one; without it run gives them --scheduler, with an Event", "ip_vs_mh"},
				"scheduler rr": {statusOK, "used by --scheduler", ""},
			},
		},
		{
			name: "the API fails: only --scheduler, with a warning",
			ok:   true,
			cfg:  func(c *Config) { c.Scheduler = "wlc" },
			node: func(n *fakeNode) {
				n.inUse = func(context.Context) (map[string][]string, int, error) {
					return nil, 0, errors.New("list Services: connection refused")
				}
			},
			expect: map[string]expect{
				"schedulers in use": {statusWarn, "connection refused; only --scheduler is checked", "use --all-schedulers"},
				"scheduler wlc":     {status: statusOK},
			},
			absent: []string{"scheduler rr"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newFakeNode()
			if tt.node != nil {
				tt.node(n)
			}
			pc := base
			if tt.cfg != nil {
				tt.cfg(&pc)
			}
			rep := Run(context.Background(), n.system(), pc, zap.NewNop())
			got := map[string]Check{}
			for _, c := range rep.Checks {
				if _, dup := got[c.Name]; dup {
					t.Errorf("check %q twice", c.Name)
				}
				got[c.Name] = c
				if (c.Status == statusOK) != (c.Remedy == "") {
					t.Errorf("check %q: status %s with remedy %q: every failure and warning needs one, OK none", c.Name, c.Status, c.Remedy)
				}
			}
			for name, e := range tt.expect {
				c, ok := got[name]
				switch {
				case !ok:
					t.Errorf("no check %q", name)
				case c.Status != e.status || !strings.Contains(c.Detail, e.detail) || !strings.Contains(c.Remedy, e.remedy):
					t.Errorf("check %q = %s %q (remedy %q), want %s with %q (remedy %q)", name, c.Status, c.Detail, c.Remedy, e.status, e.detail, e.remedy)
				}
			}
			for _, name := range tt.absent {
				if _, ok := got[name]; ok {
					t.Errorf("check %q should not be there", name)
				}
			}
			if rep.OK != tt.ok {
				t.Errorf("ok = %v, want %v; checks:\n%s", rep.OK, tt.ok, tableOf(t, rep))
			}
			fails := 0
			for _, c := range rep.Checks {
				if c.Status == statusFail {
					fails++
				}
			}
			if rep.Failed != fails || rep.OK != (fails == 0) {
				t.Errorf("failed = %d, ok = %v; %d checks failed", rep.Failed, rep.OK, fails)
			}
		})
	}
}

func tableOf(t *testing.T, rep Report) string {
	var b bytes.Buffer
	if err := Write(&b, rep, "table"); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestPreflightAllSchedulers(t *testing.T) {
	n := newFakeNode()
	n.inUse = func(context.Context) (map[string][]string, int, error) {
		t.Error("--all-schedulers read the Services")
		return nil, 0, nil
	}
	n.mods.state["ip_vs_mh"] = kmod.Missing
	rep := Run(context.Background(), n.system(), Config{Scheduler: "rr", IPTablesBackend: "auto", AllSchedulers: true}, zap.NewNop())
	var checked []string
	for _, c := range rep.Checks {
		if s, ok := strings.CutPrefix(c.Name, "scheduler "); ok {
			checked = append(checked, s)
			if want := map[bool]string{true: statusFail, false: statusOK}[s == "mh"]; c.Status != want {
				t.Errorf("scheduler %s: %s, want %s", s, c.Status, want)
			}
		}
	}
	if !slices.Equal(checked, scheduler.Names()) {
		t.Errorf("schedulers checked: %v, want %v", checked, scheduler.Names())
	}
	if rep.OK {
		t.Error("ok with a scheduler missing")
	}
}

// TestPreflightLogsStepTimes: one line gives each step's time and the
// whole, so a slow init container's log says where its minutes went (here
// the Services' read, slowed on purpose, is the schedulers' step).
func TestPreflightLogsStepTimes(t *testing.T) {
	const slow = 50 * time.Millisecond
	n := newFakeNode()
	n.inUse = func(context.Context) (map[string][]string, int, error) {
		time.Sleep(slow)
		return nil, 3, nil
	}
	core, logs := observer.New(zapcore.InfoLevel)
	Run(context.Background(), n.system(), Config{Scheduler: "rr", IPv4: true, IPTablesBackend: "auto"}, zap.New(core))
	lines := logs.FilterMessage("preflight checks ran").All()
	if len(lines) != 1 {
		t.Fatalf("%d lines of the steps' times, want 1 (all: %v)", len(lines), logs.All())
	}
	took := map[string]time.Duration{}
	for k, v := range lines[0].ContextMap() {
		d, ok := v.(time.Duration)
		if !ok {
			t.Errorf("field %s = %v (%T), want a duration", k, v, v)
		}
		took[k] = d
	}
	var names []string
	for k := range took {
		names = append(names, k)
	}
	slices.Sort(names)
	want := []string{"capabilities", "config", "conntrack", "dummy", "ipsets", "iptables", "ipv6", "ipvs", "schedulers", "sysctls", "took"}
	if !slices.Equal(names, want) {
		t.Errorf("fields %v, want %v", names, want)
	}
	if took["schedulers"] < slow || took["took"] < took["schedulers"] {
		t.Errorf("schedulers took %s, all %s; want at least %s, and the whole at least that", took["schedulers"], took["took"], slow)
	}
}

func TestWritePreflight(t *testing.T) {
	rep := Report{Kernel: "6.1.0-test", Failed: 1, Checks: []Check{
		{Name: "capability CAP_NET_ADMIN", Status: statusOK, Detail: "present"},
		{Name: "IPVS core", Status: statusFail, Detail: "the kernel has no IPVS", Remedy: "use a kernel built with IPVS (module ip_vs)"},
	}}
	want := `CHECK                     STATUS  DETAIL
capability CAP_NET_ADMIN  OK      present
IPVS core                 FAIL    the kernel has no IPVS
                                  remedy: use a kernel built with IPVS (module ip_vs)

kernel 6.1.0-test: 2 checks, 1 failed, 0 warnings: NOT ready for ipvs-proxy
`
	if got := tableOf(t, rep); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	var b bytes.Buffer
	if err := Write(&b, rep, "json"); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.OK || back.Kernel != rep.Kernel || len(back.Checks) != 2 || back.Checks[1].Remedy != rep.Checks[1].Remedy {
		t.Errorf("JSON round trip: %+v", back)
	}
	if !strings.Contains(b.String(), `"remedy": "use a kernel built with IPVS (module ip_vs)"`) || strings.Count(b.String(), `"remedy"`) != 1 {
		t.Errorf("JSON: remedies only on failures:\n%s", b.String())
	}
}
