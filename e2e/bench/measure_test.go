package main

import (
	"strings"
	"testing"
)

func TestDiffCount(t *testing.T) {
	for _, c := range []struct {
		a, b []string
		want int
	}{
		{nil, nil, 0},
		{[]string{"x", "y"}, []string{"y", "x"}, 0},
		{[]string{"x", "x"}, []string{"x"}, 1},
		{[]string{"x"}, []string{"y"}, 2},
	} {
		if got := diffCount(c.a, c.b); got != c.want {
			t.Errorf("diffCount(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestInFullSync reads ipvs-proxy's log lines (end time and duration of
// each sync) and counts only times inside a full one.
func TestInFullSync(t *testing.T) {
	log := `{"level":"info","ts":100.5,"caller":"proxier/proxier.go:675","msg":"synced","kind":"full","services":3,"failed":0,"writes":0,"reads":9,"ipvs":0.2,"took":10.5}
{"level":"debug","ts":120,"caller":"proxier/proxier.go:675","msg":"synced","kind":"partial","services":1,"failed":0,"writes":2,"reads":1,"ipvs":0.01,"took":5}
`
	if got := inFullSync(log, []float64{89, 90.5, 95, 100.5, 101, 117}); got != 3 {
		t.Errorf("inFullSync = %d, want 3 (90.5, 95, 100.5)", got)
	}
}

// TestFullSyncLines keeps the lines of full syncs, of the glue's whole
// syncs and checks and of resyncs' ends, and drops partial syncs.
func TestFullSyncLines(t *testing.T) {
	log := `{"level":"info","ts":1,"msg":"synced","kind":"full","services":3,"ipvs":0.2,"read":0.1,"consumers":0.01,"took":0.3}
{"level":"debug","ts":2,"msg":"synced","kind":"partial","services":1,"ipvs":0.01,"took":0.02}
{"level":"info","ts":3,"msg":"iptables glue synced","full":true,"setRead":1,"took":2}
{"level":"debug","ts":4,"msg":"iptables glue synced","full":false,"took":0.001}
{"level":"info","ts":5,"msg":"iptables glue checked","setRead":1,"readTook":2,"took":0.1}
{"level":"info","ts":6,"msg":"full resync complete","took":0.5}
`
	got := fullSyncLines(log)
	if len(got) != 4 || !strings.Contains(got[0], `"kind":"full"`) || !strings.Contains(got[1], `"full":true`) ||
		!strings.Contains(got[2], "checked") || !strings.Contains(got[3], "resync complete") {
		t.Errorf("fullSyncLines = %q", got)
	}
}
