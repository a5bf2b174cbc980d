package sim

import (
	"testing"
	"time"

	"github.com/oproute/oproute/router"
)

// BenchmarkSaturated runs the default layout at 128 workers, 80/20, with a
// real server's noise; b.N is the operations run. wall-s/sim-hour is the
// wall time a simulated hour of that load takes.
func BenchmarkSaturated(b *testing.B) {
	for _, policy := range []string{router.Hybrid, router.LeastCost} {
		b.Run(policy, func(b *testing.B) {
			b.ReportAllocs()
			start := time.Now()
			out, err := Run(b.Context(), router.Config{Policy: policy}, noisy(50*time.Millisecond), Workload{Workers: 128, ReadRatio: 0.8, Ops: max(b.N, 1000)}, 1)
			if err != nil {
				b.Fatal(err)
			}
			wall := time.Since(start)
			b.ReportMetric(wall.Seconds()*float64(time.Hour)/float64(out.Elapsed), "wall-s/sim-hour")
		})
	}
}

// BenchmarkIdleFleet: 10,000 idle clients probing a 3-member cluster for
// a simulated minute, once per iteration.
func BenchmarkIdleFleet(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(b.Context(), router.Config{Policy: router.Hybrid}, twoZones(), Workload{Clients: 10_000, Duration: time.Minute}, 1); err != nil {
			b.Fatal(err)
		}
	}
}
