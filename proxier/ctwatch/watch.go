package ctwatch

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/ipvs-proxy/ipvs-proxy/proxier/model"
)

// Thresholds of the report: pressure begins at nearlyFull of the limit
// (or at any drop or eviction) and ends below clearBelow with nothing
// dropped since the last read.
const (
	nearlyFull = 0.90
	clearBelow = 0.80
	// DefaultPeriod is how often the table is read: three small files.
	DefaultPeriod = 5 * time.Second
	// relogEvery: while pressure lasts, the warning is logged again with
	// the figures at most this often.
	relogEvery = time.Minute
)

// The Events on the Node.
const (
	EventNearlyFull = "ConntrackTableNearlyFull"
	EventDropping   = "ConntrackTableFull"
	EventRecovered  = "ConntrackTableRecovered"
)

// level is how bad it is: none, nearly full, dropping.
type level int

const (
	levelNone level = iota
	levelNearlyFull
	levelDropping
)

// Watcher reads the table every period and reports pressure.
type Watcher struct {
	reader   Reader
	clock    clock.WithTicker
	period   time.Duration
	metrics  *Metrics
	log      *zap.Logger
	recorder record.EventRecorder
	node     string
	st       state
}

// state is what the watcher remembers between reads.
type state struct {
	last    []Stats // per CPU at the last read; nil before the first
	level   level   // the worst since pressure began
	since   time.Time
	dropped Stats // counted since pressure began
	logged  time.Time
	readErr string // the last read's error ("": it succeeded)
}

// New returns a watcher of node's table (Events go on the Node).
func New(reader Reader, clk clock.WithTicker, period time.Duration, metrics *Metrics, recorder record.EventRecorder,
	node string, log *zap.Logger) *Watcher {
	if period <= 0 {
		period = DefaultPeriod
	}
	return &Watcher{reader: reader, clock: clk, period: period, metrics: metrics, log: log, recorder: recorder, node: node}
}

// Run reads the table at once, then every period, until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := w.clock.NewTicker(w.period)
	defer t.Stop()
	w.Tick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			w.Tick()
		}
	}
}

// Tick reads the table once and reports what changed.
func (w *Watcher) Tick() {
	s, err := w.reader.Read()
	if err != nil {
		if err.Error() != w.st.readErr {
			w.log.Warn("cannot read the connection tracking table; its metrics stay as last read", zap.Error(err))
		}
		w.st.readErr = err.Error()
		return
	}
	w.st.readErr = ""
	d := w.deltas(s.PerCPU)
	lv := levelNone
	switch {
	case d.fullDrops() > 0 || d.EarlyDrop > 0:
		lv = levelDropping
	case s.Max > 0 && float64(s.Entries) >= nearlyFull*float64(s.Max):
		lv = levelNearlyFull
	}
	if lv != levelNone || w.st.level != levelNone {
		w.st.dropped = w.st.dropped.add(d) // what pressure cost, reported when it ends
	}
	switch {
	case lv > w.st.level:
		w.worse(s, lv)
	case lv != levelNone && w.clock.Since(w.st.logged) >= relogEvery:
		w.warn("the connection tracking table is still under pressure", s)
	case w.st.level != levelNone && lv == levelNone && float64(s.Entries) < clearBelow*float64(s.Max):
		w.recovered(s)
	}
	w.metrics.observe(s, d, w.st.level != levelNone)
}

// fullDrops is how many of d's drops the table being full explains. The
// kernel also counts a drop, with an insert_failed, when two packets of
// one new flow race to insert it and the loser cannot take the winner's
// entry (nf_ct_resolve_clash: typically a client's parallel UDP queries,
// such as DNS A and AAAA, from one socket): that is no pressure, and at a
// table 1% full it was reported as full (seen on the bed's node-2). A
// full table counts drop alone (the new entry is never allocated).
func (d Stats) fullDrops() uint64 {
	return d.Drop - min(d.Drop, d.InsertFailed)
}

// deltas is what each CPU's counters grew by since the last read. A
// counter lower than before was reset (nf_conntrack reloaded, or its 32
// bits wrapped): its whole value is new. Before the first read, and when
// the number of CPUs changes, nothing is counted.
func (w *Watcher) deltas(cur []Stats) Stats {
	last := w.st.last
	w.st.last = cur
	if last == nil || len(last) != len(cur) {
		return Stats{}
	}
	grew := func(c, l uint64) uint64 {
		if c >= l {
			return c - l
		}
		return c
	}
	var d Stats
	for i, c := range cur {
		d = d.add(Stats{Drop: grew(c.Drop, last[i].Drop), EarlyDrop: grew(c.EarlyDrop, last[i].EarlyDrop),
			InsertFailed: grew(c.InsertFailed, last[i].InsertFailed)})
	}
	return d
}

// worse reports pressure that began or grew: a warning and a Warning
// Event on the Node.
func (w *Watcher) worse(s Sample, lv level) {
	if w.st.level == levelNone {
		w.st.since = w.clock.Now()
	}
	w.st.level = lv
	reason, what := EventNearlyFull, "nearly full"
	if lv == levelDropping {
		reason, what = EventDropping, "full: the kernel drops or evicts connections"
	}
	msg := fmt.Sprintf("connection tracking table %s (%d of %d entries): new connections through Services may fail; raise nf_conntrack_max (conntrack.maxPerCore, conntrack.min) or find what opens so many", what, s.Entries, s.Max)
	w.warn(msg, s)
	w.recorder.Event(model.NodeRef(w.node), corev1.EventTypeWarning, reason, msg)
}

func (w *Watcher) warn(msg string, s Sample) {
	w.st.logged = w.clock.Now()
	w.log.Warn(msg, zap.Int("entries", s.Entries), zap.Int("max", s.Max), zap.Uint64("dropped", w.st.dropped.Drop),
		zap.Uint64("earlyDropped", w.st.dropped.EarlyDrop), zap.Uint64("insertFailed", w.st.dropped.InsertFailed),
		zap.Time("since", w.st.since))
}

// recovered reports the end of pressure: a log line and a Normal Event.
func (w *Watcher) recovered(s Sample) {
	msg := fmt.Sprintf("connection tracking table below %d%% again (%d of %d entries), nothing dropped since the last read", int(clearBelow*100), s.Entries, s.Max)
	w.log.Info(msg, zap.Int("entries", s.Entries), zap.Int("max", s.Max), zap.Uint64("dropped", w.st.dropped.Drop),
		zap.Uint64("earlyDropped", w.st.dropped.EarlyDrop), zap.Duration("lasted", w.clock.Since(w.st.since)))
	w.recorder.Event(model.NodeRef(w.node), corev1.EventTypeNormal, EventRecovered, msg)
	w.st.level, w.st.dropped = levelNone, Stats{}
}

// Start runs w in the background until ctx ends or stop is called; stop
// waits for it to end.
func (w *Watcher) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
