package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// runOutcome issues n operations of class op; outcome says how each ended
// at each member and how long it took there.
func (tr testRouter) runOutcome(t *testing.T, n int, op Op, outcome func(Member) (Outcome, time.Duration)) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		p, err := tr.Pick(context.Background(), op)
		if err != nil {
			t.Fatal(err)
		}
		counts[p.Member.ID]++
		o, d := outcome(p.Member)
		tr.clock.Advance(d)
		p.Done(o)
	}
	return counts
}

// withProbe replaces the test cluster's probe answer for one member.
func (tr testRouter) withProbe(edit func(m Member, res *ProbeResult)) {
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		res, err := tr.cluster.Probe(ctx, m)
		edit(m, &res)
		return res, err
	})
}

func TestCensoredReadsEjectMemberBeyondDeadline(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// m1 never answers within the callers' 60 ms deadline: not one
	// successful sample ever arrives from it.
	beyond := func(m Member) (Outcome, time.Duration) {
		if m.ID == "m1" {
			return CallerGaveUp, 60 * time.Millisecond
		}
		return OK, time.Millisecond
	}
	tr.runOutcome(t, 300, LinearizableRead, beyond)
	tr.probeRound() // learns the median
	tr.runOutcome(t, 300, LinearizableRead, beyond)
	tr.probeRound()
	m := tr.Stats().Members[1]
	if !m.Ejected || m.OutReason != outLatency {
		t.Fatalf("member beyond the deadline not ejected: %+v", m)
	}
	if m.ReadLatency < 30*time.Millisecond {
		t.Fatalf("censored reads left the estimate at %v", m.ReadLatency)
	}
}

func TestShortCallerDeadlinePunishesNobody(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 300, LinearizableRead, flat(3*time.Millisecond))
	tr.probeRound()
	// Now every caller gives up after 1 ms, at every member alike.
	for range 5 {
		tr.runOutcome(t, 300, LinearizableRead, func(Member) (Outcome, time.Duration) { return CallerGaveUp, time.Millisecond })
		tr.probeRound()
	}
	tr.expectNoneEjected(t, "for callers' short deadlines")
}

func TestConsecutiveFailuresEject(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 60, LinearizableRead, flat(time.Millisecond))
	tr.probeRound()
	// m2 fails fast: its failures are quicker than the others' successes,
	// so latency alone would keep it.
	tr.runOutcome(t, 30, LinearizableRead, func(m Member) (Outcome, time.Duration) {
		if m.ID == "m2" {
			return MemberFault, 100 * time.Microsecond
		}
		return OK, time.Millisecond
	})
	tr.probeRound()
	m := tr.Stats().Members[2]
	if !m.Ejected || m.OutReason != outFailures {
		t.Fatalf("fast-failing member not ejected: %+v", m)
	}
	// Still failing, with probe rounds going on: it stays out.
	toM2 := 0
	for range 20 {
		c := tr.runOutcome(t, 1000, LinearizableRead, func(m Member) (Outcome, time.Duration) {
			if m.ID == "m2" {
				return MemberFault, 100 * time.Microsecond
			}
			return OK, time.Millisecond
		})
		toM2 += c["m2"]
		tr.probeRound()
	}
	if share := float64(toM2) / 20000; share > 0.01 {
		t.Fatalf("failing member still gets %.2f%% of reads", 100*share)
	}
}

func TestFailureShareEjects(t *testing.T) {
	tr := newTestRouter(t, Config{ProbeInterval: 250 * time.Millisecond})
	// m2 fails every other read: never 5 in a row, but half its reads.
	n := 0
	half := func(m Member) (Outcome, time.Duration) {
		if m.ID == "m2" {
			n++
			if n%2 == 0 {
				return MemberFault, time.Millisecond
			}
		}
		return OK, time.Millisecond
	}
	for range 4 {
		tr.runOutcome(t, 150, LinearizableRead, half)
		tr.probeRound()
	}
	m := tr.Stats().Members[2]
	if !m.Ejected || m.OutReason != outFailures {
		t.Fatalf("member failing half its reads not ejected: %+v", m)
	}
	if tr.Stats().Members[0].Ejected || tr.Stats().Members[1].Ejected {
		t.Fatal("healthy members ejected")
	}
}

func TestProbeEvidenceBenchesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(res *ProbeResult)
		why  string
	}{
		{"no leader", func(res *ProbeResult) { res.LeaderID, res.Leaderless = "", true }, outNoLeader},
		{"older term", func(res *ProbeResult) { res.Term = 1; res.LeaderID = "sid-m0" }, outOldTerm},
		{"apply lag", func(res *ProbeResult) { res.Committed, res.Applied = 10000, 5000 }, outLag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestRouter(t, Config{})
			tr.cluster.set("m0", 2)
			bad := true
			tr.withProbe(func(m Member, res *ProbeResult) {
				res.Committed, res.Applied = 10000, 10000
				if m.ID == "m1" && bad {
					tc.edit(res)
				}
			})
			tr.probeRound()
			m := tr.Stats().Members[1]
			if !m.Ejected || m.OutReason != tc.why {
				t.Fatalf("not out of the pool on its probe: %+v", m)
			}
			// No probe share: its reads would fail.
			if c := tr.run(t, 5000, LinearizableRead, flat(time.Millisecond)); c["m1"] != 0 {
				t.Fatalf("benched m1 got %d reads", c["m1"])
			}
			if st := tr.Stats(); st.Leader != "m0" || !tr.Backend().Serves(0) || tr.Backend().Serves(1) {
				t.Fatalf("leader %q, serves(0)=%v serves(1)=%v", st.Leader, tr.Backend().Serves(0), tr.Backend().Serves(1))
			}
			bad = false
			tr.probeRound()
			if m := tr.Stats().Members[1]; m.Ejected {
				t.Fatalf("not back after its probes recovered: %+v", m)
			}
		})
	}
}

func TestBenchingNeverEmptiesPool(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.withProbe(func(_ Member, res *ProbeResult) { res.LeaderID, res.Leaderless = "", true })
	tr.probeRound()
	if c := tr.run(t, 30, LinearizableRead, flat(time.Millisecond)); len(c) != 3 {
		t.Fatalf("every member leaderless: reads %v, want all members kept", c)
	}
}

func TestSlowProbesEject(t *testing.T) {
	for _, policy := range []string{Hybrid, LeastCost} {
		t.Run(policy, func(t *testing.T) {
			tr := newTestRouter(t, Config{Policy: policy})
			tr.run(t, 300, LinearizableRead, flat(time.Millisecond))
			tr.probeRTTs(slowMember("m1", 160*time.Millisecond, time.Millisecond))
			for range minProbeSamples {
				tr.refreshSequential()
			}
			if m := tr.Stats().Members[1]; !m.Ejected || m.OutReason != outProbeRTT {
				t.Fatalf("member with 160 ms probes not ejected: %+v", m)
			}
		})
	}
}

func TestBusyLeaderProbesEjectNobody(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 300, LinearizableRead, flat(time.Millisecond))
	// The leader answers its probes later than the followers (it does more
	// work): 19 ms against 6 ms, as measured on a loaded test bed.
	tr.probeRTTs(slowMember("m0", 19*time.Millisecond, 6*time.Millisecond))
	for range 3 * minProbeSamples {
		tr.refreshSequential()
	}
	if m := tr.Stats().Members[0]; m.Ejected {
		t.Fatalf("busy leader ejected for its probe RTT: %+v", m)
	}
}

func TestRepeatedEjectionBacksOff(t *testing.T) {
	tr := newTestRouter(t, Config{})
	slow := slowMember("m1", 20*time.Millisecond, time.Millisecond)
	fast := flat(time.Millisecond)
	ejectedFor := func() time.Duration {
		t.Helper()
		tr.eject(t, 1, slow)
		start := tr.clock.Now()
		for range 200 {
			tr.run(t, 1000, LinearizableRead, fast) // 1 s of fast reads
			tr.probeRound()
			if !tr.Stats().Members[1].Ejected {
				return tr.clock.Now().Sub(start)
			}
		}
		t.Fatal("never readmitted")
		return 0
	}
	first := ejectedFor()
	second := ejectedFor()
	third := ejectedFor()
	t.Logf("out for %v, %v, %v", first, second, third)
	if second < 2*time.Second || third < 4*time.Second || third < second {
		t.Fatalf("re-ejections within MaxEjection did not back off: %v, %v, %v", first, second, third)
	}
	if got := tr.Stats().Members[1].Ejections; got != 3 {
		t.Fatalf("ejections = %d, want 3", got)
	}
	// A long healthy stay forgives: back to the base time.
	tr.run(t, 31000, LinearizableRead, fast)
	tr.probeRound()
	if again := ejectedFor(); again > 3*time.Second {
		t.Fatalf("after 31 s in the pool the ejection lasted %v, want the base again", again)
	}
}

func TestEjectedMemberAtLowRateStaysOut(t *testing.T) {
	tr := newTestRouter(t, Config{})
	slow := slowMember("m2", 30*time.Millisecond, time.Millisecond)
	tr.eject(t, 2, slow)
	// 50 reads/s for a minute while m2 is still slow: rounds every 250 ms.
	total, toSlow := 0, 0
	for range 240 {
		c := tr.run(t, 12, LinearizableRead, slow)
		tr.clock.Advance(250 * time.Millisecond)
		tr.probeRound()
		total += 12
		toSlow += c["m2"]
		if !tr.Stats().Members[2].Ejected {
			t.Fatalf("slow m2 readmitted after %d reads", total)
		}
	}
	if share := float64(toSlow) / float64(total); share > 0.01 {
		t.Fatalf("slow m2 got %.2f%% of reads at 50 reads/s", 100*share)
	}
}

