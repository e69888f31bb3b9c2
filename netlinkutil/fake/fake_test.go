package fake

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes/ktypestest"
)

// TestIPVSForwarding: the fake keeps a real server's method and GUE port
// through adds and updates, returns them from both reads, shows them in
// its calls and Dump, refuses GUE without a port as the kernel does, and
// still injects errors into such writes.
func TestIPVSForwarding(t *testing.T) {
	f := NewIPVS()
	vs := ktypes.VirtualServer{VSKey: ktypestest.VSKey("192.168.56.210:80", ktypes.TCP), Scheduler: "mh"}
	w := func(kind ktypes.OpKind, rs string) netlinkutil.Write {
		return netlinkutil.Write{Kind: kind, VirtualServer: vs, RealServer: ktypestest.RS(rs)}
	}
	errs := f.Apply([]netlinkutil.Write{{Kind: ktypes.OpAddVirtualServer, VirtualServer: vs},
		w(ktypes.OpAddRealServer, "10.244.1.2:8080 tunnel"), w(ktypes.OpAddRealServer, "10.244.2.2:8080"),
		w(ktypes.OpUpdateRealServer, "10.244.2.2:8080@0 gue:6080"),
		w(ktypes.OpUpdateRealServer, "10.244.1.2:8080 gue:0")})
	if !errors.Is(errs[4], unix.EINVAL) || errors.Join(errs[:4]...) != nil {
		t.Errorf("errors %v, want only the last (GUE without a port) EINVAL", errs)
	}
	want := ktypestest.RSs("10.244.2.2:8080@0 gue:6080", "10.244.1.2:8080 tunnel") // head first
	got, err := f.ListRealServers(vs.VSKey)
	if err != nil {
		t.Fatal(err)
	}
	all, err := f.ListAllRealServers()
	if err != nil {
		t.Fatal(err)
	}
	addr := cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
	if diff := cmp.Diff(want, got, addr); diff != "" {
		t.Errorf("ListRealServers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, all[vs.VSKey], addr); diff != "" {
		t.Errorf("ListAllRealServers (-want +got):\n%s", diff)
	}
	wantDump := []string{"192.168.56.210:80/TCP mh", "  -> 10.244.1.2:8080 w=1 tunnel", "  -> 10.244.2.2:8080 w=0 gue:6080"}
	if diff := cmp.Diff(wantDump, f.Dump()); diff != "" {
		t.Errorf("Dump (-want +got):\n%s", diff)
	}
	f.InjectErrors(func(c Call) error {
		if c == "UpdateRealServer 192.168.56.210:80/TCP 10.244.1.2:8080 w=1" {
			return unix.EIO
		}
		return nil
	})
	_, writesBefore := f.Counts()
	f.ResetCalls()
	errs = f.Apply([]netlinkutil.Write{w(ktypes.OpUpdateRealServer, "10.244.1.2:8080")})
	if !errors.Is(errs[0], unix.EIO) {
		t.Errorf("injected error: got %v", errs[0])
	}
	if _, writes := f.Counts(); writes != writesBefore+1 {
		t.Errorf("counted %d writes after %d and one more; want %d", writes, writesBefore, writesBefore+1)
	}
	if diff := cmp.Diff([]Call{"UpdateRealServer 192.168.56.210:80/TCP 10.244.1.2:8080 w=1"}, f.Writes()); diff != "" {
		t.Errorf("recorded writes (-want +got):\n%s", diff)
	}
	if got, _ := f.ListRealServers(vs.VSKey); got[1].Forward != ktypes.ForwardTunnel {
		t.Errorf("a refused update changed the method: %v", got[1])
	}
}
