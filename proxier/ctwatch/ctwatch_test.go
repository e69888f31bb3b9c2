package ctwatch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil"
)

// statFile is /proc/net/stat/nf_conntrack as Linux 6.1 writes it, two CPUs.
const statFile = `entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
000003fe  00000000 00000000 00000000 00000010 00000000 00000000 00000000 00000000 00000002 0000000a 00000001 00000000  00000000 00000000 00000000 00000000
000003fe  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 ffffffff 00000003 00000000  00000000 00000000 00000000 00000000
`

func TestParseStat(t *testing.T) {
	got, err := ParseStat(strings.NewReader(statFile))
	if err != nil {
		t.Fatal(err)
	}
	want := []Stats{{Drop: 10, EarlyDrop: 1, InsertFailed: 2}, {Drop: 0xffffffff, EarlyDrop: 3}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ParseStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "entries drop\n1 2\n", strings.Replace(statFile, "0000000a", "zz", 1)} {
		if _, err := ParseStat(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseStat(%q): no error", bad)
		}
	}
}

func TestProcReader(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"net/netfilter/nf_conntrack_count": "1020\n", "net/netfilter/nf_conntrack_max": "1024\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stat := filepath.Join(dir, "stat")
	if err := os.WriteFile(stat, []byte(statFile), 0o644); err != nil {
		t.Fatal(err)
	}
	r := ProcReader{Sysctls: netlinkutil.Sysctls{Root: dir}, StatFile: stat}
	s, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if s.Entries != 1020 || s.Max != 1024 || s.Total() != (Stats{Drop: 0xffffffff + 10, EarlyDrop: 4, InsertFailed: 2}) {
		t.Errorf("Read = %+v, total %+v", s, s.Total())
	}
	r.StatFile = filepath.Join(dir, "missing") // a kernel without CONFIG_NF_CONNTRACK_PROCFS
	if s, err := r.Read(); err != nil || s.Entries != 1020 || s.PerCPU != nil {
		t.Errorf("Read without the stat file = %+v, %v; want the fill, no counters", s, err)
	}
	r.StatFile = dir // unreadable as a file
	if _, err := r.Read(); err == nil || !strings.Contains(err.Error(), "conntrack counters") {
		t.Errorf("Read of a directory as the stat file: %v", err)
	}
	if _, err := NewProcReader(filepath.Join(dir, "none")).Read(); err == nil || !strings.Contains(err.Error(), "nf_conntrack loaded") {
		t.Errorf("Read without nf_conntrack: %v", err)
	}
}

// fakeReader returns its samples (or errors) in order, the last one again
// once they run out.
type fakeReader struct {
	samples []Sample
	errs    []error
	reads   int
}

func (f *fakeReader) Read() (Sample, error) {
	i := min(f.reads, len(f.samples)-1)
	f.reads++
	if f.errs[i] != nil {
		return Sample{}, f.errs[i]
	}
	return f.samples[i], nil
}

func (f *fakeReader) next(s Sample, err error) {
	f.samples = append(f.samples, s)
	f.errs = append(f.errs, err)
}

type fixture struct {
	r      *fakeReader
	clock  *clocktesting.FakeClock
	m      *Metrics
	events *record.FakeRecorder
	logs   *observer.ObservedLogs
	w      *Watcher
}

func newFixture() *fixture {
	core, logs := observer.New(zapcore.InfoLevel)
	f := &fixture{r: &fakeReader{}, clock: clocktesting.NewFakeClock(time.Unix(1e9, 0)), m: NewMetrics(nil),
		events: record.NewFakeRecorder(20), logs: logs}
	f.w = New(f.r, f.clock, 0, f.m, f.events, "node-1", zap.New(core))
	return f
}

// tick reads s, 5 s after the last read.
func (f *fixture) tick(s Sample) {
	f.r.next(s, nil)
	f.clock.Step(5 * time.Second)
	f.w.Tick()
}

func (f *fixture) event(t *testing.T) string {
	t.Helper()
	select {
	case e := <-f.events.Events:
		return e
	default:
		return ""
	}
}

func (f *fixture) dropped(reason string) float64 {
	return testutil.ToFloat64(f.m.Dropped.WithLabelValues(reason))
}