// TestProbeBudget: only an ejected member's probe-share reads carry a
// budget, twice the ejection threshold over the median, and a read cut at
// that budget (CallerGaveUp) keeps the member out.
func TestProbeBudget(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.eject(t, 2, slowMember("m2", 30*time.Millisecond, time.Millisecond))
	// The median of the judged EWMAs is a fast member's, 1 ms: the
	// threshold is max(2 × 1 ms, 1 ms + 5 ms) = 6 ms.
	const want = 12 * time.Millisecond
	probes := 0
	for range 4000 {
		p, err := tr.Pick(context.Background(), LinearizableRead)
		if err != nil {
			t.Fatal(err)
		}
		switch b := p.probeBudget(); {
		case p.Member.ID == "m2" && b != want:
			t.Fatalf("probe-share read's budget %v, want %v", b, want)
		case p.Member.ID != "m2" && b != 0:
			t.Fatalf("pool read on %s has budget %v", p.Member.ID, b)
		case p.Member.ID == "m2":
			probes++
			tr.clock.Advance(want)
			p.Done(CallerGaveUp)
			continue
		}
		p.Done(OK)
	}
	if probes == 0 {
		t.Fatal("no probe-share read in 4000")
	}
	tr.clock.Advance(time.Minute)
	tr.probeRound()
	if m := tr.Stats().Members[2]; !m.Ejected {
		t.Fatalf("m2 readmitted although its %d probe-share reads were cut at the budget: %+v", probes, m)
	}
	if b := (Pick{}).probeBudget(); b != 0 {
		t.Fatalf("zero Pick has budget %v", b)
	}
}

func TestFailedWriteAtFormerLeaderKeepsCurrent(t *testing.T) {
	tr := newTestRouter(t, Config{})
	p, _ := tr.Pick(context.Background(), Write) // pinned to m0
	tr.cluster.set("m1", 2)
	tr.probeRound()
	if tr.Stats().Leader != "m1" {
		t.Fatal("leader did not move to m1")
	}
	forgets := tr.forgets.Load()
	p.Done(MemberFault) // the write at the former leader fails late
	if st := tr.Stats(); st.Leader != "m1" || tr.forgets.Load() != forgets {
		t.Fatalf("a failure at the former leader cleared the current one: leader %q", st.Leader)
	}
}

func TestRotationsStartAtRandom(t *testing.T) {
	first := map[string]bool{}
	for range 30 {
		r, err := New(Config{Members: members(3), Policy: RoundRobin})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := r.Pick(context.Background(), Stream)
		p.Done(OK)
		first[p.Member.ID] = true
		r.Close()
	}
	if len(first) < 2 {
		t.Fatalf("30 new routers all opened their first stream on %v", first)
	}
}

func TestPreferredMember(t *testing.T) {
	tr := newTestRouter(t, Config{})
	ctx := WithPreferredMember(context.Background(), "m2")
	for range 10 {
		p, err := tr.Pick(ctx, Stream)
		if err != nil || p.Member.ID != "m2" {
			t.Fatalf("preferred m2: got %s, %v", p.Member.ID, err)
		}
		p.Done(OK)
	}
	tr.cluster.set("m0", 1, "m2")
	tr.probeRound()
	tr.probeRound()
	p, _ := tr.Pick(ctx, Stream)
	if p.Member.ID == "m2" {
		t.Fatal("preferred member kept after it became unreachable")
	}
	if _, err := tr.Pick(WithPreferredMember(context.Background(), "m9"), Stream); err == nil {
		t.Fatal("unknown preferred member accepted")
	}
}

func TestStreamsAvoidEjectedMembers(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 300, LinearizableRead, slowMember("m2", 30*time.Millisecond, time.Millisecond))
	tr.probeRound()
	if c := tr.run(t, 3000, Stream, flat(0)); c["m2"] != 0 {
		t.Fatalf("ejected m2 got %d streams", c["m2"])
	}
}

func TestMaintenanceIsNoEvidence(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 300, LinearizableRead, flat(time.Millisecond))
	tr.probeRound()
	// A read is under way on m1 when the client starts defragmenting it.
	var stuck Pick
	for {
		p, _ := tr.Pick(context.Background(), LinearizableRead)
		if p.Member.ID == "m1" {
			stuck = p
			break
		}
		p.Done(OK)
	}
	end := tr.markBusy(1)
	if m := tr.Stats().Members[1]; !m.Ejected || m.OutReason != outBusy {
		t.Fatalf("member under maintenance still in the pool: %+v", m)
	}
	if c := tr.run(t, 3000, LinearizableRead, flat(time.Millisecond)); c["m1"] != 0 {
		t.Fatalf("member under maintenance got %d reads", c["m1"])
	}
	// Its probes crawl meanwhile; the stuck read ends after 2 s.
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		if m.ID == "m1" {
			tr.clock.Advance(400 * time.Millisecond)
		}
		return tr.cluster.Probe(ctx, m)
	})
	for range 4 {
		tr.refreshSequential()
	}
	// A read sent to it on purpose while it defragments, wholly inside.
	inside, _ := tr.Pick(WithMember(context.Background(), "m1"), LinearizableRead)
	tr.clock.Advance(900 * time.Millisecond)
	inside.Done(OK)
	tr.clock.Advance(2 * time.Second)
	stuck.Done(OK)
	end()
	end() // idempotent
	tr.cfg.Prober = tr.cluster
	tr.probeRound()
	m := tr.Stats().Members[1]
	if m.Ejected || m.Ejections != 0 || m.ReadLatency > 2*time.Millisecond || m.ProbeRTT > 100*time.Millisecond {
		t.Fatalf("maintenance left a mark: %+v", m)
	}
	if c := tr.run(t, 300, LinearizableRead, flat(time.Millisecond)); c["m1"] != 100 {
		t.Fatalf("member not back after maintenance: %v", c)
	}
}

