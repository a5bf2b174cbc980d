package router

import (
	"context"
	"maps"
	"sync/atomic"
	"testing"
	"time"
)

// newCadenceRouter is a test router with the adaptive cadence on (probe
// interval 250 ms, stable interval 10 s) whose background loop has stopped:
// the test drives every round through round.
func newCadenceRouter(t *testing.T) testRouter {
	t.Helper()
	tr := newTestRouter(t, Config{})
	tr.cancel()
	<-tr.done
	tr.cfg.ProbeInterval, tr.cfg.StableProbeInterval = 250*time.Millisecond, 10*time.Second
	return tr
}

// tick advances the clock one probe interval and runs a round, as the
// background loop does; forced when a Refresh was asked for meanwhile.
func (tr testRouter) tick() (probed bool) {
	tr.clock.Advance(tr.cfg.ProbeInterval)
	forced := false
	select {
	case <-tr.refreshc:
		forced = true
	default:
	}
	before := tr.cluster.probes()
	tr.round(context.Background(), forced)
	return tr.cluster.probes() > before
}

func (f *fakeCluster) probes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// settle ticks until the router is settled, and fails past a bound.
func (tr testRouter) settle(t *testing.T) {
	t.Helper()
	for range 4 * settleRounds {
		if tr.settled.Load() {
			return
		}
		tr.tick()
	}
	t.Fatalf("not settled after %d rounds on a quiet cluster", 4*settleRounds)
}

// expectUnsettled fails unless the router has left the settled cadence and
// probes at the next tick.
func (tr testRouter) expectUnsettled(t *testing.T, why string) {
	t.Helper()
	if tr.settled.Load() {
		t.Fatal("still settled " + why)
	}
	if !tr.tick() {
		t.Fatal("not probing at the fast rate " + why)
	}
}

// Settled and idle, a round probes the leader (whose answer shows a leader
// change) and each follower only every DefaultIdleProbeRounds rounds.
func TestSettledRouterProbesRarely(t *testing.T) {
	tr := newCadenceRouter(t)
	before, after := tr.settledFor(t, 10*time.Minute, func() {})
	// One round per 8–12 s (the jitter), give or take the one under way,
	// for the leader; one in DefaultIdleProbeRounds of those for a follower.
	lo, hi := 600/12, 600/8+1
	for id, want := range map[string][2]int{"m0": {lo, hi}, "m1": {lo / DefaultIdleProbeRounds, hi/DefaultIdleProbeRounds + 1}, "m2": {lo / DefaultIdleProbeRounds, hi/DefaultIdleProbeRounds + 1}} {
		if n := after[id] - before[id]; n < want[0] || n > want[1] {
			t.Errorf("%s probed %d times in 10 minutes settled, want %d–%d", id, n, want[0], want[1])
		}
	}
	t.Logf("probes in 10 minutes settled: %v", tr.cluster.probesOf())
}

// settledFor settles the router, then ticks for d, calling each before
// every tick, and returns the probes per member before and after.
func (tr testRouter) settledFor(t *testing.T, d time.Duration, each func()) (before, after map[string]int) {
	t.Helper()
	tr.settle(t)
	start := tr.clock.Now()
	before = tr.cluster.probesOf()
	for tr.clock.Now().Sub(start) < d {
		each()
		tr.tick()
	}
	return before, tr.cluster.probesOf()
}

// With IdleProbeRounds negative, a settled idle router probes the leader
// alone.
func TestIdleMembersUnprobedWhenAsked(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.cfg.IdleProbeRounds = -1
	before, after := tr.settledFor(t, 10*time.Minute, func() {})
	if after["m0"]-before["m0"] < 600/12 || after["m1"] != before["m1"] || after["m2"] != before["m2"] {
		t.Fatalf("probes in 10 minutes settled: before %v, after %v; want the leader's alone", before, after)
	}
}

func (f *fakeCluster) probesOf() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.byID)
}

// A follower that serves calls is probed every settled round: its reads
// depend on its lag and its leader.
func TestSettledRouterProbesFollowersInUse(t *testing.T) {
	tr := newCadenceRouter(t)
	before, after := tr.settledFor(t, 10*time.Minute, func() {
		p, err := tr.Pick(WithMember(context.Background(), "m1"), StaleRead)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(OK)
	})
	if !tr.settled.Load() {
		t.Fatal("reads in line unsettled the router")
	}
	leader, inUse, idle := after["m0"]-before["m0"], after["m1"]-before["m1"], after["m2"]-before["m2"]
	if inUse != leader || idle > leader/DefaultIdleProbeRounds+1 {
		t.Fatalf("probes in 10 minutes settled: leader %d, follower in use %d (want the leader's), idle follower %d (want a third of it)", leader, inUse, idle)
	}
}

// A settled round that probes the leader alone must not read the
// followers' old applied indexes against its new commit index as lag.
func TestLeaderAloneProbedShowsNoLag(t *testing.T) {
	tr := newCadenceRouter(t)
	var commit atomic.Uint64
	tr.withProbe(func(m Member, res *ProbeResult) {
		c := commit.Add(500) // 500 entries committed between any two probes
		res.Committed, res.Applied = c, c
	})
	tr.settle(t)
	start := tr.clock.Now()
	for tr.clock.Now().Sub(start) < 2*time.Minute {
		tr.tick()
		if s := tr.Stats(); !s.Settled {
			t.Fatalf("unsettled after %v settled, members %+v", tr.clock.Now().Sub(start), s.Members)
		}
	}
}

