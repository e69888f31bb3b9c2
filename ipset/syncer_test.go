package ipset_test

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvs-proxy/ipvs-proxy/ipset"
	"github.com/ipvs-proxy/ipvs-proxy/ipset/fake"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

var spec = ipset.Spec{Name: "IPVSP-CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.IPv4}

func ep(ip string, port uint16) ipset.Entry {
	return ipset.Entry{Addr: netip.MustParseAddr(ip), Proto: ktypes.TCP, Port: port}
}

func contents(es ...ipset.Entry) ipset.Contents { return ipset.ContentsOf(es...) }

func keys(es ...ipset.Entry) []ipset.Key {
	out := make([]ipset.Key, len(es))
	for i, e := range es {
		out[i] = e.Key()
	}
	return out
}

func sync(t *testing.T, s *ipset.Syncer, want ipset.Contents, reread bool) ipset.Stats {
	t.Helper()
	st, err := s.Sync(spec, want, reread)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSyncerByDifference: the set is created and filled once; later syncs
// write only the difference, from the view, without reading the kernel.
func TestSyncerByDifference(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	sync(t, s, contents(ep("10.96.0.1", 80), ep("10.96.0.2", 80)), false)
	if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Create IPVSP-CLUSTER-IP hash:ip,port inet",
		"Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80 10.96.0.2,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("first sync (-want +got):\n%s", diff)
	}
	f.ResetCalls()
	st := sync(t, s, contents(ep("10.96.0.2", 80), ep("10.96.0.3", 80)), false)
	if diff := cmp.Diff([]fake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.3,tcp:80", "Del IPVSP-CLUSTER-IP 10.96.0.1,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("second sync (-want +got):\n%s", diff)
	}
	if st.Added != 1 || st.Deleted != 1 || st.Reads != 0 {
		t.Errorf("stats %+v", st)
	}
	f.ResetCalls()
	sync(t, s, contents(ep("10.96.0.2", 80), ep("10.96.0.3", 80)), false)
	if c := f.Calls(); len(c) != 0 {
		t.Errorf("an unchanged set made calls: %v", c)
	}
}

// TestSyncerRereadRepairsDrift: with reread the kernel's contents are read
// and drift is repaired; without it, the view is trusted.
func TestSyncerRereadRepairsDrift(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	want := contents(ep("10.96.0.1", 80), ep("10.96.0.2", 80))
	sync(t, s, want, false)
	_ = f.Del(spec.Name, ep("10.96.0.1", 80))
	_ = f.Add(spec.Name, ep("10.96.9.9", 80))
	f.ResetCalls()
	sync(t, s, want, false)
	if c := f.Calls(); len(c) != 0 {
		t.Errorf("without reread: %v", c)
	}
	sync(t, s, want, true)
	if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80",
		"Del IPVSP-CLUSTER-IP 10.96.9.9,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("reread (-want +got):\n%s", diff)
	}
}

