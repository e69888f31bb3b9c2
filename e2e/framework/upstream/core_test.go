package upstream

import "testing"

func TestNarrowToCore(t *testing.T) {
	p, err := newPlanFrom(testSkips, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.NarrowToCore(); err != nil {
		t.Fatal(err)
	}
	for _, name := range core {
		full := "[sig-network] " + name
		if !p.InFocus(full) || !p.selected(full) {
			t.Errorf("%q: not selected by the core", full)
		}
	}
	for _, name := range []string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
		"[sig-network] EndpointSlice should support a Service with multiple ports specified in multiple EndpointSlices [Conformance]",
	} {
		if p.InFocus(name) {
			t.Errorf("%q: in the core, want only conformance-ci", name)
		}
	}
	if CoreSize() != 13 {
		t.Errorf("CoreSize() = %d, want 13", CoreSize())
	}
}
