package router

import (
	"context"
	"strings"
	"testing"
	"time"
)

// BenchmarkPick measures Pick + Done for every policy on the 80/20 mix, in
// parallel so that contention on the shared counters shows with -cpu 1,2;
// "+metrics" with the Prometheus collector on (a histogram observation per
// read).
func BenchmarkPick(b *testing.B) {
	for _, name := range append(Policies(), Hybrid+"+metrics", RoundRobin+"+metrics") {
		policy, metrics := strings.CutSuffix(name, "+metrics")
		b.Run(name, func(b *testing.B) {
			r, err := New(Config{Members: members(3), Policy: policy, Prober: &fakeCluster{leader: "m0", term: 1}, ProbeInterval: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			if metrics {
				r.Collector()
			}
			for r.rounds.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					op := LinearizableRead
					if i%5 == 0 {
						op = Write
					}
					i++
					p, err := r.Pick(ctx, op)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(OK)
				}
			})
		})
	}
}
