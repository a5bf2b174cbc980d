package router

import (
	"context"
	"testing"
	"time"
)

// The seed cases below are the defects the state-machine test was written
// for, each a plain regression test.

// Busy (etcd's Defragment) rebuilds the snapshot: it keeps the minority cap,
// and two at once never empty the pool (Pick divided by zero there).
func TestBusyKeepsMinorityCap(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.eject(t, 2, slowMember("m2", 30*time.Millisecond, time.Millisecond))
	end1 := tr.markBusy(1)
	if err := tr.checkInvariants(); err != nil {
		t.Fatalf("one ejected, one busy: %v", err)
	}
	end0 := tr.markBusy(0)
	if err := tr.checkInvariants(); err != nil {
		t.Fatalf("one ejected, two busy: %v", err)
	}
	for _, op := range []Op{Write, LinearizableRead, StaleRead, Stream} {
		p, err := tr.Pick(context.Background(), op)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(OK)
	}
	end0()
	end1()
	if err := tr.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// SetMembers keeps the cap too: a member added while one is ejected and
// two leave cannot put a majority out.
func TestSetMembersKeepsMinorityCap(t *testing.T) {
	tr := newTestRouter(t, Config{Members: members(5)})
	tr.run(t, 500, LinearizableRead, func(m Member) time.Duration {
		if m.ID == "m3" || m.ID == "m4" {
			return 30 * time.Millisecond
		}
		return time.Millisecond
	})
	tr.probeRound()
	if st := tr.Stats(); !st.Members[3].Ejected || !st.Members[4].Ejected {
		t.Fatalf("m3 and m4 not both ejected: %+v", st.Members)
	}
	if err := tr.SetMembers(members(5)[2:]); err != nil { // m0, m1 retired
		t.Fatal(err)
	}
	if err := tr.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// A member ejected for failures whose probes sit above the median by more
// than MinEjectGap but less than MinProbeEjectGap (the busy leader: 19 ms
// against 6 ms) comes back once its reads recover: probes that could not
// have ejected it do not keep it out.
func TestProbesBelowTheProbeRuleDoNotKeepAMemberOut(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		res, err := tr.cluster.Probe(ctx, m)
		res.RTT = 6 * time.Millisecond
		if m.ID == "m1" {
			res.RTT = 19 * time.Millisecond
		}
		return res, err
	})
	for range 10 {
		tr.probeRound()
	}
	tr.runOutcome(t, 300, LinearizableRead, func(m Member) (Outcome, time.Duration) {
		if m.ID == "m1" {
			return MemberFault, time.Millisecond
		}
		return OK, time.Millisecond
	})
	tr.probeRound()
	if m := tr.Stats().Members[1]; !m.Ejected || m.OutReason != outFailures {
		t.Fatalf("m1 not ejected for failures: %+v", m)
	}
	deadline := tr.clock.Now().Add(15 * time.Second)
	for tr.Stats().Members[1].Ejected {
		if tr.clock.Now().After(deadline) {
			t.Fatalf("m1 still out 15 s after its reads recovered: %+v", tr.Stats().Members[1])
		}
		tr.run(t, 1000, LinearizableRead, flat(time.Millisecond))
		tr.clock.Advance(250 * time.Millisecond)
		tr.probeRound()
	}
}

// A preference for a member added after the snapshot Pick loaded (SetMembers
// racing Pick) is a member not yet in the pool, not an index out of range.
func TestPreferenceForMemberNewerThanSnapshot(t *testing.T) {
	tr := newTestRouter(t, Config{})
	old := tr.snap.Load()
	if err := tr.SetMembers(members(4)); err != nil {
		t.Fatal(err)
	}
	tr.snap.Store(old) // as Pick sees it when SetMembers lands in between
	p, err := tr.Pick(WithPreferredMember(context.Background(), "m3"), LinearizableRead)
	if err != nil {
		t.Fatal(err)
	}
	if p.Index == 3 {
		t.Fatal("picked m3, which the snapshot does not have in its pool")
	}
	p.Done(OK)
}

// A pick taken back (NotSent) after a probe round recorded it does not make
// the failure window's count of reads wrap round to 2^64.
func TestNotSentAfterARoundKeepsTheWindowTrue(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	p, err := tr.Pick(context.Background(), LinearizableRead)
	if err != nil {
		t.Fatal(err)
	}
	// Rounds a window apart, so that the round that saw the pick is the
	// window's oldest when the next one comes.
	tr.clock.Advance(2 * tr.cfg.FailureWindow)
	tr.probeRound()
	p.Abandon()
	tr.clock.Advance(2 * tr.cfg.FailureWindow)
	tr.probeRound()
	for i, h := range tr.roster().health {
		if reads, fails, _ := h.window.delta(); reads > 1 || fails > 0 {
			t.Fatalf("member %d's window: %d reads, %d failures; want at most the one read picked", i, reads, fails)
		}
	}
}

// Ejection times double up to MaxEjection without overflowing, whatever
// BaseEjection is.
func TestLongBaseEjectionNeverOverflows(t *testing.T) {
	tr := newTestRouter(t, Config{BaseEjection: 20 * time.Second, MaxEjection: 10 * time.Minute})
	h := tr.roster().health[2]
	tr.mu.Lock()
	defer tr.mu.Unlock()
	prev := time.Duration(0)
	for k := 1; k <= 40; k++ {
		now := tr.clock.Now()
		tr.ejectLocked(h, now)
		d := h.ejectUntil.Sub(now)
		if d < 20*time.Second || d > 10*time.Minute || d < prev {
			t.Fatalf("ejection %d lasts %v (the one before %v), want within [20s, 10m] and not shorter", k, d, prev)
		}
		prev = d
	}
}

// The latency rule must hold EjectRounds rounds in a row: a member whose
// EWMA crosses the line at one round and not the next (a healthy member's
// tail) stays; one that stays above it leaves at the EjectRounds-th round.
func TestEjectRounds(t *testing.T) {
	tr := newTestRouter(t, Config{EjectRounds: 3})
	slow := slowMember("m2", 30*time.Millisecond, time.Millisecond)
	for k := range 10 { // above the line at every other round
		if k%2 == 0 {
			tr.run(t, 300, LinearizableRead, slow)
		} else {
			tr.run(t, 300, LinearizableRead, flat(time.Millisecond))
		}
		tr.probeRound()
		tr.expectNoneEjected(t, "by a rule that held one round in two")
	}
	for round := 1; round <= 3; round++ {
		tr.run(t, 300, LinearizableRead, slow)
		tr.probeRound()
		if got := tr.Stats().Members[2].Ejected; got != (round == 3) {
			t.Fatalf("after %d rounds above the line m2 ejected=%v, want ejected only at the third", round, got)
		}
	}
}