// TestSyncerRebuild: a difference much larger than the contents, or a set
// of another capacity, is rebuilt in a new set and swapped in.
func TestSyncerRebuild(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	old := ipset.Contents{}
	for i := range 300 {
		old[ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 96, 1, byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
	}
	sync(t, s, old, false)
	f.ResetCalls()
	st := sync(t, s, contents(ep("10.96.0.1", 80)), false)
	want := []fake.Call{"Destroy IPVSP-CLUSTER-IP-N", "Create IPVSP-CLUSTER-IP-N hash:ip,port inet",
		"Add IPVSP-CLUSTER-IP-N 10.96.0.1,tcp:80", "Swap IPVSP-CLUSTER-IP IPVSP-CLUSTER-IP-N", "Destroy IPVSP-CLUSTER-IP-N"}
	if diff := cmp.Diff(want, f.Calls()); diff != "" {
		t.Errorf("rebuild (-want +got):\n%s", diff)
	}
	if !st.Rebuilt || len(f.Entries(spec.Name)) != 1 {
		t.Errorf("stats %+v, entries %v", st, f.Entries(spec.Name))
	}

	// A set left by someone with a smaller capacity is rebuilt with ours.
	small := spec
	small.MaxElem = 1024
	f2 := fake.New()
	f2.Put(small, ep("10.96.0.1", 80))
	s2 := ipset.NewSyncer(f2)
	if st := sync(t, s2, contents(ep("10.96.0.1", 80)), true); !st.Rebuilt {
		t.Errorf("a set of another capacity was not rebuilt: %+v", st)
	}
	got, _ := f2.List(spec.Name)
	if got.MaxElem != ipset.DefaultMaxElem {
		t.Errorf("capacity after the rebuild %d", got.MaxElem)
	}
}

// TestSyncerRebuildResumes: with half of all writes failing (entries,
// creations, swaps and destructions alike), a rebuild of a 300-entry set
// resumes from what its temporary set holds at each attempt, and converges
// with each entry written once and no temporary set left; starting afresh
// at each attempt, it needed all 300 additions to succeed at once and
// never did (the kernel-faults chaos case at 50% ran 15 minutes without
// converging). The glue's retries are full syncs that Forget the view
// first: the rebuild resumes through that too.
func TestSyncerRebuildResumes(t *testing.T) {
	for _, forget := range []bool{false, true} {
		t.Run(fmt.Sprintf("forget=%v", forget), func(t *testing.T) {
			f := fake.New()
			s := ipset.NewSyncer(f)
			old := ipset.Contents{}
			for i := range 300 {
				old[ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
			}
			sync(t, s, old, false)
			want := ipset.Contents{}
			for i := range 300 {
				want[ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
			}
			// Half the writes fail, whatever they are (a fixed seed): no
			// attempt can do everything, but each does about half of
			// what is left.
			rnd := rand.New(rand.NewPCG(1, 2))
			s = ipset.NewSyncer(fake.Wrap(f, func(fake.Call) error {
				if rnd.IntN(2) == 0 {
					return errors.New("injected")
				}
				return nil
			}))
			f.ResetCalls()
			attempts, rebuilt := 0, false
			for ; attempts < 40; attempts++ {
				if forget {
					s.Forget()
				}
				st, err := s.Sync(spec, want, forget)
				rebuilt = rebuilt || st.Rebuilt
				if err == nil {
					break
				}
			}
			if attempts == 40 {
				t.Fatalf("not converged after 40 attempts; sets %v", f.Names())
			}
			if !rebuilt {
				t.Errorf("converged without a rebuild: %v", f.Calls())
			}
			got := f.Entries(spec.Name)
			if len(got) != len(want) || !strings.HasPrefix(got[0], "10.97.") || !strings.HasPrefix(got[len(got)-1], "10.97.") {
				t.Errorf("the set holds %d entries (%v ... ), want the 300 of 10.97.0.0/16", len(got), got[:min(3, len(got))])
			}
			if names := f.Names(); len(names) != 1 {
				t.Errorf("sets left: %v, want only %s", names, spec.Name)
			}
			added := 0
			for _, c := range f.Writes() {
				if strings.HasPrefix(string(c), "Add "+ipset.TempName(spec.Name)+" ") {
					added += len(strings.Fields(string(c))) - 2
				}
			}
			t.Logf("converged after %d failed attempts; %d entries written to the temporary set for 300 wanted", attempts, added)
			if added > 2*len(want) {
				t.Errorf("%d entries written to the temporary set for %d wanted: the rebuild started again instead of resuming", added, len(want))
			}
		})
	}
}

// TestSyncerRebuildLeavesNoTemp: the temporary set is destroyed by a later
// sync when its destruction after the swap failed, whatever comes between:
// a Forget (the glue's retry), a rebuild of another capacity that finds
// the old set under the temporary name, a sync by difference.
func TestSyncerRebuildLeavesNoTemp(t *testing.T) {
	a, b := ipset.Contents{}, ipset.Contents{}
	for i := range 300 {
		a[ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
	}
	for i := range 10 {
		b[ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 97, 0, byte(i)}), Proto: ktypes.TCP, Port: 80}.Key()] = struct{}{}
	}
	small, big := spec, spec
	small.MaxElem, big.MaxElem = 4096, 8192
	tmp := ipset.TempName(spec.Name)
	// failDestroyAfterSwap fails the temporary set's destruction that
	// follows a swap.
	failDestroyAfterSwap := func(f *fake.Sets) {
		swapped := false
		f.InjectErrors(func(c fake.Call) error {
			if strings.HasPrefix(string(c), "Swap ") {
				swapped = true
			} else if swapped && string(c) == "Destroy "+tmp {
				return errors.New("injected")
			}
			return nil
		})
	}
	for _, tc := range []struct {
		name  string
		after func(t *testing.T, s *ipset.Syncer)
	}{
		{"then a sync by difference", func(t *testing.T, s *ipset.Syncer) {
			if _, err := s.Sync(big, a, false); err != nil {
				t.Fatal(err)
			}
		}},
		{"then Forget and a reread", func(t *testing.T, s *ipset.Syncer) {
			s.Forget()
			if _, err := s.Sync(big, a, true); err != nil {
				t.Fatal(err)
			}
		}},
		{"then a rebuild that finds the old capacity", func(t *testing.T, s *ipset.Syncer) {
			if _, err := s.Sync(big, b, false); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Sync(big, a, false); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fake.New()
			s := ipset.NewSyncer(f)
			if _, err := s.Sync(small, a, false); err != nil {
				t.Fatal(err)
			}
			failDestroyAfterSwap(f)
			if st, err := s.Sync(big, a, false); err == nil || !st.Rebuilt {
				t.Fatalf("the capacity rebuild: rebuilt %v, error %v; want rebuilt and the destruction's error", st.Rebuilt, err)
			}
			f.InjectErrors(nil)
			tc.after(t, s)
			if names := f.Names(); len(names) != 1 {
				t.Errorf("sets left: %v, want only %s", names, spec.Name)
			}
			if got := f.Entries(spec.Name); len(got) != len(a) {
				t.Errorf("the set holds %d entries, want %d", len(got), len(a))
			}
		})
	}
}

func TestSyncerErrors(t *testing.T) {
	t.Run("another type", func(t *testing.T) {
		f := fake.New()
		f.Put(ipset.Spec{Name: spec.Name, Type: ipset.HashIP, Family: ipset.IPv4})
		_, err := ipset.NewSyncer(f).Sync(spec, contents(), true)
		if !errors.Is(err, ipset.ErrMismatch) || !strings.Contains(err.Error(), "ipvs-proxy cleanup") {
			t.Errorf("got %v; want ErrMismatch with a remedy", err)
		}
	})
	t.Run("not owned", func(t *testing.T) {
		foreign := spec
		foreign.Name = "KUBE-CLUSTER-IP"
		f := fake.New()
		if _, err := ipset.NewSyncer(f).Sync(foreign, contents(), true); !errors.Is(err, ipset.ErrNotOwned) {
			t.Errorf("got %v; want ErrNotOwned", err)
		}
		if len(f.Calls()) != 0 {
			t.Errorf("calls on a foreign set: %v", f.Calls())
		}
	})
	t.Run("bad entry", func(t *testing.T) {
		if _, err := ipset.NewSyncer(fake.New()).Sync(spec, contents(ipset.Entry{Addr: netip.MustParseAddr("fd00::1"), Proto: ktypes.TCP, Port: 1}), false); err == nil {
			t.Error("an IPv6 entry was accepted into an IPv4 set")
		}
	})
	t.Run("a failed write makes the next sync reread", func(t *testing.T) {
		f := fake.New()
		s := ipset.NewSyncer(f)
		sync(t, s, contents(ep("10.96.0.1", 80)), false)
		f.InjectErrors(func(c fake.Call) error {
			if strings.HasPrefix(string(c), "Add") {
				return errors.New("injected")
			}
			return nil
		})
		if _, err := s.Sync(spec, contents(ep("10.96.0.1", 80), ep("10.96.0.2", 80)), false); err == nil {
			t.Fatal("no error")
		}
		f.InjectErrors(nil)
		f.ResetCalls()
		sync(t, s, contents(ep("10.96.0.1", 80), ep("10.96.0.2", 80)), false)
		if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.2,tcp:80"}, f.Calls()); diff != "" {
			t.Errorf("after a failure (-want +got):\n%s", diff)
		}
	})
}

