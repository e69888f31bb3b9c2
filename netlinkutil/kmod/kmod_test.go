package kmod

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// node is a fake node's module files.
type node struct {
	procModules *string           // nil: no /proc/modules (no module support)
	sysModule   map[string]bool   // name -> has initstate (loaded module)
	builtin     *string           // modules.builtin; nil: absent
	dep         *string           // modules.dep; nil: absent
	extra       map[string]string // more files under ModulesDir
}

func ptr(s string) *string { return &s }

func (n node) write(t *testing.T) Paths {
	t.Helper()
	root := t.TempDir()
	p := Paths{
		ProcModules: filepath.Join(root, "proc/modules"),
		SysModule:   filepath.Join(root, "sys/module"),
		ModulesDir:  filepath.Join(root, "lib/modules/6.1.0-test"),
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{filepath.Dir(p.ProcModules), p.SysModule, p.ModulesDir} {
		must(os.MkdirAll(d, 0o755))
	}
	if n.procModules != nil {
		must(os.WriteFile(p.ProcModules, []byte(*n.procModules), 0o644))
	}
	for m, live := range n.sysModule {
		must(os.MkdirAll(filepath.Join(p.SysModule, m, "parameters"), 0o755))
		if live {
			must(os.WriteFile(filepath.Join(p.SysModule, m, "initstate"), []byte("live\n"), 0o644))
		}
	}
	if n.builtin != nil {
		must(os.WriteFile(filepath.Join(p.ModulesDir, "modules.builtin"), []byte(*n.builtin), 0o644))
	}
	if n.dep != nil {
		must(os.WriteFile(filepath.Join(p.ModulesDir, "modules.dep"), []byte(*n.dep), 0o644))
	}
	for f, c := range n.extra {
		must(os.WriteFile(filepath.Join(p.ModulesDir, f), []byte(c), 0o644))
	}
	return p
}

const debianDep = `kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko
kernel/net/netfilter/ipvs/ip_vs_rr.ko: kernel/net/netfilter/ipvs/ip_vs.ko
kernel/net/netfilter/ipvs/ip_vs_mh.ko.xz: kernel/net/netfilter/ipvs/ip_vs.ko
kernel/drivers/net/dummy.ko.zst:
kernel/net/netfilter/ipset/ip_set_hash_ipport.ko:
kernel/net/netfilter/nf-conntrack-sip.ko: kernel/net/netfilter/nf_conntrack.ko
`

func TestCheck(t *testing.T) {
	standard := node{
		procModules: ptr("ip_vs 196608 2 ip_vs_rr, Live 0x0000000000000000\nip_vs_rr 12288 1 - Live 0x0000000000000000\nnf_conntrack 200000 3 ip_vs, Live 0x0\n"),
		sysModule:   map[string]bool{"ip_vs": true, "ip_vs_rr": true, "nf_conntrack": true, "ip_set": false},
		builtin:     ptr("kernel/net/netfilter/ipset/ip_set.ko\nkernel/net/netfilter/x_tables.ko\n"),
		dep:         ptr(debianDep),
	}
	tests := []struct {
		name   string
		node   node
		module string
		want   State
		detail string
	}{
		{"loaded", standard, "ip_vs", Loaded, "ip_vs loaded"},
		{"loaded, dashes and suffix normalized", standard, "ip-vs-rr.ko", Loaded, "ip_vs_rr loaded"},
		{"built in, listed in modules.builtin", standard, "x_tables", Builtin, "x_tables built into the kernel"},
		{"built in, /sys/module without initstate", node{procModules: ptr(""), sysModule: map[string]bool{"nf_conntrack": false}, dep: ptr("")},
			"nf_conntrack", Builtin, "nf_conntrack built into the kernel"},
		{"loaded after /proc/modules was read", node{procModules: ptr(""), sysModule: map[string]bool{"dummy": true}, dep: ptr("")},
			"dummy", Loaded, "dummy loaded"},
		{"loadable", standard, "ip_vs_mh", Loadable, "ip_vs_mh not loaded; loadable ("},
		{"loadable, zstd", standard, "dummy", Loadable, "kernel/drivers/net/dummy.ko.zst)"},
		{"loadable, dashed file name", standard, "nf_conntrack_sip", Loadable, "nf-conntrack-sip.ko"},
		{"missing", standard, "ip_vs_ovf", Missing, "ip_vs_ovf not loaded, not built in, and not in "},
		{"unknown: no modules.dep", node{procModules: ptr("")}, "ip_vs", Unknown, "whether it is loadable is unknown"},
		{"no module support", node{}, "ip_vs", Missing, "the kernel cannot load modules (no "},
		{"no module support, built in", node{sysModule: map[string]bool{"nf_conntrack": false}}, "nf_conntrack", Builtin, "built into the kernel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := Read(tt.node.write(t)).Check(tt.module)
			if info.State != tt.want || !strings.Contains(info.Detail, tt.detail) {
				t.Errorf("Check(%q) = %v %q, want %v containing %q", tt.module, info.State, info.Detail, tt.want, tt.detail)
			}
			if info.State.Present() != (tt.want == Loaded || tt.want == Builtin) {
				t.Errorf("Present() = %v for %v", info.State.Present(), info.State)
			}
		})
	}
}

func TestName(t *testing.T) {
	for _, c := range [][2]string{
		{"ip_vs", "ip_vs"}, {"ip-vs-rr", "ip_vs_rr"}, {"kernel/net/x/ip_vs_sh.ko", "ip_vs_sh"},
		{"/lib/modules/6.1/kernel/drivers/net/dummy.ko.xz", "dummy"}, {" nf_nat.ko.zst ", "nf_nat"}, // spaces trimmed
	} {
		if got := Name(c[0]); got != c[1] {
			t.Errorf("Name(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

func TestModuleSupport(t *testing.T) {
	if !Read(node{procModules: ptr("")}.write(t)).ModuleSupport() {
		t.Error("with /proc/modules: no module support")
	}
	if Read(node{}.write(t)).ModuleSupport() {
		t.Error("without /proc/modules: module support")
	}
}

// TestLoad runs a fake modprobe that "loads" the module by adding it to
// /proc/modules, and checks that the Checker re-reads after it.
func TestLoad(t *testing.T) {
	p := node{procModules: ptr(""), dep: ptr(debianDep)}.write(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "modprobe")
	body := "#!/bin/sh\nif [ \"$1\" = ip_vs_mh ]; then echo \"$1 1 0 - Live 0x0\" >>" + p.ProcModules + "; exit 0; fi\necho \"modprobe: FATAL: Module $1 not found\" >&2\nexit 1\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Checker{Paths: p, Modprobe: script}
	if st := c.Check("ip_vs_mh").State; st != Loadable {
		t.Fatalf("before: %v, want loadable", st)
	}
	if err := c.Load(context.Background(), "ip_vs_mh"); err != nil {
		t.Fatal(err)
	}
	if st := c.Check("ip_vs_mh").State; st != Loaded {
		t.Errorf("after modprobe: %v, want loaded", st)
	}
	err := c.Load(context.Background(), "ip_vs_nope")
	if err == nil || !strings.Contains(err.Error(), "modprobe ip_vs_nope") || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a failing modprobe: %v, want an error with its message", err)
	}
	c.Modprobe = filepath.Join(dir, "no-such-modprobe")
	if err := c.Load(context.Background(), "ip_vs_mh"); err == nil {
		t.Error("a missing modprobe: no error")
	}
}
