package main

import "testing"

func TestGCPeak(t *testing.T) {
	log := `{"level":"info","msg":"starting ipvs-proxy"}
gc 1 @0.012s 2%: 0.010+1.2+0.003 ms clock, 0.020+0.5/1.1/0+0.006 ms cpu, 3->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P
gc 2 @3.500s 5%: 0.1+20+0.01 ms clock, 0.2+1/10/0+0.02 ms cpu, 90->95->60 MB, 92 MB goal, 0 MB stacks, 0 MB globals, 2 P
gc 3 @9.000s 4%: 0.1+20+0.01 ms clock, 0.2+1/10/0+0.02 ms cpu, 80->81->44 MB, 120 MB goal, 0 MB stacks, 0 MB globals, 2 P
{"level":"info","msg":"synced"}`
	got := gcPeak(log)
	want := gcSummary{collections: 3, peakHeap: 90, peakGoal: 120, peakAt: 3.5, lastLive: 44}
	if got != want {
		t.Fatalf("gcPeak = %+v, want %+v", got, want)
	}
	if g := gcPeak(`{"msg":"no trace"}`); g.collections != 0 {
		t.Fatalf("gcPeak of a log without collections = %+v", g)
	}
}