func TestCapKeepsTheWorst(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// m2 is a little slow (a farther zone on a busy day) and takes the one
	// ejection slot three members allow.
	tr.eject(t, 2, slowMember("m2", 20*time.Millisecond, 2*time.Millisecond))
	// Then m1 stops answering within the callers' deadline.
	worse := func(m Member) (Outcome, time.Duration) {
		switch m.ID {
		case "m1":
			return CallerGaveUp, 500 * time.Millisecond
		case "m2":
			return OK, 20 * time.Millisecond
		}
		return OK, 2 * time.Millisecond
	}
	tr.runOutcome(t, 300, LinearizableRead, worse)
	tr.probeRound()
	st := tr.Stats()
	if !st.Members[1].Ejected || st.Members[2].Ejected {
		t.Fatalf("want the 500 ms member out and the 20 ms one back: m1 %+v, m2 %+v", st.Members[1], st.Members[2])
	}
}

func TestBenchedMemberKeepsItsEjection(t *testing.T) {
	tr := newTestRouter(t, Config{})
	slow := slowMember("m2", 30*time.Millisecond, time.Millisecond)
	tr.eject(t, 2, slow)
	if m := tr.Stats().Members[2]; !m.Ejected || m.OutReason != outLatency {
		t.Fatalf("m2 not ejected: %+v", m)
	}
	// For one round its probes say it has no leader, then all is well
	// again on the probes' side — but its reads are still slow.
	bench := true
	tr.withProbe(func(m Member, res *ProbeResult) {
		if m.ID == "m2" && bench {
			res.LeaderID, res.Leaderless = "", true
		}
	})
	tr.clock.Advance(5 * time.Second)
	tr.probeRound()
	if m := tr.Stats().Members[2]; m.OutReason != outNoLeader {
		t.Fatalf("m2 not benched: %+v", m)
	}
	bench = false
	tr.probeRound()
	m := tr.Stats().Members[2]
	if !m.Ejected || m.OutReason != outLatency || m.Ejections != 1 {
		t.Fatalf("after its bench m2 lost its ejection: %+v", m)
	}
	if c := tr.run(t, 3000, LinearizableRead, slow); c["m2"] > 60 {
		t.Fatalf("still-slow m2 got %d of 3000 reads after its bench", c["m2"])
	}
}

func TestOnlyHybridEjects(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	tr.runOutcome(t, 60, LinearizableRead, func(m Member) (Outcome, time.Duration) {
		if m.ID == "m1" {
			return MemberFault, time.Millisecond // an election's worth of failures
		}
		return OK, time.Millisecond
	})
	tr.probeRound()
	if m := tr.Stats().Members[1]; m.Ejected {
		t.Fatalf("round_robin has no read pool, yet m1 was ejected (and nothing would readmit it): %+v", m)
	}
}

func TestClusterWideFailuresEjectNobody(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 60, LinearizableRead, flat(time.Millisecond))
	tr.probeRound()
	// An election: every member fails its reads for a while.
	tr.runOutcome(t, 30, LinearizableRead, func(Member) (Outcome, time.Duration) { return MemberFault, time.Millisecond })
	tr.probeRound()
	tr.expectNoneEjected(t, "for a failure every member shared")
}

// The same election, ending sooner for some members than for others: at
// the round m0's and m1's last reads have succeeded while m2 is still in its
// run of failures (a member that learns of the new leader last). Most
// members failed within the window, so the run is no evidence against m2.
func TestClusterWideFailuresEndingUnevenlyEjectNobody(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 60, LinearizableRead, flat(time.Millisecond))
	tr.probeRound()
	tr.runOutcome(t, 30, LinearizableRead, func(Member) (Outcome, time.Duration) { return MemberFault, time.Millisecond })
	for _, id := range []string{"m0", "m1"} {
		p, err := tr.Pick(WithMember(context.Background(), id), LinearizableRead)
		if err != nil {
			t.Fatal(err)
		}
		tr.clock.Advance(time.Millisecond)
		p.Done(OK)
	}
	if streak := tr.roster().health[2].readFailStreak.Load(); streak < int64(tr.cfg.ConsecutiveFailures) {
		t.Fatalf("m2's run of failures is %d, want at least %d for the rule to apply", streak, tr.cfg.ConsecutiveFailures)
	}
	tr.probeRound()
	tr.expectNoneEjected(t, "for failures every member shared, one member's lasting longer")
}