func TestEvidenceUnsettles(t *testing.T) {
	cases := []struct {
		name string
		act  func(tr testRouter)
	}{
		{"failed read", func(tr testRouter) {
			p, _ := tr.Pick(context.Background(), LinearizableRead)
			p.Done(MemberFault)
		}},
		{"failed write", func(tr testRouter) {
			p, _ := tr.Pick(context.Background(), Write)
			p.Done(MemberFault)
		}},
		{"newer term", func(tr testRouter) { tr.observeTerm(2) }},
		{"Unsettle", func(tr testRouter) { tr.unsettle() }},
		{"membership change", func(tr testRouter) {
			if err := tr.SetMembers(members(4)); err != nil {
				panic(err)
			}
		}},
		{"maintenance", func(tr testRouter) { tr.markBusy(1) }},
		{"write cut by its caller", func(tr testRouter) {
			p, _ := tr.Pick(context.Background(), Write)
			p.Done(CallerGaveUp)
		}},
		{"read cut far above the median", func(tr testRouter) {
			p, _ := tr.Pick(WithMember(context.Background(), "m1"), LinearizableRead)
			tr.clock.Advance(time.Second)
			p.Done(CallerGaveUp)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newCadenceRouter(t)
			tr.run(t, 100, LinearizableRead, func(Member) time.Duration { return time.Millisecond })
			tr.settle(t)
			c.act(tr)
			if !tr.tick() {
				t.Fatal("no probe round at the next tick")
			}
			tr.expectUnsettled(t, "after the evidence")
		})
	}
}

func TestNoEvidenceKeepsCadence(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.settle(t)
	tr.observeTerm(1) // the term the probes know
	p, _ := tr.Pick(context.Background(), LinearizableRead)
	p.Done(OK)
	p, _ = tr.Pick(context.Background(), Write)
	p.Done(AppError)
	if tr.tick() || !tr.settled.Load() {
		t.Fatal("a probe round, or unsettled, without evidence")
	}
}

// A member that holds reads and answers none shows no failure until its
// callers give up: that it stalls is evidence.
func TestStalledMemberUnsettles(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.settle(t)
	p, _ := tr.Pick(WithMember(context.Background(), "m2"), LinearizableRead)
	defer p.Done(NotSent)
	probed := false
	for range stallTicks + 1 {
		probed = probed || tr.tick()
	}
	tr.expectUnsettled(t, "with a read held for three rounds")
}

func TestLeaderChangeSeenWhileSettled(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.settle(t)
	tr.cluster.set("m1", 2)
	start := tr.clock.Now()
	for tr.Stats().Leader != "m1" {
		if tr.clock.Now().Sub(start) > 12*time.Second+tr.cfg.ProbeInterval {
			t.Fatal("an idle settled router missed a leader change for longer than its stable interval")
		}
		tr.tick()
	}
	// The round that saw it probed the old leader alone: the others' older
	// answers (the old term) bench nobody.
	for _, m := range tr.Stats().Members {
		if m.OutReason != "" {
			t.Fatalf("%s out of the pool (%s) on an answer older than the leader's", m.Member.ID, m.OutReason)
		}
	}
	if tr.settled.Load() {
		t.Fatal("settled right after a leader change")
	}
}

func TestCadenceOffAtOrBelowProbeInterval(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.cfg.StableProbeInterval = tr.cfg.ProbeInterval
	for range 4 * settleRounds {
		if !tr.tick() {
			t.Fatal("a round without probes with the cadence off")
		}
	}
}

// A member whose reads its callers (or hedges) keep cutting, near the
// median and so no censored sample, and that answers none, stalls too.
func TestMemberAnsweringNoneUnsettles(t *testing.T) {
	tr := newCadenceRouter(t)
	tr.run(t, 100, LinearizableRead, flat(time.Millisecond))
	tr.settle(t)
	for range stallTicks + 1 {
		p, _ := tr.Pick(WithMember(context.Background(), "m2"), LinearizableRead)
		tr.clock.Advance(time.Millisecond)
		p.Done(CallerGaveUp)
		tr.tick()
	}
	tr.expectUnsettled(t, "with a member that answered no read for three rounds")
}

// A client that idles after a few slow reads on one member, short of an
// ejection, still settles: a run of slow rounds is held over rounds without
// reads for EjectRounds of them at most, and a held run keeps the router
// unsettled.
func TestIdleAfterSlowReadsSettles(t *testing.T) {
	tr := newTestRouter(t, Config{EjectRounds: 3})
	tr.cancel()
	<-tr.done
	tr.cfg.ProbeInterval, tr.cfg.StableProbeInterval = 250*time.Millisecond, 10*time.Second
	tr.run(t, 300, LinearizableRead, flat(2*time.Millisecond))
	tr.tick()
	tr.run(t, 60, LinearizableRead, slowMember("m2", 50*time.Millisecond, 2*time.Millisecond))
	tr.tick()
	tr.mu.Lock()
	run := tr.roster().health[2].slowReadRounds
	tr.mu.Unlock()
	if run != 1 {
		t.Fatalf("m2's slow run is %d after one round of slow reads, want 1", run)
	}
	tr.settle(t)
	tr.expectNoneEjected(t, "idle after one slow round")
}
