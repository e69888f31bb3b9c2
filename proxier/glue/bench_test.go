package glue

import (
	"fmt"
	"runtime"
	"testing"
)

// liveHeap is the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkGlueColdSync: the glue's first sync of n Services (a clusterIP
// and a node port each, one real server) into empty fake sets, and the
// heap the glue keeps afterwards per Service (its plans' set entries, the
// counts and whatever the set writer keeps; not the fake kernel's sets).
// `go test -run '^$' -bench GlueColdSync ./proxier/glue/`.
func BenchmarkGlueColdSync(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var kept uint64
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				bed := newBed(b, dualStack)
				for i := range n {
					p := service(i)
					bed.g.SetPlan(p.Service, p)
				}
				b.StartTimer()
				bed.sync(b, true)
				b.StopTimer()
				with := liveHeap()
				bed.g = nil
				kept = with - liveHeap()
				b.StartTimer()
			}
			b.ReportMetric(float64(kept)/float64(n), "kept-B/service")
		})
	}
}