func sample(entries int, drops ...uint64) Sample {
	s := Sample{Entries: entries, Max: 1000}
	for _, d := range drops {
		s.PerCPU = append(s.PerCPU, Stats{Drop: d})
	}
	return s
}

// TestWatcherThresholds: pressure begins at 90% (a warning Event), grows
// when the kernel drops (another), holds between 80% and 90%, and ends
// below 80% with nothing dropped (a Normal Event); the metrics follow.
func TestWatcherThresholds(t *testing.T) {
	f := newFixture()
	steps := []struct {
		s        Sample
		pressure float64
		event    string
	}{
		{sample(500, 7, 3), 0, ""}, // the first read counts nothing
		{sample(899, 7, 3), 0, ""}, // below 90%
		{sample(900, 7, 3), 1, "Warning " + EventNearlyFull},
		{sample(1000, 9, 5), 1, "Warning " + EventDropping}, // 4 dropped
		{sample(1000, 9, 6), 1, ""},                         // still dropping: no new Event
		{sample(850, 9, 6), 1, ""},                          // between the thresholds: held
		{sample(799, 9, 6), 0, "Normal " + EventRecovered},
		{sample(799, 9, 6), 0, ""},
	}
	for i, st := range steps {
		f.tick(st.s)
		if got := testutil.ToFloat64(f.m.Pressure); got != st.pressure {
			t.Errorf("step %d (%d entries): pressure %v, want %v", i, st.s.Entries, got, st.pressure)
		}
		if got := f.event(t); !strings.HasPrefix(got, st.event) || (st.event == "") != (got == "") {
			t.Errorf("step %d: Event %q, want %q", i, got, st.event)
		}
		if got := testutil.ToFloat64(f.m.Entries); got != float64(st.s.Entries) {
			t.Errorf("step %d: entries %v", i, got)
		}
	}
	if got := f.dropped(reasonDrop); got != 5 {
		t.Errorf("dropped = %v, want 5 (2+2+1 while watched)", got)
	}
	if got := testutil.ToFloat64(f.m.Max); got != 1000 {
		t.Errorf("max = %v", got)
	}
	warns := f.logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 2 || !strings.Contains(warns[1].Message, "full: the kernel drops") {
		t.Fatalf("warnings: %+v", warns)
	}
	rec := f.logs.FilterMessageSnippet("below 80% again").All()
	if len(rec) != 1 || rec[0].ContextMap()["dropped"] != uint64(5) {
		t.Errorf("recovery log: %+v", rec)
	}
}

// TestWatcherEvictionIsPressure: an entry evicted for room (early_drop),
// with the table below 90%, is pressure too: the kernel made room by
// dropping a flow.
func TestWatcherEvictionIsPressure(t *testing.T) {
	f := newFixture()
	f.tick(Sample{Entries: 100, Max: 1000, PerCPU: []Stats{{EarlyDrop: 1, InsertFailed: 1}}})
	f.tick(Sample{Entries: 100, Max: 1000, PerCPU: []Stats{{EarlyDrop: 1, InsertFailed: 9}}})
	if got := testutil.ToFloat64(f.m.Pressure); got != 0 {
		t.Errorf("insert_failed alone (a clash) made pressure")
	}
	f.tick(Sample{Entries: 100, Max: 1000, PerCPU: []Stats{{EarlyDrop: 3, InsertFailed: 9}}})
	if got := f.event(t); !strings.Contains(got, EventDropping) {
		t.Errorf("Event %q, want %s", got, EventDropping)
	}
	if f.dropped(reasonEarlyDrop) != 2 || f.dropped(reasonInsertFailed) != 8 {
		t.Errorf("early_drop %v (want 2), insert_failed %v (want 8)", f.dropped(reasonEarlyDrop), f.dropped(reasonInsertFailed))
	}
	f.tick(Sample{Entries: 100, Max: 1000, PerCPU: []Stats{{EarlyDrop: 3, InsertFailed: 9}}})
	if got := f.event(t); !strings.Contains(got, EventRecovered) {
		t.Errorf("Event %q, want %s", got, EventRecovered)
	}
}

