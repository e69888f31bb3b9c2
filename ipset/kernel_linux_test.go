package ipset

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

var (
	a = netip.MustParseAddr
	p = netip.MustParsePrefix
)

func sorted(es []Entry) []string {
	es = slices.Clone(es)
	slices.SortFunc(es, Entry.Compare)
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.String()
	}
	return out
}

// TestKernelRoundTrip creates a set of every type ipvs-proxy uses, in both
// families, writes entries and reads them back, on this machine's kernel in
// a fresh network namespace.
func TestKernelRoundTrip(t *testing.T) {
	k := newKernel(t)
	for _, tc := range []struct {
		spec    Spec
		entries []Entry
	}{
		{Spec{Name: "IPVSP-T-IP", Type: HashIP, Family: IPv4}, []Entry{{Addr: a("10.96.0.1")}, {Addr: a("10.96.0.2")}}},
		{Spec{Name: "IPVSP-T-IPPORT", Type: HashIPPort, Family: IPv4}, []Entry{
			{Addr: a("10.96.0.1"), Proto: ktypes.TCP, Port: 80}, {Addr: a("10.96.0.1"), Proto: ktypes.UDP, Port: 53},
			{Addr: a("10.96.0.1"), Proto: ktypes.SCTP, Port: 9}}},
		{Spec{Name: "IPVSP-T-IPPORT6", Type: HashIPPort, Family: IPv6}, []Entry{{Addr: a("fd00::1"), Proto: ktypes.TCP, Port: 443}}},
		{Spec{Name: "IPVSP-T-IPPORTIP", Type: HashIPPortIP, Family: IPv4}, []Entry{
			{Addr: a("10.100.1.2"), Proto: ktypes.TCP, Port: 8080, Addr2: a("10.100.1.2")}}},
		{Spec{Name: "IPVSP-T-IPPORTNET6", Type: HashIPPortNet, Family: IPv6}, []Entry{
			{Addr: a("fd00::b"), Proto: ktypes.TCP, Port: 80, Net: p("fd00:250::/64")}}},
		{Spec{Name: "IPVSP-T-NET", Type: HashNet, Family: IPv4}, []Entry{{Net: p("10.100.0.0/14")}, {Net: p("192.0.2.7/32")}}},
		{Spec{Name: "IPVSP-T-PORTS", Type: BitmapPort, PortTo: 65535}, []Entry{{Port: 10256}, {Port: 31000}}},
	} {
		t.Run(string(tc.spec.Type)+"/"+tc.spec.Family.String(), func(t *testing.T) {
			if err := k.Create(tc.spec); err != nil {
				t.Fatal(err)
			}
			if err := k.Create(tc.spec); err != nil {
				t.Fatalf("creating the same set again: %v", err)
			}
			if err := k.Add(tc.spec.Name, tc.entries...); err != nil {
				t.Fatal(err)
			}
			if err := k.Add(tc.spec.Name, tc.entries[0]); err != nil {
				t.Fatalf("adding a present entry: %v", err)
			}
			got, err := k.List(tc.spec.Name)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.spec.Normalized(), got.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(sorted(tc.entries), sorted(got.Entries)); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			if err := k.Del(tc.spec.Name, tc.entries[0], tc.entries[0]); err != nil {
				t.Fatalf("deleting an entry twice: %v", err)
			}
			got, _ = k.List(tc.spec.Name)
			if diff := cmp.Diff(sorted(tc.entries[1:]), sorted(got.Entries)); diff != "" {
				t.Errorf("entries after a delete (-want +got):\n%s", diff)
			}
		})
	}
	// Names alone, also of a set too large for one message of a dump
	// with entries, and of a set that is not ipvs-proxy's.
	big := Spec{Name: "IPVSP-T-BIG", Type: HashIP, Family: IPv4, MaxElem: 65536}
	if err := k.Create(big); err != nil {
		t.Fatal(err)
	}
	var many []Entry
	for i := range 20000 {
		many = append(many, Entry{Addr: netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})})
	}
	if err := k.Add(big.Name, many...); err != nil {
		t.Fatal(err)
	}
	if err := netlink.IpsetCreate("KUBE-T-OTHER", "hash:ip", netlink.IpsetCreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names, err := k.ListNames()
	want := []string{"IPVSP-T-BIG", "IPVSP-T-IP", "IPVSP-T-IPPORT", "IPVSP-T-IPPORT6", "IPVSP-T-IPPORTIP", "IPVSP-T-IPPORTNET6", "IPVSP-T-NET", "IPVSP-T-PORTS", "KUBE-T-OTHER"}
	if diff := cmp.Diff(want, names); err != nil || diff != "" {
		t.Errorf("ListNames: %v; names (-want +got):\n%s", err, diff)
	}
	if err := netlink.IpsetDestroy("KUBE-T-OTHER"); err != nil {
		t.Fatal(err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !k.Owns(n) })

	other := Spec{Name: "IPVSP-T-IP", Type: HashIP, Family: IPv4, MaxElem: 1024}
	if err := k.Create(other); !errors.Is(err, ErrMismatch) {
		t.Errorf("create with another capacity: %v; want ErrMismatch", err)
	}
	if err := k.Swap("IPVSP-T-IP", "IPVSP-T-NET"); err == nil {
		t.Error("swapped sets of different types")
	}
	if _, err := k.List("IPVSP-NONE"); !errors.Is(err, ErrNotFound) {
		t.Errorf("list of a missing set: %v; want ErrNotFound", err)
	}
	if err := k.Add("IPVSP-NONE", Entry{Addr: a("10.0.0.1")}); !errors.Is(err, ErrNotFound) {
		t.Errorf("add to a missing set: %v; want ErrNotFound", err)
	}
	for _, n := range names {
		if err := k.Destroy(n); err != nil {
			t.Error(err)
		}
	}
	if err := k.Destroy("IPVSP-T-IP"); err != nil {
		t.Errorf("destroying a missing set: %v", err)
	}
}