func TestLeaderFallbackAvoidsBenchedMembers(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.cluster.set("", 1) // no leader known …
	tr.withProbe(func(m Member, res *ProbeResult) {
		res.Leaderless = m.ID == "m2" // … and m2 cut off from its peers
	})
	tr.probeRound()
	if c := tr.run(t, 300, Write, flat(time.Millisecond)); c["m2"] != 0 || c["m0"] != 150 {
		t.Fatalf("fallback writes %v, want none on the leaderless m2", c)
	}
}

func TestLatencyJudgedAgainstTheOthers(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// m1 has too few reads to be judged (just readmitted, say); m2 is 30×
	// slower than m0. With m2 in its own median (the mean of 1 and 30 ms)
	// it could never be ejected.
	tr.run(t, 300, LinearizableRead, func(m Member) time.Duration {
		if m.ID == "m2" {
			return 30 * time.Millisecond
		}
		return time.Millisecond
	})
	tr.roster().health[1].read.Reset(time.Millisecond)
	tr.probeRound()
	if m := tr.Stats().Members[2]; !m.Ejected {
		t.Fatalf("m2 at 30 ms against m0's 1 ms not ejected: %+v", m)
	}
}

// zkProbes answers probes as ZooKeeper's srvr does: the leader says so
// with its epoch, followers name nobody; members in down fail their probe.
type zkProbes struct {
	mu     sync.Mutex
	leader string
	epoch  uint64
	down   []string
}

func (z *zkProbes) set(leader string, epoch uint64, down ...string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.leader, z.epoch, z.down = leader, epoch, down
}

func (z *zkProbes) Probe(_ context.Context, m Member) (ProbeResult, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if slices.Contains(z.down, m.ID) {
		return ProbeResult{}, errors.New("i/o timeout")
	}
	return ProbeResult{IsLeader: m.ID == z.leader, Term: z.epoch}, nil
}

// newEpochRouter is a test router whose probes answer as ZooKeeper's do
// (by epoch), with m0 leading at epoch 3. Three failed probes make a member
// unreachable, so that a write failure's own re-probe (in the background)
// cannot be what clears a leader.
func newEpochRouter(t *testing.T) (testRouter, *zkProbes) {
	t.Helper()
	tr := newTestRouter(t, Config{UnreachableAfter: 3})
	zk := &zkProbes{}
	tr.cfg.Prober = zk
	zk.set("m0", 3)
	tr.probeRound()
	return tr, zk
}

func TestOneFailedProbeKeepsTheLeader(t *testing.T) {
	tr, zk := newEpochRouter(t)
	zk.set("m0", 3, "m0") // one lost probe of the leader
	tr.probeRound()
	if st := tr.Stats(); st.Leader != "m0" || st.Fallbacks != 0 {
		t.Fatalf("one failed probe cleared the leader: %+v", st)
	}
	if w := tr.run(t, 30, Write, flat(time.Millisecond)); w["m0"] != 30 {
		t.Fatalf("writes after one failed probe = %v, want all at m0", w)
	}
	tr.probeRound()
	if st := tr.Stats(); st.Leader != "m0" {
		t.Fatalf("two failed probes of 3 cleared the leader: %+v", st)
	}
	tr.probeRound() // UnreachableAfter in a row
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader %q kept after %d failed probes", st.Leader, tr.cfg.UnreachableAfter)
	}

	// A newer epoch takes over at once, whatever the old leader's probes say.
	zk.set("m0", 3)
	tr.probeRound()
	zk.set("m1", 4, "m0")
	tr.probeRound()
	if st := tr.Stats(); st.Leader != "m1" {
		t.Fatalf("leader = %q, want m1 at the newer epoch", st.Leader)
	}

	// A write pinned to the leader that failed outranks its last claim.
	zk.set("m1", 4)
	tr.probeRound()
	zk.set("m1", 4, "m1")
	p, _ := tr.Pick(context.Background(), Write)
	p.Done(MemberFault)
	tr.probeRound()
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader %q kept after a failed write and a failed probe", st.Leader)
	}
}

// A probe round that began before a pinned write failed does not clear the
// failure's verdict; and when nothing answers, no stale claim survives.
func TestStaleClaimLapses(t *testing.T) {
	tr, zk := newEpochRouter(t)
	// The test drives every round: a background round that the failed
	// write starts could answer for members after "nothing answers".
	tr.cancel()
	<-tr.done
	ok := make([]probeOutcome, 3)
	for i, m := range tr.roster().members {
		res, _ := zk.Probe(context.Background(), m)
		ok[i] = probeOutcome{res: res, rtt: time.Millisecond}
	}
	gen := tr.forgets.Load() // a round under way before the failure
	zk.set("m0", 3, "m0")
	p, _ := tr.Pick(context.Background(), Write)
	p.Done(MemberFault)
	tr.apply(ok, gen, true) // that round's answers arrive: m0 answered then
	tr.probeRound()         // m0 fails now
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader %q back after a failed write, on a round that began before it", st.Leader)
	}

	zk.set("m0", 3)
	tr.probeRound()
	zk.set("m0", 3, "m0", "m1", "m2") // nothing answers
	for range 3 {
		tr.probeRound()
	}
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader %q kept with every member unreachable", st.Leader)
	}
}

