package tunnelend

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/glue"
)

// fakeKernel is a kernel in memory: iptables tables that restore inputs
// change as iptables-restore --noflush would, rules, routes, links, fou
// ports and sysctls. It records every write and fails the calls named in
// fail.
type fakeKernel struct {
	tables  glue.Saved
	rules   []Rule
	routes  []Route
	links   map[string]Link
	fou     []uint16
	sysctls map[string]string
	// calls records writes ("restore", "AddRule ...", ...).
	calls []string
	fail  map[string]error
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{tables: glue.Saved{}, links: map[string]Link{Device: {Exists: true}},
		sysctls: map[string]string{sysctlAllRPFilter: "0", sysctlDeviceRPFilter: "2"}, fail: map[string]error{}}
}

func (k *fakeKernel) kernel() Kernel {
	return Kernel{Tables: fakeTables{k}, Net: fakeNet{k}, Sysctls: fakeSysctls{k}}
}

func (k *fakeKernel) call(name string, args ...any) error {
	if err := k.fail[name]; err != nil {
		return err
	}
	if strings.HasPrefix(name, "Add") || strings.HasPrefix(name, "Del") || name == "SetUp" {
		k.calls = append(k.calls, strings.TrimSpace(name+" "+fmt.Sprint(args...)))
	}
	return nil
}

type fakeTables struct{ k *fakeKernel }

// Save prints protocol 4 by its /etc/protocols name, as iptables-save does.
func (f fakeTables) Save(context.Context) (glue.Saved, error) {
	if err := f.k.call("Save"); err != nil {
		return nil, err
	}
	out := glue.Saved{}
	for name, t := range f.k.tables {
		c := &glue.SavedTable{Chains: slices.Clone(t.Chains), Rules: map[string][]string{}, Policies: map[string]string{}}
		for chain, rules := range t.Rules {
			for _, r := range rules {
				c.Rules[chain] = append(c.Rules[chain], strings.Replace(r, " -p 4 ", " -p ipencap ", 1))
			}
		}
		out[name] = c
	}
	return out, nil
}

func (f fakeTables) Restore(_ context.Context, input string) error {
	if err := f.k.call("Restore"); err != nil {
		return err
	}
	var t *glue.SavedTable
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "*"):
			if t = f.k.tables[line[1:]]; t == nil {
				t = &glue.SavedTable{Rules: map[string][]string{}}
				f.k.tables[line[1:]] = t
			}
		case strings.HasPrefix(line, ":"):
			if !slices.Contains(t.Chains, fields[0][1:]) {
				t.Chains = append(t.Chains, fields[0][1:])
			}
			t.Rules[fields[0][1:]] = nil
		case fields[0] == "-A":
			t.Rules[fields[1]] = append(t.Rules[fields[1]], line)
		case fields[0] == "-I":
			spec := strings.Join(fields[3:], " ")
			t.Rules[fields[1]] = slices.Insert(t.Rules[fields[1]], 0, "-A "+fields[1]+" "+spec)
		case fields[0] == "-D":
			rule := "-A" + strings.TrimPrefix(line, "-D")
			i := slices.Index(t.Rules[fields[1]], rule)
			if i < 0 {
				return fmt.Errorf("restore: no rule %q", rule)
			}
			t.Rules[fields[1]] = slices.Delete(t.Rules[fields[1]], i, i+1)
		case fields[0] == "-X":
			t.Chains = slices.DeleteFunc(t.Chains, func(c string) bool { return c == fields[1] })
			delete(t.Rules, fields[1])
		}
	}
	f.k.calls = append(f.k.calls, "restore:\n"+input)
	return nil
}

type fakeNet struct{ k *fakeKernel }

func (f fakeNet) Rules(prio int) ([]Rule, error) {
	return slices.DeleteFunc(slices.Clone(f.k.rules), func(r Rule) bool { return r.Priority != prio }), f.k.call("Rules")
}

func (f fakeNet) AddRule(r Rule) error {
	if err := f.k.call("AddRule", r); err != nil {
		return err
	}
	f.k.rules = append(f.k.rules, r)
	return nil
}

func (f fakeNet) DelRule(r Rule) error {
	if err := f.k.call("DelRule", r); err != nil {
		return err
	}
	f.k.rules = slices.DeleteFunc(f.k.rules, func(h Rule) bool { return h == r })
	return nil
}

func (f fakeNet) Routes(table int) ([]Route, error) {
	return slices.DeleteFunc(slices.Clone(f.k.routes), func(r Route) bool { return r.Table != table }), f.k.call("Routes")
}

func (f fakeNet) AddRoute(r Route) error {
	if err := f.k.call("AddRoute", r); err != nil {
		return err
	}
	f.k.routes = append(f.k.routes, r)
	return nil
}

func (f fakeNet) DelRoute(r Route) error {
	if err := f.k.call("DelRoute", r); err != nil {
		return err
	}
	f.k.routes = slices.DeleteFunc(f.k.routes, func(h Route) bool { return h == r })
	return nil
}

func (f fakeNet) Link(name string) (Link, error) { return f.k.links[name], f.k.call("Link") }

func (f fakeNet) SetUp(name string) error {
	if err := f.k.call("SetUp", name); err != nil {
		return err
	}
	l := f.k.links[name]
	l.Up = true
	f.k.links[name] = l
	return nil
}

func (f fakeNet) FouPorts() ([]uint16, error) { return slices.Clone(f.k.fou), f.k.call("FouPorts") }

func (f fakeNet) AddFou(p uint16) error {
	if err := f.k.call("AddFou", p); err != nil {
		return err
	}
	f.k.fou = append(f.k.fou, p)
	return nil
}

func (f fakeNet) DelFou(p uint16) error {
	if err := f.k.call("DelFou", p); err != nil {
		return err
	}
	f.k.fou = slices.DeleteFunc(f.k.fou, func(h uint16) bool { return h == p })
	return nil
}

type fakeSysctls struct{ k *fakeKernel }

func (f fakeSysctls) Get(name string) (string, error) { return f.k.sysctls[name], f.k.call("Get") }

func (f fakeSysctls) Ensure(name, value string) (string, error) {
	if err := f.k.call("Ensure"); err != nil {
		return "", err
	}
	old := f.k.sysctls[name]
	if old != value { // netlinkutil.Sysctls writes only then
		f.k.sysctls[name] = value
		f.k.calls = append(f.k.calls, "Ensure "+name+"="+value)
	}
	return old, nil
}

// dump is the whole state of the fake kernel, one line a thing, sorted
// within each part: what a test compares against its expectation.
func (k *fakeKernel) dump() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(k.tables)) {
		t := k.tables[name]
		for _, c := range t.Chains {
			out = append(out, name+" :"+c)
		}
		for _, c := range slices.Sorted(maps.Keys(t.Rules)) {
			for _, r := range t.Rules[c] {
				out = append(out, name+" "+r)
			}
		}
	}
	for _, r := range k.rules {
		out = append(out, "rule "+r.String())
	}
	for _, r := range k.routes {
		out = append(out, "route "+r.String())
	}
	for _, p := range k.fou {
		out = append(out, fmt.Sprintf("fou gue %d", p))
	}
	for _, name := range slices.Sorted(maps.Keys(k.links)) {
		out = append(out, fmt.Sprintf("link %s %+v", name, k.links[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(k.sysctls)) {
		out = append(out, "sysctl "+name+" = "+k.sysctls[name])
	}
	return out
}
