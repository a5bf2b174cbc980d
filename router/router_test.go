package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeCluster answers probes like a Raft cluster: every member names the
// leader by server ID. Members can be made unreachable.
type fakeCluster struct {
	mu     sync.Mutex
	leader string // member ID, "" none
	term   uint64
	down   map[string]bool
	calls  int
}

func (f *fakeCluster) Probe(_ context.Context, m Member) (ProbeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down[m.ID] {
		return ProbeResult{}, errors.New("connection refused")
	}
	res := ProbeResult{ServerID: "sid-" + m.ID, Term: f.term}
	if f.leader != "" {
		res.LeaderID = "sid-" + f.leader
	}
	return res, nil
}

func (f *fakeCluster) set(leader string, term uint64, down ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leader, f.term = leader, term
	f.down = map[string]bool{}
	for _, d := range down {
		f.down[d] = true
	}
}

func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("m%d", i), Addr: fmt.Sprintf("127.0.0.1:%d", 2379+i), Zone: "a"}
	}
	return ms
}

type testRouter struct {
	*Router
	clock   *fakeClock
	cluster *fakeCluster
}

// newTestRouter builds a router whose background loop has done its first
// round and will not tick again; tests drive rounds with probeRound.
func newTestRouter(t *testing.T, cfg Config) testRouter {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	cluster := &fakeCluster{leader: "m0", term: 1}
	if cfg.Members == nil {
		cfg.Members = members(3)
	}
	cfg.Prober, cfg.Seed = cluster, 42
	if cfg.EjectRounds == 0 {
		// Most tests judge one rule after one round; TestEjectRounds
		// tests the persistence itself.
		cfg.EjectRounds = 1
	}
	if tc, ok := cfg.Clock.(*timerClock); ok {
		clock = tc.fakeClock
	} else {
		cfg.Clock = clock
	}
	cfg.ProbeInterval = time.Hour
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for r.rounds.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("first probe round did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	return testRouter{r, clock, cluster}
}

func (tr testRouter) probeRound() { tr.refresh(context.Background()) }

// refreshSequential probes one member at a time, so that a prober that
// advances the fake clock times only its own member.
func (tr testRouter) refreshSequential() {
	outcomes := make([]probeOutcome, len(tr.roster().members))
	for i, m := range tr.roster().members {
		epoch := tr.roster().health[i].busyEpoch.Load()
		start := tr.clock.Now()
		res, err := tr.cfg.Prober.Probe(context.Background(), m)
		outcomes[i] = probeOutcome{res: res, rtt: tr.clock.Now().Sub(start), err: err, busyEpoch: epoch}
	}
	tr.apply(outcomes, tr.forgets.Load(), true)
}

// run issues n operations of class op, each taking latency(member) and
// succeeding.
func (tr testRouter) run(t *testing.T, n int, op Op, latency func(Member) time.Duration) map[string]int {
	t.Helper()
	return tr.runOutcome(t, n, op, func(m Member) (Outcome, time.Duration) { return OK, latency(m) })
}

// expectNoneEjected fails t if any member is out of the read pool.
func (tr testRouter) expectNoneEjected(t *testing.T, why string) {
	t.Helper()
	for _, m := range tr.Stats().Members {
		if m.Ejected {
			t.Fatalf("%s ejected %s: %+v", m.Member.ID, why, m)
		}
	}
}

func flat(d time.Duration) func(Member) time.Duration { return func(Member) time.Duration { return d } }

func slowMember(id string, slow, fast time.Duration) func(Member) time.Duration {
	return func(m Member) time.Duration {
		if m.ID == id {
			return slow
		}
		return fast
	}
}

func TestConfigErrors(t *testing.T) {
	ms := members(3)
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no members", Config{}, ErrNoMembers},
		{"duplicate id", Config{Members: []Member{ms[0], ms[0]}}, ErrDuplicateMember},
		{"duplicate addr", Config{Members: []Member{ms[0], {ID: "x", Addr: ms[0].Addr}}}, ErrDuplicateMember},
		{"empty id", Config{Members: []Member{{Addr: "a"}}}, ErrInvalidConfig},
		{"unknown policy", Config{Members: ms, Policy: "random"}, ErrUnknownPolicy},
		{"alpha", Config{Members: ms, Alpha: 2}, ErrInvalidConfig},
		{"eject ratio", Config{Members: ms, EjectRatio: 0.5}, ErrInvalidConfig},
		{"readmit above eject", Config{Members: ms, ReadmitRatio: 3}, ErrInvalidConfig},
		{"probe share", Config{Members: ms, ProbeShare: 0.7}, ErrInvalidConfig},
		{"negative interval", Config{Members: ms, ProbeInterval: -time.Second}, ErrInvalidConfig},
		{"negative temperature", Config{Members: ms, Temperature: -1}, ErrInvalidConfig},
		{"sticky member", Config{Members: ms, StickyMember: "nope"}, ErrUnknownMember},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.cfg)
			if !errors.Is(err, tt.want) {
				if r != nil {
					r.Close()
				}
				t.Fatalf("New: err = %v, want %v", err, tt.want)
			}
		})
	}
}

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

