package router

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

// BenchmarkPick measures Pick + Done for every policy on the 80/20 mix, in
// parallel so that contention on the shared counters shows with -cpu 1,2;
// "+metrics" with the Prometheus collector on (a histogram observation per
// read and write), "+p2c" with LoadAware, "+hedge" with hedging configured (the pick
// and completion side of it: the slot lookup and the latency ring; the
// race itself is a backend's call).
func BenchmarkPick(b *testing.B) {
	for _, name := range append(Policies(), Hybrid+"+metrics", RoundRobin+"+metrics", Hybrid+"+p2c", Hybrid+"+hedge") {
		policy, metrics := strings.CutSuffix(name, "+metrics")
		cfg := Config{Members: members(3), Prober: &fakeCluster{leader: "m0", term: 1}, ProbeInterval: time.Hour}
		switch policy {
		case Hybrid + "+p2c":
			policy, cfg.LoadAware = Hybrid, true
		case Hybrid + "+hedge":
			policy, cfg.Hedge = Hybrid, &HedgeConfig{Enabled: true}
		}
		cfg.Policy = policy
		b.Run(name, func(b *testing.B) {
			r, err := New(cfg)
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

// TestPickDoesNotAllocate: Pick and Done allocate nothing under any
// policy, for every pair of class and outcome (a pointer handed to a
// policy through its interface would escape, and every operation would
// pay for it). Not covered: probe-share picks (no member is ejected here)
// and hedges' slots (a backend's call).
func TestPickDoesNotAllocate(t *testing.T) {
	for _, name := range append(Policies(), HybridP2C, HybridHedge) {
		cfg := Config{Members: members(3), Prober: &fakeCluster{leader: "m0", term: 1}, ProbeInterval: time.Hour, Policy: name}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Poll(t, 5*time.Second, "the first probe round", func() bool { return r.rounds.Load() > 0 })
		// The probe loop ends before the count: it runs a forced round
		// when a pick unsettles the router, and that round allocates (1
		// allocation per run, once in a whole-suite run beside two others).
		r.cancel()
		<-r.done
		ctx := context.Background()
		outcomes := []Outcome{OK, AppError, MemberFault, Overloaded, CallerGaveUp, NotSent}
		// The least of three counts: the count is of the whole process's
		// allocations, and an allocation in Pick or Done is in every one.
		allocs := math.Inf(1)
		for range 3 {
			allocs = min(allocs, testing.AllocsPerRun(100, func() {
				for op := range Op(numOps) {
					for _, o := range outcomes {
						p, err := r.Pick(ctx, op)
						if err != nil {
							t.Fatal(err)
						}
						if o == MemberFault && p.leaderPinned {
							// Forgets the leader, rebuilding the snapshot by
							// design; and with no probe loop to find it again,
							// no later pick would be leader-pinned.
							o = Overloaded
						}
						p.Done(o)
					}
				}
			}))
		}
		leader := r.snap.Load().leader
		r.Close()
		if leader < 0 {
			t.Errorf("%s: the leader was forgotten during the count: its pinned picks went uncounted", name)
		}
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Pick and Done, want 0", name, allocs)
		}
	}
}