func TestEntry(t *testing.T) {
	for _, tc := range []struct {
		typ  ipset.Type
		fam  ipset.Family
		e    ipset.Entry
		want string
		ok   bool
	}{
		{ipset.HashIP, ipset.IPv4, ipset.Entry{Addr: netip.MustParseAddr("10.0.0.1")}, "10.0.0.1", true},
		{ipset.HashIPPort, ipset.IPv6, ipset.Entry{Addr: netip.MustParseAddr("fd00::1"), Proto: ktypes.SCTP, Port: 9}, "fd00::1,sctp:9", true},
		{ipset.HashIPPortIP, ipset.IPv4, ipset.Entry{Addr: netip.MustParseAddr("10.0.0.1"), Proto: ktypes.UDP, Port: 53, Addr2: netip.MustParseAddr("10.0.0.2")}, "10.0.0.1,udp:53,10.0.0.2", true},
		{ipset.HashIPPortNet, ipset.IPv4, ipset.Entry{Addr: netip.MustParseAddr("10.0.0.1"), Proto: ktypes.TCP, Port: 80, Net: netip.MustParsePrefix("10.250.0.0/24")}, "10.0.0.1,tcp:80,10.250.0.0/24", true},
		{ipset.HashNet, ipset.IPv4, ipset.Entry{Net: netip.MustParsePrefix("10.0.0.0/8")}, "10.0.0.0/8", true},
		{ipset.BitmapPort, ipset.None, ipset.Entry{Port: 30000}, "30000", true},
		{ipset.HashNet, ipset.IPv4, ipset.Entry{Net: netip.MustParsePrefix("0.0.0.0/0")}, "0.0.0.0/0", false},
		{ipset.HashNet, ipset.IPv4, ipset.Entry{Net: netip.PrefixFrom(netip.MustParseAddr("10.0.0.1"), 8)}, "10.0.0.1/8", false},
		{ipset.HashIPPort, ipset.IPv4, ipset.Entry{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80}, "10.0.0.1,80", false},
		{ipset.HashIP, ipset.IPv4, ipset.Entry{Addr: netip.MustParseAddr("::ffff:10.0.0.1")}, "::ffff:10.0.0.1", false},
	} {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
		if err := tc.typ.Check(tc.fam, tc.e); (err == nil) != tc.ok {
			t.Errorf("%s %s: Check(%s) = %v, want ok=%v", tc.typ, tc.fam, tc.e, err, tc.ok)
		}
	}
}

