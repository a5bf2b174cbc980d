package router

import (
	"context"
	"testing"
	"time"
)

func TestHybridWritesToLeaderReadsSpread(t *testing.T) {
	tr := newTestRouter(t, Config{})
	writes := tr.run(t, 300, Write, flat(time.Millisecond))
	if writes["m0"] != 300 {
		t.Fatalf("writes = %v, want all 300 on leader m0", writes)
	}
	reads := tr.run(t, 300, LinearizableRead, flat(time.Millisecond))
	for _, m := range tr.roster().members {
		if reads[m.ID] != 100 {
			t.Fatalf("reads = %v, want 100 each", reads)
		}
	}
	if st := tr.Stats(); st.Leader != "m0" || st.Members[0].Ops[Write] != 300 || st.Fallbacks != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestRoundRobinSpreadsEverything(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	for _, op := range []Op{Write, LinearizableRead, StaleRead} {
		c := tr.run(t, 300, op, flat(time.Millisecond))
		if c["m0"] != 100 || c["m1"] != 100 || c["m2"] != 100 {
			t.Fatalf("%v: %v, want 100 each", op, c)
		}
	}
}

func TestLeaderOnly(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: LeaderOnly})
	if c := tr.run(t, 100, LinearizableRead, flat(time.Millisecond)); c["m0"] != 100 {
		t.Fatalf("reads = %v, want all on leader", c)
	}
}

func TestStickyStaysUntilUnreachable(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: Sticky, StickyMember: "m1"})
	if c := tr.run(t, 100, Write, flat(time.Millisecond)); c["m1"] != 100 {
		t.Fatalf("sticky writes = %v", c)
	}
	tr.cluster.set("m0", 1, "m1")
	tr.probeRound()
	tr.probeRound()
	c := tr.run(t, 100, LinearizableRead, flat(time.Millisecond))
	if len(c) != 1 || c["m1"] != 0 {
		t.Fatalf("after m1 went away: %v, want one other member", c)
	}
}

func TestBoltzmann(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: Boltzmann})
	lat := slowMember("m2", 5*time.Millisecond, time.Millisecond)
	tr.run(t, 500, Write, lat) // learn
	c := tr.run(t, 3000, Write, lat)
	// exp(-4ms/1ms) ≈ 1.8 % of the weight of each fast member.
	if share := float64(c["m2"]) / 3000; share > 0.03 {
		t.Fatalf("slow member share %.3f, want ≈ 0.009", share)
	}
	if c["m0"] < 1200 || c["m1"] < 1200 {
		t.Fatalf("fast members not shared: %v", c)
	}
	// Failures: after more than 3 in a row m0's weight is near zero.
	for range 4 {
		p, _ := tr.Pick(WithMember(context.Background(), "m0"), Write)
		p.Done(MemberFault)
	}
	if c := tr.run(t, 1000, Write, flat(time.Millisecond)); c["m0"] > 5 {
		t.Fatalf("failing m0 still picked %d times", c["m0"])
	}
}
