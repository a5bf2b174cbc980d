package router

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestStaleReadsPreferClientZone(t *testing.T) {
	ms := members(3)
	ms[2].Zone = "b"
	tr := newTestRouter(t, Config{Members: ms, ClientZone: "a"})
	if c := tr.run(t, 100, StaleRead, flat(time.Millisecond)); c["m2"] != 0 || c["m0"] != 50 {
		t.Fatalf("stale reads = %v, want zone a only", c)
	}
	if c := tr.run(t, 99, LinearizableRead, flat(time.Millisecond)); c["m2"] != 33 {
		t.Fatalf("linearizable reads = %v, want all zones", c)
	}
	// An ejected member in another zone gets its probe share of
	// linearizable reads, never of stale ones, which stay in the zone.
	tr.eject(t, 2, slowMember("m2", 20*time.Millisecond, time.Millisecond))
	if c := tr.run(t, 5000, StaleRead, flat(time.Millisecond)); c["m2"] != 0 {
		t.Fatalf("stale reads = %v with m2 ejected, want zone a only", c)
	}
}

func TestOverrides(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	for range 5 {
		p, err := tr.Pick(WithMember(context.Background(), "m2"), Write)
		if err != nil || p.Member.ID != "m2" {
			t.Fatalf("WithMember: %v %v", p.Member.ID, err)
		}
		p.Done(OK)
		p, _ = tr.Pick(WithLeader(context.Background()), LinearizableRead)
		if p.Member.ID != "m0" {
			t.Fatalf("WithLeader went to %s", p.Member.ID)
		}
		p.Done(OK)
	}
	if _, err := tr.Pick(WithMember(context.Background(), "m9"), Write); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("unknown member: err = %v", err)
	}
}

func TestConcurrentPickAndProbe(t *testing.T) {
	r, err := New(Config{Members: members(3), Prober: &fakeCluster{leader: "m1", term: 1}, ProbeInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The invariants hold throughout, while probe rounds rebuild the view
	// under the picks: the pickers go on until the checker has checked
	// while they ran (on a loaded host it may not run for a while).
	const wantChecks = 10
	var checks atomic.Int64
	stop := make(chan struct{})
	checker := make(chan struct{})
	go func() {
		defer close(checker)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := r.checkInvariants(); err != nil {
				t.Error(err)
				return
			}
			checks.Add(1)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	var picked atomic.Uint64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 2000 || (checks.Load() < wantChecks && time.Now().Before(deadline)); i++ {
				p, err := r.Pick(context.Background(), Op(i%numOps))
				if err != nil {
					t.Error(err)
					return
				}
				if p.Index < 0 || p.Index >= 3 {
					t.Errorf("picked index %d of 3 members", p.Index)
				}
				p.Done(OK)
				picked.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-checker
	if n := checks.Load(); n < wantChecks {
		t.Fatalf("the invariants were checked %d times while the picks ran, want %d", n, wantChecks)
	}
	var total uint64
	for _, m := range r.Stats().Members {
		for _, n := range m.Ops {
			total += n
		}
	}
	if want := picked.Load(); total != want {
		t.Fatalf("counted %d ops, want %d", total, want)
	}
}

func TestUniform(t *testing.T) {
	r := &Router{}
	r.rnd.Store(7)
	r.seeded = true
	sum := 0.0
	for range 100000 {
		u := r.uniform()
		if u < 0 || u >= 1 {
			t.Fatalf("uniform() = %v", u)
		}
		sum += u
	}
	if mean := sum / 100000; math.Abs(mean-0.5) > 0.01 {
		t.Fatalf("mean %v, want 0.5", mean)
	}
}