// countsOf returns counts wanting each entry once.
func countsOf(es ...ipset.Entry) *ipset.Counts {
	c := ipset.NewCounts()
	for _, e := range es {
		c.Add(e.Key(), 1)
	}
	return c
}

// wholeReads counts how often a sync went through every wanted entry.
type wholeReads struct {
	*ipset.Counts
	n int
}

func (w *wholeReads) All() iter.Seq[ipset.Key] { w.n++; return w.Counts.All() }

// TestSyncerMirrored: synced to a Mirrored (the glue's Counts), the Syncer
// keeps no copy of the set: a sync without a reread writes the entries
// whose membership changed, at the cost of the change (it never goes
// through every wanted entry, and an entry that did not change is not
// re-added even if the kernel lost it: that is the reread's job). A count
// that changes without changing membership, or an entry that comes and
// goes between syncs, writes nothing. A failed write, or a want that is
// not the Mirrored, makes the next sync reread the set.
func TestSyncerMirrored(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	a, b, c, d := ep("10.96.0.1", 80), ep("10.96.0.2", 80), ep("10.96.0.3", 80), ep("10.96.0.4", 80)
	want := &wholeReads{Counts: countsOf(a, b)}
	step := func(name string, reread bool, calls ...fake.Call) ipset.Stats {
		t.Helper()
		f.ResetCalls()
		st, err := s.Sync(spec, want, reread)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(calls, f.Calls()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
		return st
	}
	step("first sync", false, "List IPVSP-CLUSTER-IP", "Create IPVSP-CLUSTER-IP hash:ip,port inet",
		"Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80 10.96.0.2,tcp:80")
	want.n = 0

	_ = f.Del(spec.Name, a) // drift, unseen until a reread
	want.Add(c.Key(), 1)
	want.Add(b.Key(), -1)
	want.Add(d.Key(), 1) // comes and goes
	want.Add(d.Key(), -1)
	if want.Pending() != 2 {
		t.Errorf("pending %d, want 2 (c and b)", want.Pending())
	}
	st := step("partial sync", false, "Add IPVSP-CLUSTER-IP 10.96.0.3,tcp:80", "Del IPVSP-CLUSTER-IP 10.96.0.2,tcp:80")
	if st.Added != 1 || st.Deleted != 1 || st.Reads != 0 {
		t.Errorf("stats %+v", st)
	}
	if want.Pending() != 0 {
		t.Errorf("pending %d after the sync, want 0", want.Pending())
	}
	want.Add(c.Key(), 1) // a second owner: membership unchanged
	step("count only", false)
	if want.n != 0 {
		t.Errorf("syncs without a reread went through every wanted entry %d times, want 0", want.n)
	}

	step("reread", true, "List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80")

	f.InjectErrors(func(c fake.Call) error {
		if strings.HasPrefix(string(c), "Add ") {
			return errors.New("injected")
		}
		return nil
	})
	want.Add(d.Key(), 1)
	if _, err := s.Sync(spec, want, false); err == nil {
		t.Fatal("a failed write reported no error")
	}
	f.InjectErrors(nil)
	_ = f.Del(spec.Name, c) // drift: the reread after the failure finds it
	step("after a failed write", false, "List IPVSP-CLUSTER-IP",
		"Add IPVSP-CLUSTER-IP 10.96.0.3,tcp:80 10.96.0.4,tcp:80")

	_ = f.Del(spec.Name, a)
	f.ResetCalls()
	if _, err := s.Sync(spec, contents(a, c, d), false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("a want that is not the Mirrored (-want +got):\n%s", diff)
	}
	if got := f.Entries(spec.Name); !cmp.Equal(got, []string{"10.96.0.1,tcp:80", "10.96.0.3,tcp:80", "10.96.0.4,tcp:80"}) {
		t.Errorf("set %v", got)
	}
}

// TestCounts: an entry is wanted while its count is above zero; Add
// reports membership changes; from the first Synced on, Held is what was
// wanted then and Changed the entries that differ from it.
func TestCounts(t *testing.T) {
	a, b := ep("10.96.0.1", 80).Key(), ep("10.96.0.2", 80).Key()
	c := ipset.NewCounts()
	if !c.Add(a, 1) || c.Add(a, 1) || c.Add(a, -1) || !c.Has(a) || c.Len() != 1 {
		t.Fatalf("counts of a: has %v len %d", c.Has(a), c.Len())
	}
	if c.Pending() != 0 {
		t.Errorf("changes recorded before the first Synced: %d", c.Pending())
	}
	c.Synced()
	if !c.Add(a, -1) || c.Has(a) || !c.Held(a) || c.Len() != 0 {
		t.Errorf("a dropped: has %v held %v len %d", c.Has(a), c.Held(a), c.Len())
	}
	if !c.Add(b, 1) || !c.Has(b) || c.Held(b) {
		t.Errorf("b added: has %v held %v", c.Has(b), c.Held(b))
	}
	got := slices.SortedFunc(c.Changed(), ipset.Key.Compare)
	if !cmp.Equal(got, []ipset.Key{a, b}, cmp.Comparer(func(x, y ipset.Key) bool { return x == y })) {
		t.Errorf("changed %v, want a and b", got)
	}
	c.Add(a, 1) // back to what was synced
	if c.Pending() != 1 || !c.Held(a) {
		t.Errorf("a back: pending %d held %v", c.Pending(), c.Held(a))
	}
	c.Synced()
	if c.Pending() != 0 || !c.Held(b) || !c.Held(a) {
		t.Errorf("after Synced: pending %d, held a %v b %v", c.Pending(), c.Held(a), c.Held(b))
	}
}

// TestSyncerSyncRead: a read made elsewhere since Track repairs the drift
// it shows; entries written since Track are taken from the view (the read
// is older than them), so they are neither undone nor written again. A set
// that the read did not find is created and filled; without Track the set
// is read again here.
func TestSyncerSyncRead(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	a, b, c, d := ep("10.96.0.1", 80), ep("10.96.0.2", 80), ep("10.96.0.3", 80), ep("10.96.0.4", 80)
	sync(t, s, contents(a, b), false)

	_ = f.Del(spec.Name, a) // drift
	s.Track(spec.Name)
	read, err := f.List(spec.Name) // the read, elsewhere: b
	if err != nil {
		t.Fatal(err)
	}
	// Meanwhile: c added, b deleted.
	if _, err := s.Sync(spec, contents(a, c), false); err != nil {
		t.Fatal(err)
	}
	_ = f.Add(spec.Name, d) // more drift, after the read: for the next one
	f.ResetCalls()
	st, err := s.SyncRead(spec, contents(a, c), read, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("repair (-want +got):\n%s", diff)
	}
	if st.Reads != 1 || st.Added != 1 || st.Deleted != 0 {
		t.Errorf("stats %+v", st)
	}

	// Not tracked: read again here (and d, the later drift, goes).
	f.ResetCalls()
	if _, err := s.SyncRead(spec, contents(a, c), read, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Del IPVSP-CLUSTER-IP 10.96.0.4,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("untracked (-want +got):\n%s", diff)
	}

	// The read found no set: created and filled.
	_ = f.Destroy(spec.Name)
	s.Track(spec.Name)
	f.ResetCalls()
	if _, err := s.SyncRead(spec, contents(a, c), ipset.Set{}, ipset.ErrNotFound); err != nil {
		t.Fatal(err)
	}
	if got := f.Entries(spec.Name); !cmp.Equal(got, []string{"10.96.0.1,tcp:80", "10.96.0.3,tcp:80"}) {
		t.Errorf("set after a read that found none: %v (calls %v)", got, f.Calls())
	}
}

// TestSyncerSyncReadMirrored: SyncRead with the glue's Counts: an entry
// written since Track is taken from what the Counts held at their last
// sync, the rest from the read, and the set ends mirrored again (a later
// sync without a reread writes only the change).
func TestSyncerSyncReadMirrored(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	a, b, c, d := ep("10.96.0.1", 80), ep("10.96.0.2", 80), ep("10.96.0.3", 80), ep("10.96.0.4", 80)
	want := countsOf(a, b)
	if _, err := s.Sync(spec, want, false); err != nil {
		t.Fatal(err)
	}
	_ = f.Del(spec.Name, a) // drift
	s.Track(spec.Name)
	read, err := f.List(spec.Name) // the read, elsewhere: b
	if err != nil {
		t.Fatal(err)
	}
	want.Add(c.Key(), 1) // meanwhile: c added, b deleted
	want.Add(b.Key(), -1)
	if _, err := s.Sync(spec, want, false); err != nil {
		t.Fatal(err)
	}
	_ = f.Add(spec.Name, d) // drift after the read: for the next one
	f.ResetCalls()
	if _, err := s.SyncRead(spec, want, read, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.1,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("repair (-want +got):\n%s", diff)
	}
	want.Add(b.Key(), 1)
	f.ResetCalls()
	if _, err := s.Sync(spec, want, false); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Call{"Add IPVSP-CLUSTER-IP 10.96.0.2,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("after the repair (-want +got):\n%s", diff)
	}
}

// TestSyncerWritesInChunks: a large difference is written in calls of at
// most 4,096 entries (a call's entries and messages are built at once);
// a failed call does not stop the others, and the next sync rereads the
// set and writes what is missing.
func TestSyncerWritesInChunks(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	want := ipset.NewCounts()
	for i := range 10_000 {
		want.Add(ipset.Entry{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Proto: ktypes.TCP, Port: 80}.Key(), 1)
	}
	calls := 0
	f.InjectErrors(func(c fake.Call) error {
		if !strings.HasPrefix(string(c), "Add ") {
			return nil
		}
		calls++
		if n := len(strings.Fields(string(c))) - 2; n > 4096 {
			t.Errorf("one call wrote %d entries", n)
		}
		if calls == 2 {
			return errors.New("injected")
		}
		return nil
	})
	if _, err := s.Sync(spec, want, false); err == nil {
		t.Fatal("a failed call reported no error")
	}
	f.InjectErrors(nil)
	if calls != 3 {
		t.Errorf("%d Add calls for 10,000 entries, want 3", calls)
	}
	if got := len(f.Entries(spec.Name)); got != 10_000-4096 {
		t.Errorf("%d entries after one of three calls failed, want %d", got, 10_000-4096)
	}
	f.ResetCalls()
	if _, err := s.Sync(spec, want, false); err != nil {
		t.Fatal(err)
	}
	if got := len(f.Entries(spec.Name)); got != 10_000 {
		t.Errorf("%d entries after the retry, want 10,000", got)
	}
	if c := f.Calls(); len(c) != 2 || c[0] != "List IPVSP-CLUSTER-IP" {
		t.Errorf("retry calls: %d, first %q; want a reread and one Add", len(c), c[0])
	}
}

// TestSyncerAnotherMirrored: a Mirrored that is not the one the set was
// synced to does not stand for the set: the Syncer rereads it.
func TestSyncerAnotherMirrored(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	a, b := ep("10.96.0.1", 80), ep("10.96.0.2", 80)
	if _, err := s.Sync(spec, countsOf(a), false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sync(spec, countsOf(b), false); err != nil {
		t.Fatal(err)
	}
	if got := f.Entries(spec.Name); !cmp.Equal(got, []string{"10.96.0.2,tcp:80"}) {
		t.Errorf("set %v, want only 10.96.0.2,tcp:80", got)
	}
}

// TestSyncerRefusedEntryDoesNotHoldDeletes: an entry the kernel refuses on
// its own fails the sync with that entry alone (RefusedEntries), the
// deletions of the same sync are made all the same (another owner's
// narrowed entries must not wait for it), the view is forgotten so the
// next sync rereads the set and writes the entry again, and a rebuild
// swaps its set in despite such a refusal.
func TestSyncerRefusedEntryDoesNotHoldDeletes(t *testing.T) {
	f := fake.New()
	s := ipset.NewSyncer(f)
	sync(t, s, contents(ep("10.96.0.1", 80), ep("10.96.0.2", 80)), false)
	refused := ep("10.96.0.9", 80)
	f.RefuseEntries(func(_ string, e ipset.Entry) error {
		if e == refused {
			return ipset.ErrSetFull
		}
		return nil
	})
	_, err := s.Sync(spec, contents(ep("10.96.0.2", 80), refused), false)
	if got, only := ipset.RefusedEntries(err); !only || len(got) != 1 || got[0].Entry != refused {
		t.Fatalf("sync error %v: refused %v (only refusals: %v), want %s alone", err, got, only, refused)
	}
	if diff := cmp.Diff([]string{"10.96.0.2,tcp:80"}, f.Entries(spec.Name)); diff != "" {
		t.Errorf("set after a refused add (-want +got): the deletion must be made\n%s", diff)
	}
	f.RefuseEntries(nil)
	f.ResetCalls()
	sync(t, s, contents(ep("10.96.0.2", 80), refused), false)
	if diff := cmp.Diff([]fake.Call{"List IPVSP-CLUSTER-IP", "Add IPVSP-CLUSTER-IP 10.96.0.9,tcp:80"}, f.Calls()); diff != "" {
		t.Errorf("the sync after a refusal (-want +got): reread, then the refused entry\n%s", diff)
	}

	// A rebuild (every entry changes) with a refused entry still swaps.
	var old, many []ipset.Entry
	for i := range 300 {
		old = append(old, ep(fmt.Sprintf("10.98.%d.%d", i/250, 1+i%250), 80))
		many = append(many, ep(fmt.Sprintf("10.97.%d.%d", i/250, 1+i%250), 80))
	}
	sync(t, s, contents(old...), false)
	f.RefuseEntries(func(_ string, e ipset.Entry) error {
		if e == many[7] {
			return ipset.ErrSetFull
		}
		return nil
	})
	st, err := s.Sync(spec, contents(many...), false)
	if _, only := ipset.RefusedEntries(err); !only || !st.Rebuilt {
		t.Fatalf("rebuild with a refused entry: rebuilt %v, error %v; want the swap and the refusal alone", st.Rebuilt, err)
	}
	if n := len(f.Entries(spec.Name)); n != 299 {
		t.Errorf("the rebuilt set holds %d entries, want the 299 taken", n)
	}
}