// TestWatcherClashDropIsNotPressure: a drop counted with an
// insert_failed (a lost insertion race, nf_ct_resolve_clash) is no sign of
// a full table: no warning, no Event, no pressure; the metric counts it.
// A drop beside it without its insert_failed is.
func TestWatcherClashDropIsNotPressure(t *testing.T) {
	f := newFixture()
	f.tick(Sample{Entries: 10, Max: 1000, PerCPU: []Stats{{Drop: 4, InsertFailed: 4}, {}}})
	f.tick(Sample{Entries: 10, Max: 1000, PerCPU: []Stats{{Drop: 5, InsertFailed: 5}, {Drop: 2, InsertFailed: 2}}})
	if got := testutil.ToFloat64(f.m.Pressure); got != 0 {
		t.Errorf("pressure %v after 3 clash drops, want 0", got)
	}
	if got := f.event(t); got != "" {
		t.Errorf("Event %q after clash drops, want none", got)
	}
	if n := f.logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 0 {
		t.Errorf("%d warnings after clash drops, want none", n)
	}
	if f.dropped(reasonDrop) != 3 || f.dropped(reasonInsertFailed) != 3 {
		t.Errorf("drop %v, insert_failed %v: want 3 each", f.dropped(reasonDrop), f.dropped(reasonInsertFailed))
	}
	f.tick(Sample{Entries: 10, Max: 1000, PerCPU: []Stats{{Drop: 7, InsertFailed: 6}, {Drop: 2, InsertFailed: 2}}})
	if got := f.event(t); !strings.Contains(got, EventDropping) {
		t.Errorf("Event %q after a drop without insert_failed, want %s", got, EventDropping)
	}
}

// TestWatcherCountersGoBack: after nf_conntrack is reloaded its counters
// start again from 0: the metric keeps growing by what they count anew,
// never back; a change in the number of CPUs counts nothing once.
func TestWatcherCountersGoBack(t *testing.T) {
	f := newFixture()
	f.tick(sample(10, 100, 200))
	f.tick(sample(10, 110, 200)) // +10
	f.tick(sample(10, 2, 1))     // reloaded: +3
	f.tick(sample(10, 4, 1))     // +2
	if got := f.dropped(reasonDrop); got != 15 {
		t.Errorf("dropped = %v, want 15", got)
	}
	f.tick(sample(10, 4, 1, 50)) // a CPU more: a new baseline
	f.tick(sample(10, 4, 1, 51)) // +1
	if got := f.dropped(reasonDrop); got != 16 {
		t.Errorf("dropped = %v, want 16", got)
	}
}

// TestWatcherRelogsWhilePressureLasts: the warning comes again with the
// figures once a minute while the table stays full, not at every read.
func TestWatcherRelogsWhilePressureLasts(t *testing.T) {
	f := newFixture()
	f.tick(sample(950, 1))
	for range 24 { // 2 minutes
		f.tick(sample(950, 1))
	}
	if n := f.logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 3 {
		t.Errorf("%d warnings over 2 minutes of pressure, want 3 (the first, then one a minute)", n)
	}
	if got := f.event(t); !strings.Contains(got, EventNearlyFull) || f.event(t) != "" {
		t.Errorf("Events: want one %s", EventNearlyFull)
	}
}

// TestWatcherReadErrors: a read that fails is logged once (again only when
// the error changes) and leaves the metrics as last read.
func TestWatcherReadErrors(t *testing.T) {
	f := newFixture()
	f.tick(sample(300, 1))
	gone := errors.New("no nf_conntrack")
	for range 3 {
		f.r.next(Sample{}, gone)
		f.w.Tick()
	}
	if n := f.logs.FilterMessageSnippet("cannot read").Len(); n != 1 {
		t.Errorf("%d warnings for one lasting error, want 1", n)
	}
	if got := testutil.ToFloat64(f.m.Entries); got != 300 {
		t.Errorf("entries %v after failed reads, want 300", got)
	}
	f.tick(sample(300, 1))
	f.r.next(Sample{}, gone)
	f.w.Tick()
	if n := f.logs.FilterMessageSnippet("cannot read").Len(); n != 2 {
		t.Errorf("%d warnings, want 2 (the error came back)", n)
	}
}