// At load a healthy far member's tail crosses the latency line now and
// then: the EWMA holds the last few reads only, and three rounds that each
// end on a tail would eject it. The rule judges the round's mean instead.
func TestTailAtRoundEndDoesNotEject(t *testing.T) {
	tr := newTestRouter(t, Config{EjectRounds: 3})
	read := func(id string, d time.Duration) {
		p, err := tr.Pick(WithMember(context.Background(), id), LinearizableRead)
		if err != nil {
			t.Fatal(err)
		}
		tr.clock.Advance(d)
		p.Done(OK)
	}
	for range 5 {
		for range 100 {
			read("m0", 5*time.Millisecond)
			read("m1", 7*time.Millisecond)
		}
		for range 97 {
			read("m2", 12*time.Millisecond)
		}
		for range 3 {
			read("m2", 40*time.Millisecond) // the round ends on m2's tail
		}
		if ewma := tr.roster().health[2].read.Value(); ewma < 15*time.Millisecond {
			t.Fatalf("m2's EWMA %v at the round's end: the test needs it above the line (2 × 7 ms)", ewma)
		}
		tr.probeRound()
	}
	tr.expectNoneEjected(t, "for tails at the ends of rounds whose mean is in line")
	// The same member slow throughout is out within the rounds.
	for range 3 {
		for range 100 {
			read("m0", 5*time.Millisecond)
			read("m1", 7*time.Millisecond)
			read("m2", 40*time.Millisecond)
		}
		tr.probeRound()
	}
	if !tr.Stats().Members[2].Ejected {
		t.Fatal("m2 slow for three rounds is not ejected")
	}
}

// A grey failure near the line flaps across it: on a noisy host every
// member's reads slow together, and a member degraded to twice the median
// dips to 1.9× now and then (measured on the test bed under CPU bursts).
// A round on the edge, above ReadmitRatio × the median but not EjectRatio,
// holds the run, up to EjectRounds-1 such rounds in a run; a round back in
// line ends it at once.
func TestEdgeRoundsHoldTheRun(t *testing.T) {
	const median = 20 * time.Millisecond
	rounds := func(t *testing.T, ratios ...float64) testRouter {
		tr := newTestRouter(t, Config{EjectRounds: 3})
		for _, ratio := range ratios {
			tr.run(t, 300, LinearizableRead, slowMember("m2", time.Duration(ratio*float64(median)), median))
			tr.probeRound()
		}
		return tr
	}
	for _, c := range []struct {
		name   string
		ratios []float64
		out    bool
	}{
		{"one edge round inside the run", []float64{2.5, 2.5, 1.9, 2.5}, true},
		{"EjectRounds-1 edge rounds in a run", []float64{2.5, 1.9, 2.5, 1.9, 2.5}, true},
		{"EjectRounds-1 edge rounds in a row", []float64{2.5, 1.9, 1.9, 2.5, 2.5}, true},
		{"a round in line ends the run", []float64{2.5, 2.5, 1.5, 2.5}, false},
		{"EjectRounds edge rounds in a run end it", []float64{2.5, 1.9, 2.5, 1.9, 1.9, 2.5}, false},
		{"slow and edge rounds alternating", []float64{2.5, 1.9, 2.5, 1.9, 1.9, 2.5, 1.9, 2.5, 1.9, 1.9, 2.5}, false},
		{"edge rounds alone", []float64{1.9, 1.9, 1.9, 1.9, 1.9, 1.9, 1.9, 1.9}, false},
		{"edge rounds before the run", []float64{1.9, 1.9, 1.9, 2.5, 1.9, 2.5, 1.9, 2.5}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := rounds(t, c.ratios...)
			if got := tr.Stats().Members[2]; got.Ejected != c.out {
				t.Fatalf("rounds at %v × the median: m2 ejected %v, want %v: %+v", c.ratios, got.Ejected, c.out, got)
			}
		})
	}
}

// Reads failing on most members (an election, the whole cluster stalled)
// slow every member, a far one most: its latency then is no evidence.
func TestClusterWideTroubleEjectsNobodyOnLatency(t *testing.T) {
	tr := newTestRouter(t, Config{EjectRounds: 3})
	read := func(id string, d time.Duration, o Outcome) {
		p, err := tr.Pick(WithMember(context.Background(), id), LinearizableRead)
		if err != nil {
			t.Fatal(err)
		}
		tr.clock.Advance(d)
		p.Done(o)
	}
	rounds := func(fail bool) {
		for range 3 {
			for range 50 {
				read("m0", 5*time.Millisecond, OK)
				read("m1", 7*time.Millisecond, OK)
				read("m2", 30*time.Millisecond, OK)
			}
			if fail {
				for _, id := range []string{"m0", "m1", "m2"} {
					read(id, time.Millisecond, MemberFault)
				}
			}
			tr.probeRound()
		}
	}
	rounds(true)
	tr.expectNoneEjected(t, "on latency while reads failed on every member")
	tr.clock.Advance(2 * time.Second) // the failures leave the window
	tr.probeRound()
	rounds(false)
	if !tr.Stats().Members[2].Ejected {
		t.Fatal("m2 at six times the median, nothing failing, is not ejected")
	}
}

