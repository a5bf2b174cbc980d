package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

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
	byID   map[string]int // calls per member
}

func (f *fakeCluster) Probe(_ context.Context, m Member) (ProbeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.byID == nil {
		f.byID = map[string]int{}
	}
	f.byID[m.ID]++
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
	testutil.Poll(t, 5*time.Second, "the first probe round", func() bool { return r.rounds.Load() > 0 })
	return testRouter{r, clock, cluster}
}

func (tr testRouter) probeRound() { tr.refresh(context.Background()) }

// probeRTTs makes each probe take rtt(member) on the fake clock, for
// rounds driven by refreshSequential.
func (tr testRouter) probeRTTs(rtt func(Member) time.Duration) {
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		tr.clock.Advance(rtt(m))
		return tr.cluster.Probe(ctx, m)
	})
}

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

// eject runs 300 linearizable reads at latency and a probe round, and
// fails unless that ejected member i.
func (tr testRouter) eject(t *testing.T, i int, latency func(Member) time.Duration) {
	t.Helper()
	tr.run(t, 300, LinearizableRead, latency)
	tr.probeRound()
	if !tr.Stats().Members[i].Ejected {
		t.Fatalf("m%d not ejected", i)
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