func TestLeaderUnknownFallsBackToRoundRobin(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.cluster.set("", 1)
	tr.probeRound()
	writes := tr.run(t, 300, Write, flat(time.Millisecond))
	if len(writes) != 3 || writes["m0"] != 100 {
		t.Fatalf("writes with no leader = %v, want round robin", writes)
	}
	if got := tr.Stats().Fallbacks; got != 300 {
		t.Fatalf("fallbacks = %d, want 300", got)
	}
}

func TestFailedLeaderWriteClearsLeaderAtOnce(t *testing.T) {
	tr := newTestRouter(t, Config{})
	p, _ := tr.Pick(context.Background(), Write)
	if p.Member.ID != "m0" {
		t.Fatalf("write went to %s, want leader m0", p.Member.ID)
	}
	tr.cluster.set("m1", 2, "m0") // leader dies, m1 takes over
	p.Done(MemberFault)
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader still %q after a failed pinned write", st.Leader)
	}
	next, _ := tr.Pick(context.Background(), Write)
	next.Done(OK)
	if tr.Stats().Fallbacks != 1 {
		t.Fatal("write after the failure did not fall back")
	}
	// The failure asked for a re-probe; the background loop finds m1.
	deadline := time.Now().Add(5 * time.Second)
	for tr.Stats().Leader != "m1" {
		if time.Now().After(deadline) {
			t.Fatalf("leader = %q, want m1 after re-probe", tr.Stats().Leader)
		}
		time.Sleep(time.Millisecond)
	}
	if got := tr.Stats().LeaderChanges; got != 1 {
		t.Fatalf("leader changes = %d, want 1", got)
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

func TestHighestTermWins(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// m2 is partitioned with a stale view (old term, old leader m0); m0 and
	// m1 agree on m1 at a newer term.
	tr.cluster.set("m1", 5)
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		res, err := tr.cluster.Probe(ctx, m)
		if m.ID == "m2" {
			res.LeaderID, res.Term = "sid-m0", 4
		}
		return res, err
	})
	tr.probeRound()
	if got := tr.Stats().Leader; got != "m1" {
		t.Fatalf("leader = %q, want m1 (term 5 beats term 4)", got)
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
	tr.run(t, 300, LinearizableRead, slow)
	tr.probeRound()
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
	tr.run(t, 300, LinearizableRead, slowMember("m1", 20*time.Millisecond, time.Millisecond))
	tr.probeRound()
	if !tr.Stats().Members[1].Ejected {
		t.Fatal("m1 not ejected")
	}
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
	tr.run(t, 300, LinearizableRead, slowMember("m1", 20*time.Millisecond, time.Millisecond))
	tr.probeRound()
	if !tr.Stats().Members[1].Ejected {
		t.Fatal("m1 not ejected")
	}
	// Probes to m1 take 30 ms, to the others nothing: still degraded by
	// the probe rule (beyond MinProbeEjectGap), although its reads recover.
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		if m.ID == "m1" {
			tr.clock.Advance(30 * time.Millisecond)
		}
		return tr.cluster.Probe(ctx, m)
	})
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
	tr.run(t, 300, LinearizableRead, slowMember("m2", 20*time.Millisecond, time.Millisecond))
	tr.probeRound()
	if !tr.Stats().Members[2].Ejected {
		t.Fatal("m2 not ejected")
	}
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

func TestClosed(t *testing.T) {
	tr := newTestRouter(t, Config{})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := tr.Pick(context.Background(), Write); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pick after Close: %v", err)
	}
}

func TestNoProberMeansNoLeader(t *testing.T) {
	r, err := New(Config{Members: members(3)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, _ := r.Pick(context.Background(), Write)
	p.Done(OK)
	if r.Stats().Leader != "" || r.Stats().Fallbacks != 1 {
		t.Fatalf("stats = %+v", r.Stats())
	}
}

func TestConcurrentPickAndProbe(t *testing.T) {
	r, err := New(Config{Members: members(3), Prober: &fakeCluster{leader: "m1", term: 1}, ProbeInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 2000 {
				p, err := r.Pick(context.Background(), Op(i%numOps))
				if err != nil {
					t.Error(err)
					return
				}
				p.Done(OK)
			}
		})
	}
	wg.Wait()
	var total uint64
	for _, m := range r.Stats().Members {
		for _, n := range m.Ops {
			total += n
		}
	}
	if total != 8000 {
		t.Fatalf("counted %d ops, want 8000", total)
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