// TestKernelOwnership: a set without the prefix can be read, not written.
func TestKernelOwnership(t *testing.T) {
	k := newKernel(t)
	all, err := NewKernel(WithOwner(func(string) bool { return true }))
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	foreign := Spec{Name: "FOREIGN", Type: HashIP, Family: IPv4}
	if err := all.Create(foreign); err != nil {
		t.Fatal(err)
	}
	if err := all.Add("FOREIGN", Entry{Addr: a("192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"create":  k.Create(Spec{Name: "OTHER", Type: HashIP, Family: IPv4}),
		"add":     k.Add("FOREIGN", Entry{Addr: a("192.0.2.2")}),
		"del":     k.Del("FOREIGN", Entry{Addr: a("192.0.2.1")}),
		"flush":   k.Flush("FOREIGN"),
		"swap":    k.Swap("FOREIGN", "IPVSP-X"),
		"destroy": k.Destroy("FOREIGN"),
	} {
		if !errors.Is(err, ErrNotOwned) {
			t.Errorf("%s of a foreign set: %v; want ErrNotOwned", what, err)
		}
	}
	s, err := k.List("FOREIGN")
	if err != nil || len(s.Entries) != 1 {
		t.Errorf("the foreign set: %+v, %v; want it intact and readable", s, err)
	}
	if err := all.Destroy("FOREIGN"); err != nil {
		t.Error(err)
	}
}

// onThread runs fn on a goroutine of its own: the test's goroutine is locked
// to its OS thread (for the namespace), and the library's channel-based
// attribute parsing costs a thread switch per attribute there, which would
// distort the timings. The socket stays in the test's namespace.
func onThread(fn func()) {
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	<-done
}

// TestKernelSyncer10k measures the Syncer against the kernel with 10,000
// entries: a first fill, an idle reread, a difference of 100, and a rebuild.
func TestKernelSyncer10k(t *testing.T) {
	k := newKernel(t)
	s := NewSyncer(k)
	spec := Spec{Name: "IPVSP-SCALE", Type: HashIPPort, Family: IPv4}
	contents := func(from, n int) Contents {
		c := Contents{}
		for i := from; i < from+n; i++ {
			c[Entry{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
		}
		return c
	}
	step := func(what string, want Contents, reread bool) Stats {
		var st Stats
		var err error
		var took time.Duration
		onThread(func() {
			start := time.Now()
			st, err = s.Sync(spec, want, reread)
			took = time.Since(start)
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%-28s %8v  %+v", what, took.Round(100*time.Microsecond), st)
		var got Set
		onThread(func() { got, err = k.List(spec.Name) })
		if err != nil || len(got.Entries) != len(want) {
			t.Fatalf("%s: the kernel holds %d entries (%v), want %d", what, len(got.Entries), err, len(want))
		}
		for _, e := range got.Entries {
			if _, ok := want[e.Key()]; !ok {
				t.Fatalf("%s: unexpected entry %s", what, e)
			}
		}
		return st
	}
	if st := step("create and add 10,000", contents(0, 10000), false); st.Added != 10000 || !st.Created {
		t.Errorf("first fill: %+v", st)
	}
	if st := step("reread, nothing to do", contents(0, 10000), true); st.Writes() != 0 || st.Reads != 1 {
		t.Errorf("idle reread: %+v", st)
	}
	if st := step("difference of 100 (50+50)", contents(50, 10000), false); st.Added != 50 || st.Deleted != 50 || st.Reads != 0 {
		t.Errorf("difference: %+v", st)
	}
	if st := step("rebuild of 10,000 (swap)", contents(20000, 10000), false); !st.Rebuilt || st.Added != 10000 {
		t.Errorf("rebuild: %+v", st)
	}
	if _, err := k.List(TempName(spec.Name)); !errors.Is(err, ErrNotFound) {
		t.Errorf("the rebuild left its temporary set: %v", err)
	}
}

// TestKernelBulkWrites writes thousands of entries in bulk (many per
// message, many messages per system call) with entries the kernel refuses
// in the middle: each refused entry is named in the error, and every other
// entry is written, before and after it.
func TestKernelBulkWrites(t *testing.T) {
	k := newKernel(t)
	spec := Spec{Name: "IPVSP-T-BULK", Type: HashIPPort, Family: IPv4}
	if err := k.Create(spec); err != nil {
		t.Fatal(err)
	}
	var entries, valid []Entry
	bad := map[int]bool{1500: true, 1501: true, 4999: true}
	for i := range 5000 {
		e := Entry{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}
		if bad[i] { // an IPv6 address in an IPv4 set
			e.Addr = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
		} else {
			valid = append(valid, e)
		}
		entries = append(entries, e)
	}
	err := k.Add(spec.Name, entries...)
	for i := range bad {
		if err == nil || !strings.Contains(err.Error(), entries[i].String()) {
			t.Errorf("the error %v does not name the refused entry %s", err, entries[i])
		}
	}
	got, lerr := k.List(spec.Name)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if diff := cmp.Diff(sorted(valid), sorted(got.Entries)); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}

	// Deleting in bulk: absent entries are no error.
	del := slices.Clone(valid[:3000])
	for i := range 100 {
		del = append(del, Entry{Addr: netip.AddrFrom4([4]byte{10, 97, 0, byte(i)}), Proto: ktypes.TCP, Port: 80})
	}
	if err := k.Del(spec.Name, del...); err != nil {
		t.Fatal(err)
	}
	got, _ = k.List(spec.Name)
	if diff := cmp.Diff(sorted(valid[3000:]), sorted(got.Entries)); diff != "" {
		t.Errorf("entries after deleting (-want +got):\n%s", diff)
	}

	// An entry without a port: the kernel refuses its message before it
	// reads the entry's number; each entry then goes alone.
	noPort := Entry{Addr: a("10.98.0.2")}
	tail := []Entry{{Addr: a("10.98.0.1"), Proto: ktypes.TCP, Port: 1}, noPort, {Addr: a("10.98.0.3"), Proto: ktypes.TCP, Port: 3}}
	if err := k.Add(spec.Name, tail...); err == nil || !strings.Contains(err.Error(), noPort.String()) || strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("adding an entry without a port: %v, want one error naming %s", err, noPort)
	}
	got, _ = k.List(spec.Name)
	if diff := cmp.Diff(sorted(append(slices.Clone(valid[3000:]), tail[0], tail[2])), sorted(got.Entries)); diff != "" {
		t.Errorf("entries after a message refused whole (-want +got):\n%s", diff)
	}

	// A port outside a bitmap's range: the kernel's own error code
	// (IPSET_ERR_BITMAP_RANGE, the first type-specific one).
	ports := Spec{Name: "IPVSP-T-BULKPORTS", Type: BitmapPort, PortFrom: 0, PortTo: 1000}
	if err := k.Create(ports); err != nil {
		t.Fatal(err)
	}
	err = k.Add(ports.Name, Entry{Port: 10}, Entry{Port: 2000}, Entry{Port: 20})
	var ie nl.IPSetError
	if !errors.As(err, &ie) || int(ie) != nl.IPSET_ERR_TYPE_SPECIFIC || !strings.Contains(err.Error(), "2000") {
		t.Errorf("adding a port out of range: %v, want the kernel's range error naming port 2000", err)
	}
	got, _ = k.List(ports.Name)
	if diff := cmp.Diff([]string{"10", "20"}, sorted(got.Entries)); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	// A set that does not exist.
	if err := k.Add("IPVSP-T-NONE", valid[:3]...); !errors.Is(err, ErrNotFound) {
		t.Errorf("adding to a missing set: %v, want ErrNotFound", err)
	}
}

// TestKernelSetFull: a hash set at its maxelem refuses the entries past it
// with ErrSetFull, each an EntryError naming the entry, and keeps the rest
// of the call's writes (what the glue charges to the Services that wanted
// the refused entries).
func TestKernelSetFull(t *testing.T) {
	k := newKernel(t)
	spec := Spec{Name: "IPVSP-T-FULL", Type: HashIPPort, Family: IPv4, MaxElem: 4}
	if err := k.Create(spec); err != nil {
		t.Fatal(err)
	}
	var entries []Entry
	for i := range 6 {
		entries = append(entries, Entry{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Proto: ktypes.TCP, Port: 80})
	}
	err := k.Add(spec.Name, entries...)
	if !errors.Is(err, ErrSetFull) {
		t.Fatalf("adding 6 entries to a set of 4: %v, want ErrSetFull", err)
	}
	refused, only := RefusedEntries(err)
	if !only || len(refused) != 2 {
		t.Errorf("RefusedEntries = %v (only entry errors: %v), want the 2 entries past maxelem", refused, only)
	}
	got, lerr := k.List(spec.Name)
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(got.Entries) != 4 {
		t.Errorf("the set holds %d entries, want 4 (its maxelem)", len(got.Entries))
	}
	for _, r := range refused {
		if slices.Contains(got.Entries, r.Entry) {
			t.Errorf("refused entry %s is in the set", r.Entry)
		}
	}
}

// TestEntryErrorClass: only the kernel's refusals of the entry itself are
// EntryErrors (charged to the Services that want the entry); a node-wide
// errno (EPERM, ENOMEM, a protocol error) is the node's, naming the entry.
func TestEntryErrorClass(t *testing.T) {
	e := Entry{Addr: netip.MustParseAddr("10.96.0.1"), Proto: ktypes.TCP, Port: 80}
	for _, tc := range []struct {
		errno syscall.Errno
		entry bool
		full  bool
	}{
		{syscall.Errno(nl.IPSET_ERR_TYPE_SPECIFIC), true, true},
		{syscall.Errno(nl.IPSET_ERR_TYPE_SPECIFIC + 3), true, false},
		{syscall.Errno(nl.IPSET_ERR_IPADDR_IPV6), true, false},
		{syscall.EPERM, false, false},
		{syscall.ENOMEM, false, false},
		{syscall.Errno(nl.IPSET_ERR_PROTOCOL), false, false},
	} {
		err := entryError("add", "IPVSP-SERVICE", e, tc.errno)
		var ee *EntryError
		if got := errors.As(err, &ee); got != tc.entry {
			t.Errorf("errno %d: EntryError %v, want %v (%v)", tc.errno, got, tc.entry, err)
		}
		if got := errors.Is(err, ErrSetFull); got != tc.full {
			t.Errorf("errno %d: ErrSetFull %v, want %v", tc.errno, got, tc.full)
		}
		if !strings.Contains(err.Error(), e.String()) {
			t.Errorf("errno %d: %v does not name the entry", tc.errno, err)
		}
	}
}
