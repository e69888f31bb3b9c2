package main

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nltest"
)

// TestIPVSViewMissingOnKernel: settle's poll of IPVS in a fresh network
// namespace. It asks about the last Service until one is missing, and
// after dumpAfter present ones in a row reads the rest with one dump.
// Needs root and IPVS: in the VM both are there (TestKernelPackagesInVM
// runs it), elsewhere it skips.
func TestIPVSViewMissingOnKernel(t *testing.T) {
	nltest.InFreshNetns(t)
	v, err := openIPVS("", "")
	nltest.Require(t, "IPVS over netlink", err)
	defer v.Close()
	_, err = v.h.GetServices()
	nltest.Require(t, "IPVS over netlink", err)
	ss := make([]Service, dumpAfter+6)
	for i := range ss {
		ss[i] = Service{VIP: fmt.Sprintf("10.96.0.%d", i+1), Port: 80}
	}
	add := func(s Service) {
		t.Helper()
		vs := ipvsService(s)
		vs.SchedName, vs.Netmask = "rr", 0xffffffff
		if err := v.h.NewService(vs); err != nil {
			t.Fatalf("add %v: %v", s, err)
		}
	}
	// Every one but ss[0], ss[2] and the last.
	add(ss[1])
	for _, s := range ss[3 : len(ss)-1] {
		add(s)
	}
	// The last one is missing: nothing more is asked.
	if left, err := v.missing(ss); err != nil || len(left) != len(ss) {
		t.Errorf("missing with the last one absent = %d Services, %v; want all %d", len(left), err, len(ss))
	}
	add(ss[len(ss)-1])
	// Fewer than dumpAfter present: GETs until the first missing one.
	few := append([]Service{ss[0], ss[1], ss[2]}, ss[len(ss)-5:]...)
	if left, err := v.missing(few); err != nil || cmp.Diff(ss[:3], left) != "" {
		t.Errorf("missing = %v, %v; want %v", left, err, ss[:3])
	}
	// More than dumpAfter present in a row: one dump tells exactly the
	// missing ones among the rest.
	if left, err := v.missing(ss); err != nil || cmp.Diff([]Service{ss[0], ss[2]}, left) != "" {
		t.Errorf("missing after a dump = %v, %v; want %v", left, err, []Service{ss[0], ss[2]})
	}
	add(ss[0])
	add(ss[2])
	if left, err := v.missing(ss); err != nil || len(left) != 0 {
		t.Errorf("missing with every one there = %v, %v; want none", left, err)
	}
}