// A stall that holds up every caller (the client or the whole cluster
// starved for a few seconds) cuts their reads at the callers' deadline
// over the next rounds, more of them on a far member, whose reads take
// longest. This is the sequence of a failed test-bed run: the far member's
// cuts landed in three rounds in a row, the others' in the rounds before;
// judged round by round it was ejected at 2.1 × the median. The same cuts
// on the far member alone are a stall of that member, and eject it.
func TestClusterWideStallEjectsNobodyOnLatency(t *testing.T) {
	const deadline = 2 * time.Second
	for _, c := range []struct {
		name        string
		othersStall bool
		wantEjected bool
	}{
		{"every member stalled", true, false},
		{"the far member alone stalled", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTestRouter(t, Config{EjectRounds: 3})
			pick := func(id string) Pick {
				p, err := tr.Pick(WithMember(context.Background(), id), LinearizableRead)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			// round serves 100 reads per member at once (10 ms near, 11 ms
			// on the far m2), then cuts the stuck reads given, then probes,
			// 250 ms after the last round.
			round := func(cut ...Pick) {
				var near, far []Pick
				for range 100 {
					near = append(near, pick("m0"), pick("m1"))
					far = append(far, pick("m2"))
				}
				tr.clock.Advance(10 * time.Millisecond)
				for _, p := range near {
					p.Done(OK)
				}
				tr.clock.Advance(time.Millisecond)
				for _, p := range far {
					p.Done(OK)
				}
				for _, p := range cut {
					p.Done(CallerGaveUp)
				}
				tr.clock.Advance(250*time.Millisecond - 11*time.Millisecond)
				tr.probeRound()
			}
			round()
			round()              // the median is known: cuts far above it are samples
			var far, near []Pick // reads stuck in the stall
			for range 4 {
				far = append(far, pick("m2"))
			}
			if c.othersStall {
				near = append(near, pick("m0"), pick("m1"))
			}
			tr.clock.Advance(deadline - 250*time.Millisecond)
			round(append(near, far[0])...)
			for _, p := range far[1:] {
				round(p)
			}
			m := tr.Stats().Members[2]
			if m.Ejected != c.wantEjected {
				t.Fatalf("far member m2 ejected %v after its stalled reads, want %v: %+v", m.Ejected, c.wantEjected, tr.Stats().Members)
			}
			if c.wantEjected && m.OutReason != outLatency {
				t.Fatalf("m2 out for %q, want %q", m.OutReason, outLatency)
			}
		})
	}
}

func TestOutcomesThatDoNotCountAgainstTheMember(t *testing.T) {
	tr := newTestRouter(t, Config{})
	for _, o := range []Outcome{AppError, CallerGaveUp, NotSent, Overloaded} {
		p, _ := tr.Pick(context.Background(), Write)
		tr.clock.Advance(time.Millisecond)
		p.Done(o)
	}
	st := tr.Stats()
	if st.Leader != "m0" {
		t.Fatalf("a write that was not the leader's fault cleared the leader: %+v", st)
	}
	m0 := st.Members[0]
	if m0.Ops[Write] != 3 || m0.Errors[Write] != 1 || m0.GaveUp[Write] != 1 {
		t.Fatalf("want 3 writes counted (NotSent taken back), 1 error (Overloaded), 1 given up: %+v", m0)
	}
}

func TestUnreachableMemberLeavesRotation(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	tr.cluster.set("m0", 1, "m2")
	tr.probeRound()
	if c := tr.run(t, 30, LinearizableRead, flat(time.Millisecond)); c["m2"] != 10 {
		t.Fatalf("one failed probe already removed m2: %v", c)
	}
	tr.probeRound() // second consecutive failure
	if c := tr.run(t, 30, LinearizableRead, flat(time.Millisecond)); c["m2"] != 0 {
		t.Fatalf("unreachable m2 still got reads: %v", c)
	}
	tr.cluster.set("m0", 1)
	tr.probeRound()
	if c := tr.run(t, 30, LinearizableRead, flat(time.Millisecond)); c["m2"] != 10 {
		t.Fatalf("recovered m2 not back: %v", c)
	}
}

func TestNotServingMemberGetsNoTraffic(t *testing.T) {
	tr := newTestRouter(t, Config{Policy: RoundRobin})
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		res, err := tr.cluster.Probe(ctx, m)
		res.NotServing = m.ID == "m1"
		return res, err
	})
	tr.probeRound()
	if c := tr.run(t, 30, Write, flat(time.Millisecond)); c["m1"] != 0 {
		t.Fatalf("learner m1 got traffic: %v", c)
	}
}

func TestDegradedMemberEjectedAndReadmitted(t *testing.T) {
	tr := newTestRouter(t, Config{})
	slow := slowMember("m2", 17*time.Millisecond, time.Millisecond)
	tr.eject(t, 2, slow)
	st := tr.Stats()
	if !st.Members[2].Ejected || st.Members[0].Ejected || st.Members[1].Ejected {
		t.Fatalf("want only m2 ejected: %+v", st.Members)
	}
	c := tr.run(t, 20000, LinearizableRead, slow)
	share := float64(c["m2"]) / 20000
	if share > 0.01 || share == 0 {
		t.Fatalf("ejected m2 got %.2f%% of reads, want its probe share (0.5%%)", 100*share)
	}
	// Writes are not affected by read-pool health.
	if w := tr.run(t, 100, Write, slow); w["m0"] != 100 {
		t.Fatalf("writes = %v", w)
	}
	// Recovery: m2's probe-share reads bring its estimate down.
	rounds := 0
	for ; tr.Stats().Members[2].Ejected; rounds++ {
		if rounds == 10 {
			t.Fatalf("m2 not readmitted after recovering: %+v", tr.Stats().Members[2])
		}
		tr.run(t, 1000, LinearizableRead, flat(time.Millisecond))
		tr.probeRound()
	}
	t.Logf("readmitted after %d rounds of 1000 reads", rounds)
	if c := tr.run(t, 300, LinearizableRead, flat(time.Millisecond)); c["m2"] != 100 {
		t.Fatalf("readmitted m2 reads = %v", c)
	}
}

func TestNoReadmissionWithoutFreshReads(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.eject(t, 1, slowMember("m1", 20*time.Millisecond, time.Millisecond))
	// An idle client: probes are in line, time passes, but no read says
	// m1 recovered. The absence of bad news is not evidence.
	for range 50 {
		tr.clock.Advance(time.Second)
		tr.probeRound()
	}
	if !tr.Stats().Members[1].Ejected {
		t.Fatal("readmitted without a single fresh read")
	}
	// Reads resume; m1's probe share is fast now: it comes back.
	for range 10 {
		if !tr.Stats().Members[1].Ejected {
			break
		}
		tr.run(t, 2000, LinearizableRead, flat(time.Millisecond))
		tr.probeRound()
	}
	if tr.Stats().Members[1].Ejected {
		t.Fatalf("recovered m1 not readmitted on fresh reads: %+v", tr.Stats().Members[1])
	}
}

func TestSlowProbesKeepMemberOut(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.eject(t, 1, slowMember("m1", 20*time.Millisecond, time.Millisecond))
	// Probes to m1 take 30 ms, to the others nothing: still degraded by
	// the probe rule (beyond MinProbeEjectGap), although its reads recover.
	tr.probeRTTs(slowMember("m1", 30*time.Millisecond, 0))
	for range 5 { // the probe estimate settles while m1 is out
		tr.refreshSequential()
	}
	for range 20 {
		tr.run(t, 2000, LinearizableRead, flat(time.Millisecond))
		tr.refreshSequential()
	}
	if m := tr.Stats().Members[1]; !m.Ejected {
		t.Fatalf("a member whose probes are still slow was readmitted: %+v", m)
	}
}

func TestNoEjectionWhenAllEquallySlow(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.run(t, 300, LinearizableRead, flat(40*time.Millisecond))
	tr.probeRound()
	tr.expectNoneEjected(t, "although all members are equally slow")
}

func TestNeverEjectMajority(t *testing.T) {
	tr := newTestRouter(t, Config{Members: members(5)})
	tr.run(t, 1000, LinearizableRead, func(m Member) time.Duration {
		if m.ID == "m0" {
			return time.Millisecond
		}
		return time.Millisecond * time.Duration(10*len(m.ID)+int(m.ID[1]-'0'))
	})
	tr.probeRound()
	ejected := 0
	for _, m := range tr.Stats().Members {
		if m.Ejected {
			ejected++
		}
	}
	if ejected > 2 {
		t.Fatalf("%d of 5 members ejected, want at most 2", ejected)
	}
}

func TestMinSamplesAndGap(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// Three slow reads are not enough evidence.
	tr.run(t, 9, LinearizableRead, slowMember("m2", 50*time.Millisecond, time.Millisecond))
	tr.probeRound()
	if tr.Stats().Members[2].Ejected {
		t.Fatal("ejected on fewer than MinSamples reads")
	}
	// 3x the median but only 4 ms above it: a farther zone, not a fault.
	tr2 := newTestRouter(t, Config{})
	tr2.run(t, 300, LinearizableRead, slowMember("m2", 6*time.Millisecond, 2*time.Millisecond))
	tr2.probeRound()
	if tr2.Stats().Members[2].Ejected {
		t.Fatal("ejected for a 4 ms excess, below MinEjectGap")
	}
	// With the gap switched off, the ratio alone decides.
	tr3 := newTestRouter(t, Config{MinEjectGap: -1})
	tr3.run(t, 300, LinearizableRead, slowMember("m2", 6*time.Millisecond, 2*time.Millisecond))
	tr3.probeRound()
	if !tr3.Stats().Members[2].Ejected {
		t.Fatal("not ejected at 3x the median with no gap")
	}
}
