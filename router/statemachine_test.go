package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/oproute/oproute/internal/override"
	"github.com/oproute/oproute/internal/testutil"
)

// The router as a state machine: random sequences of picks and their ends
// (every outcome), probe rounds over a cluster that changes (leader, term,
// members down, leaderless, not serving, lagging, probe RTTs), SetMembers
// (adds, retirements, the leader retired), Busy and its end, hedge choices,
// a closed loop in which the pool carries the share of the members out of it,
// bursts of failed reads on every member, stalls that cut every member's
// reads, idle spells in which no read ends, a few quick reads on a member
// whose estimate remembers slower ones, rounds of reads on the edge of the
// latency line, calm spells that settle it, members reported silent by a
// backend's ping, and
// time passing, on an injected clock. After every step the invariants
// hold (checkInvariants) and Pick does not panic for any class.
//
// Budget in CI: rapid's default 100 sequences of 20–150 steps each. A longer
// run: go test ./router -run TestRouterStateMachine -rapid.checks=20000
// (failures shrink to the shortest sequence and are saved under testdata/rapid).

// modelMember is what the fake cluster answers for one member.
type modelMember struct {
	down, leaderless, notServing bool
	lag                          uint64
	term                         uint64 // 0: the cluster's term
	rtt                          time.Duration
	read                         time.Duration // how long its reads take
	fails                        bool          // its reads fail
}

type machine struct {
	r       *Router
	probes  int      // calls to Probe
	probed  []string // the members the last probe step's round probed
	clock   *fakeClock
	mu      sync.Mutex // guards the model, read by the prober
	model   map[string]*modelMember
	leader  string
	term    uint64
	picks   []Pick
	ends    []func()
	nextID  int
	hedging bool
	// closedLoop: the pool's members carry the share of the members out of
	// it (a saturated cluster under a closed loop of callers), their reads
	// slower by reachable ÷ pooled.
	closedLoop bool
}

func (m *machine) Probe(_ context.Context, mem Member) (ProbeResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.probes++
	m.probed = append(m.probed, mem.ID)
	mm := m.model[mem.ID]
	if mm == nil || mm.down {
		return ProbeResult{}, errors.New("connection refused")
	}
	res := ProbeResult{ServerID: "sid-" + mem.ID, Term: m.term, RTT: mm.rtt, NotServing: mm.notServing, Committed: 5000, Applied: 5000 - mm.lag}
	if mm.term != 0 {
		res.Term = mm.term
	}
	if mm.leaderless {
		res.Leaderless = true
	} else if m.leader != "" {
		res.LeaderID = "sid-" + m.leader
	}
	return res, nil
}

func newMachine(t *rapid.T) *machine {
	n := rapid.IntRange(1, 5).Draw(t, "members")
	policy := rapid.SampledFrom([]string{Hybrid, Hybrid, LeastCost, LeastCost, HybridP2C, HybridHedge, RoundRobin, LeaderOnly, Sticky, Boltzmann}).Draw(t, "policy")
	m := &machine{clock: &fakeClock{now: time.Unix(1e9, 0)}, model: map[string]*modelMember{}, term: 1, nextID: n}
	ms := members(n)
	for _, mem := range ms {
		m.model[mem.ID] = &modelMember{rtt: time.Millisecond, read: time.Millisecond}
	}
	m.leader = ms[0].ID
	// Manual: the steps drive every round, so that a sequence replays
	// exactly.
	cfg := Config{Members: ms, Prober: m, Clock: m.clock, Policy: policy, ProbeInterval: 250 * time.Millisecond, Seed: 7, ClientZone: "a", Manual: true}
	if rapid.Bool().Draw(t, "cadence off") {
		cfg.StableProbeInterval = cfg.ProbeInterval
	}
	cfg.IdleProbeRounds = rapid.SampledFrom([]int{0, 1, 3, -1}).Draw(t, "idle probe rounds")
	if rapid.Bool().Draw(t, "short ejections") {
		cfg.BaseEjection, cfg.MaxEjection = 100*time.Millisecond, 2*time.Second
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.r, m.hedging = r, r.hedge != nil
	if !r.RoundPending() {
		t.Fatal("a manual router's first round is not asked for")
	}
	if err := r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range m.picks {
			p.Done(NotSent)
		}
		r.Close()
	})
	return m
}

// ids is every member ID the router has had, and one it never had.
func (m *machine) ids() []string {
	var out []string
	for _, mem := range m.r.roster().members {
		out = append(out, mem.ID)
	}
	return append(out, "nobody")
}

var allOps = []Op{Write, LinearizableRead, StaleRead, Stream}
var allOutcomes = []Outcome{OK, AppError, MemberFault, Overloaded, CallerGaveUp, NotSent}

func (m *machine) pick(t *rapid.T) {
	op := rapid.SampledFrom(allOps).Draw(t, "op")
	ctx := context.Background()
	switch rapid.IntRange(0, 5).Draw(t, "override") {
	case 1:
		ctx = WithLeader(ctx)
	case 2:
		ctx = WithMember(ctx, rapid.SampledFrom(m.ids()).Draw(t, "member"))
	case 3:
		ctx = WithPreferredMember(ctx, rapid.SampledFrom(m.ids()).Draw(t, "member"))
	case 4:
		if m.hedging {
			ctx = context.WithValue(ctx, attemptKey{}, &attemptSlot{hedge: rapid.Bool().Draw(t, "hedge")})
		}
	}
	p, err := m.r.Pick(ctx, op)
	if err != nil {
		if !errors.Is(err, ErrUnknownMember) {
			t.Fatalf("Pick: %v", err)
		}
		return
	}
	if ro := m.r.roster(); ro.retired[p.Index] {
		if id, forced := override.Forced(ctx); !forced || id != p.Member.ID {
			t.Fatalf("picked retired member %d (%s) without being told to", p.Index, p.Member.ID)
		}
	}
	if len(m.picks) < 64 {
		m.picks = append(m.picks, p)
	} else {
		p.Done(OK)
	}
}

func (m *machine) done(t *rapid.T) {
	if len(m.picks) == 0 {
		return
	}
	k := rapid.IntRange(0, len(m.picks)-1).Draw(t, "pick")
	m.clock.Advance(time.Duration(rapid.IntRange(0, 50_000).Draw(t, "latency µs")) * time.Microsecond)
	m.picks[k].Done(rapid.SampledFrom(allOutcomes).Draw(t, "outcome"))
	m.picks = slices.Delete(m.picks, k, k+1)
}

// burst sends reads that end as the model says: what makes members slow,
// failing, ejected and readmitted.
func (m *machine) burst(t *rapid.T) {
	n := rapid.IntRange(1, 200).Draw(t, "reads")
	for range n {
		p, err := m.r.Pick(context.Background(), LinearizableRead)
		if err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		mm := m.model[p.Member.ID]
		d, fails := time.Millisecond, false
		if mm != nil {
			d, fails = mm.read, mm.fails
		}
		if s := m.r.snap.Load(); m.closedLoop && s.has(p.Index) && len(s.pool) > 0 {
			d = d * time.Duration(len(s.reachable)) / time.Duration(len(s.pool))
		}
		m.mu.Unlock()
		m.clock.Advance(d)
		if fails {
			p.Done(MemberFault)
		} else {
			p.Done(OK)
		}
	}
}

// probe runs a round; after one, the ejection flags agree with the view: a
// member flagged ejected is out of the pool (between rounds, Busy may have
// taken its place for a while).
func (m *machine) probe(t *rapid.T) { m.probeRound(t, rapid.Bool().Draw(t, "forced")) }

// calm heals the model (every member up, serving, in line; the leader and
// held calls as they are) and lets rounds pass until the router settles,
// then runs the round the stable interval asks for: what a settled round
// probes, and that it probes the leader.
func (m *machine) calm(t *rapid.T) {
	m.mu.Lock()
	for _, mm := range m.model {
		*mm = modelMember{rtt: time.Millisecond, read: time.Millisecond}
	}
	m.mu.Unlock()
	for range 4 * settleRounds {
		if m.r.settled.Load() {
			break
		}
		m.clock.Advance(m.r.cfg.ProbeInterval)
		m.r.round(context.Background(), false)
	}
	for range rapid.IntRange(1, 2*DefaultIdleProbeRounds).Draw(t, "stable rounds") {
		m.clock.Advance(m.r.cfg.StableProbeInterval * 13 / 10)
		m.probeRound(t, false)
	}
}

func (m *machine) probeRound(t *rapid.T, forced bool) {
	settled := m.r.settled.Load() && !m.r.evidence.Load()
	leader := m.r.snap.Load().leader
	m.mu.Lock()
	before := m.probes
	m.probed = nil
	m.mu.Unlock()
	m.r.mu.Lock()
	readmitted := make([]uint64, len(m.r.roster().health))
	for i, h := range m.r.roster().health {
		readmitted[i] = h.readmissions
	}
	m.r.mu.Unlock()
	if forced {
		m.r.Refresh()
	}
	forced = m.r.RoundPending() // asked for by the step, or by evidence (Unsettle)
	if err := m.r.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	probed, who := m.probes > before, slices.Clone(m.probed)
	m.mu.Unlock()
	if !probed && (forced || !settled) && len(m.r.Members()) > 0 {
		t.Fatalf("a round without probes (forced %v, settled %v): only a settled router may skip them", forced, settled)
	}
	if live := len(m.r.Members()); probed && (forced || !settled) && len(who) != live {
		t.Fatalf("a round probed %v of %d live members (forced %v, settled %v): only a settled round may leave some out", who, live, forced, settled)
	}
	if probed && leader >= 0 && !m.r.roster().retired[leader] && !slices.Contains(who, m.r.roster().members[leader].ID) {
		t.Fatalf("a round probed %v but not the leader %s: its answer is what shows a leader change", who, m.r.roster().members[leader].ID)
	}
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	s, ro := m.r.snap.Load(), m.r.roster()
	for _, i := range s.reachable {
		if ro.health[i].ejected && s.has(i) {
			t.Fatalf("member %d flagged ejected (%s) but in the read pool after a round", i, ro.health[i].ejectWhy)
		}
	}
	for i, h := range ro.health {
		if m.r.cfg.Policy != LeastCost || i >= len(readmitted) || h.readmissions == readmitted[i] || h.cost.judge.baseline.w < baselineMinWeight {
			continue
		}
		// Readmitted: priced at its baseline, not at the reads of its
		// failure (restore).
		base, perRead, _ := h.cost.judge.baseline.line(math.Inf(1))
		same := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(math.Abs(b), 1) }
		if l := h.cost.line.Load(); l == nil || !same(l.base, 1e3*base) || !same(l.perRead, 1e3*perRead) {
			t.Fatalf("member %d readmitted with its model at %+v, want its baseline's line (%.0f µs, %.0f µs a read)", i, l, base, perRead)
		}
	}
}

func (m *machine) change(t *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range m.model {
			if !yield(id) {
				return
			}
		}
	})
	id := rapid.SampledFrom(ids).Draw(t, "who")
	mm := m.model[id]
	switch rapid.IntRange(0, 10).Draw(t, "change") {
	case 0:
		m.leader, m.term = id, m.term+1
	case 1:
		m.leader = ""
	case 2:
		mm.down = !mm.down
	case 3:
		mm.leaderless = !mm.leaderless
	case 4:
		mm.notServing = !mm.notServing
	case 5:
		mm.lag = uint64(rapid.SampledFrom([]int{0, 10, 5000}).Draw(t, "lag"))
	case 6:
		mm.term = uint64(rapid.IntRange(0, int(m.term)).Draw(t, "term"))
	case 7:
		mm.rtt = time.Duration(rapid.IntRange(1, 200).Draw(t, "rtt ms")) * time.Millisecond
	case 8:
		mm.read = time.Duration(rapid.IntRange(1, 100).Draw(t, "read ms")) * time.Millisecond
	case 9:
		mm.fails = !mm.fails
	case 10:
		m.closedLoop = !m.closedLoop
	}
}

func (m *machine) setMembers(t *rapid.T) {
	ro := m.r.roster()
	var ms []Member
	for i, mem := range ro.members {
		if !ro.retired[i] && rapid.Bool().Draw(t, "keep "+mem.ID) {
			ms = append(ms, mem)
		}
	}
	for range rapid.IntRange(0, 2).Draw(t, "added") {
		mem := Member{ID: fmt.Sprintf("m%d", m.nextID), Addr: fmt.Sprintf("127.0.0.1:%d", 2379+m.nextID), Zone: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "zone")}
		m.nextID++
		m.mu.Lock()
		m.model[mem.ID] = &modelMember{rtt: time.Millisecond, read: time.Millisecond}
		m.mu.Unlock()
		ms = append(ms, mem)
	}
	err := m.r.SetMembers(ms)
	if len(ms) == 0 {
		if !errors.Is(err, ErrNoMembers) {
			t.Fatalf("SetMembers(none): %v, want ErrNoMembers", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("SetMembers: %v", err)
	}
}

func (m *machine) busy(t *rapid.T) {
	if len(m.ends) >= 4 {
		return
	}
	ro := m.r.roster()
	m.ends = append(m.ends, m.r.markBusy(rapid.IntRange(0, len(ro.members)-1).Draw(t, "busy")))
}

func (m *machine) endBusy(t *rapid.T) {
	if len(m.ends) == 0 {
		return
	}
	k := rapid.IntRange(0, len(m.ends)-1).Draw(t, "end")
	m.ends[k]()
	if rapid.Bool().Draw(t, "end twice") {
		m.ends[k]() // idempotent
	}
	m.ends = slices.Delete(m.ends, k, k+1)
}

func (m *machine) hedge(t *rapid.T) {
	if !m.hedging {
		return
	}
	op := rapid.SampledFrom([]Op{LinearizableRead, StaleRead}).Draw(t, "op")
	m.r.hedgeDelay(context.Background(), op)
	exclude := rapid.IntRange(-1, len(m.r.roster().members)-1).Draw(t, "exclude")
	if mem, ok := m.r.hedgeTarget(op, exclude); ok {
		i := m.r.indexOf(mem.ID)
		if i < 0 || i == exclude {
			t.Fatalf("hedge to %s (index %d, excluded %d)", mem.ID, i, exclude)
		}
	}
}

// stall holds up a read on every reachable member for a caller's
// deadline (the client or the whole cluster starved) and cuts them all,
// then runs a round: while most members' reads stalled, no member leaves
// the pool on latency.
func (m *machine) stall(t *rapid.T) {
	reachable := m.reachable()
	ro := m.r.roster()
	before := make([]uint64, len(ro.health))
	wasOut := make([]bool, len(ro.health))
	var stuck []Pick
	for i, h := range ro.health {
		before[i], wasOut[i] = h.readStalls.Load(), h.ejected
	}
	for _, i := range reachable {
		stuck = append(stuck, m.readOn(t, i))
	}
	m.clock.Advance(time.Duration(rapid.IntRange(1, 5).Draw(t, "stall s")) * time.Second)
	for _, p := range stuck {
		p.Done(CallerGaveUp)
	}
	m.r.round(context.Background(), true)
	// Most of the members the round judged: its probes may have made
	// members reachable that were not (added ones, first answering), and
	// one member's stall among three is that member's evidence.
	judged := m.reachable()
	stalled := 0
	for _, i := range judged {
		if i < len(before) && ro.health[i].readStalls.Load() > before[i] {
			stalled++
		}
	}
	if 2*stalled <= len(judged) {
		return
	}
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	for i, h := range m.r.roster().health {
		if i < len(wasOut) && h.ejected && !wasOut[i] && h.ejectWhy == outLatency {
			t.Fatalf("member %d ejected on latency in a round after reads stalled on %d of the %d reachable members it judged", i, stalled, len(judged))
		}
	}
}

// idle lets rounds pass with no read ending (a client between bursts):
// the estimates stay as the last reads left them, which is no new
// evidence, so no member leaves the pool on latency however many rounds
// pass, but one its latency rule had found slow already.
func (m *machine) idle(t *rapid.T) {
	ro := m.r.roster()
	m.r.round(context.Background(), false) // judges the reads that ended before the step
	m.r.mu.Lock()
	before := make([]uint64, len(ro.health))
	// due: its latency rule found it slow already (hybrid's run complete,
	// least_cost's verdict), held back by the minority cap or a troubled
	// round: that verdict stands.
	due := make([]bool, len(ro.health))
	for i, h := range ro.health {
		before[i], due[i] = h.totalEjected, m.r.rule != nil && m.r.rule.slow(m.r, h)
	}
	m.r.mu.Unlock()
	for range rapid.IntRange(1, 3*m.r.cfg.EjectRounds).Draw(t, "idle rounds") {
		m.clock.Advance(m.r.cfg.ProbeInterval)
		m.r.round(context.Background(), false)
	}
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	for i, h := range ro.health {
		if h.totalEjected > before[i] && h.ejectWhy == outLatency && !due[i] {
			t.Fatalf("member %d ejected on latency while no read ended", i)
		}
	}
}

// quickReads ends a slow spell on one member, shorter than EjectRounds,
// with a few 1 ms reads (fewer than MinSamples), then runs a round: whatever
// its EWMA still remembers of the slow reads, a round whose own reads were
// quick does not eject it on latency.
func (m *machine) quickReads(t *rapid.T) {
	reachable := m.reachable()
	if len(reachable) == 0 || m.r.cfg.Policy == LeastCost {
		return // least_cost judges a member against its own baseline: baselineReads, slowReads
	}
	ro := m.r.roster()
	i := rapid.SampledFrom(reachable).Draw(t, "member")
	if ro.health[i].busy.Load() > 0 {
		return // its reads are no evidence (a busy member the minority cap keeps in the pool)
	}
	reads := func(n int, d time.Duration) { m.readsOn(t, i, n, d) }
	m.r.round(context.Background(), true) // judges the reads that ended before the step
	slow := time.Duration(rapid.IntRange(10, 300).Draw(t, "slow ms")) * time.Millisecond
	for range rapid.IntRange(0, m.r.cfg.EjectRounds-1).Draw(t, "slow rounds") {
		reads(rapid.IntRange(1, 3).Draw(t, "slow reads"), slow)
		m.r.round(context.Background(), true)
	}
	m.r.mu.Lock()
	before, wasOut := ro.health[i].totalEjected, ro.health[i].ejected
	m.r.mu.Unlock()
	reads(rapid.IntRange(1, m.r.cfg.MinSamples-1).Draw(t, "quick reads"), time.Millisecond)
	m.r.round(context.Background(), true)
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if h := ro.health[i]; !wasOut && h.totalEjected > before && h.ejectWhy == outLatency {
		t.Fatalf("member %d ejected on latency in a round whose reads took 1 ms", i)
	}
}

// edgeReads runs rounds in which one member's reads sit on the edge,
// between the readmission and ejection lines, while the others read at a
// common latency: an edge round never adds to a run, and EjectRounds-1 of
// them end it, so the member does not leave the pool on latency (unless
// its run was complete already, held back by the minority cap).
func (m *machine) edgeReads(t *rapid.T) {
	reachable := m.reachable()
	if len(reachable) < 2 || m.r.cfg.Policy == LeastCost {
		return // least_cost judges a member against its own baseline: baselineReads, slowReads
	}
	ro := m.r.roster()
	i := rapid.SampledFrom(reachable).Draw(t, "member")
	if ro.health[i].busy.Load() > 0 {
		return // its reads are no evidence (a busy member the minority cap keeps in the pool)
	}
	m.r.round(context.Background(), true) // judges the reads that ended before the step
	m.r.mu.Lock()
	h := ro.health[i]
	before, wasOut, due := h.totalEjected, h.ejected, h.slowReadRounds >= m.r.cfg.EjectRounds
	m.r.mu.Unlock()
	base := time.Duration(rapid.IntRange(10, 50).Draw(t, "base ms")) * time.Millisecond
	lo, hi := int(100*m.r.cfg.ReadmitRatio)+1, int(100*m.r.cfg.EjectRatio)-1
	if lo > hi {
		return // no edge between the lines
	}
	edge := time.Duration(float64(base) * float64(rapid.IntRange(lo, hi).Draw(t, "edge %")) / 100)
	run := func() int {
		m.r.mu.Lock()
		defer m.r.mu.Unlock()
		return h.slowReadRounds
	}
	edgeRounds := 0 // in a row, as the router judged them
	for range rapid.IntRange(1, 3*m.r.cfg.EjectRounds).Draw(t, "edge rounds") {
		was := run()
		for _, j := range reachable {
			d := base
			if j == i {
				d = edge
			}
			m.readsOn(t, j, m.r.cfg.MinSamples, d)
		}
		m.r.round(context.Background(), true)
		// The others' reads set the median, unless a member's stale
		// estimate (one busy, say) pulled it down: then i was slow.
		median := time.Duration(m.r.readMedian.Load())
		if m.r.farAbove(edge, median) || m.r.inLine(edge, median, m.r.cfg.MinEjectGap) {
			edgeRounds = 0
			continue
		}
		edgeRounds++
		if now := run(); now > was || (edgeRounds >= m.r.cfg.EjectRounds && now > 0) {
			t.Fatalf("member %d's slow run went from %d to %d at its edge round %d in a row (median %v, its reads %v)", i, was, now, edgeRounds, median, edge)
		}
	}
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	if !wasOut && !due && h.totalEjected > before && h.ejectWhy == outLatency {
		t.Fatalf("member %d ejected on latency after rounds whose reads took %v against the others' %v", i, edge, base)
	}
}

// baselineReads runs rounds in which every reachable member's reads take
// what its own baseline predicts (least_cost): no member that the judge did
// not already find failing leaves the pool on latency, and the judge's
// evidence against every member falls or stays at 0.
func (m *machine) baselineReads(t *rapid.T) {
	if m.r.cfg.Policy != LeastCost {
		return
	}
	ro := m.r.roster()
	m.r.round(context.Background(), true) // judges the reads that ended before the step
	reachable := m.reachable()
	for range rapid.IntRange(1, 6).Draw(t, "baseline rounds") {
		type before struct {
			failing, out bool
			excess       float64
			ejections    uint64
		}
		was := map[int]before{}
		predicted := map[int]time.Duration{}
		m.r.mu.Lock()
		for _, i := range reachable {
			h := ro.health[i]
			was[i] = before{h.cost.judge.failing, h.ejected, h.cost.judge.excess, h.totalEjected}
			if base, perRead, ok := h.cost.judge.baseline.line(math.Inf(1)); ok {
				// One read at a time, beside the picks the machine holds.
				predicted[i] = time.Duration(1e3 * (base + perRead*float64(h.inflight.Load()+1))) // the fit is in µs
			}
		}
		m.r.mu.Unlock()
		for _, i := range reachable {
			if d := predicted[i]; d > 0 {
				m.readsOn(t, i, 2, d)
			}
		}
		m.r.round(context.Background(), true)
		if !slices.Equal(m.reachable(), reachable) {
			return // the round changed who is judged
		}
		m.r.mu.Lock()
		for _, i := range reachable {
			h, b := ro.health[i], was[i]
			if _, ok := predicted[i]; !ok || h.busy.Load() > 0 {
				continue
			}
			if !b.failing && !b.out && h.totalEjected > b.ejections && h.ejectWhy == outLatency {
				m.r.mu.Unlock()
				t.Fatalf("member %d ejected on latency in a round whose reads took what its baseline predicts", i)
			}
			if h.cost.judge.excess > b.excess {
				m.r.mu.Unlock()
				t.Fatalf("member %d's excess rose from %.2f to %.2f on reads as its baseline predicts", i, b.excess, h.cost.judge.excess)
			}
		}
		m.r.mu.Unlock()
	}
}

// slowReads makes one member's reads nine times what its baseline predicts
// while the others read as theirs predict (least_cost): the judge finds it
// failing within five rounds (the godoc derives three at two reads a
// round; a member whose reads varied more takes longer).
func (m *machine) slowReads(t *rapid.T) {
	if m.r.cfg.Policy != LeastCost {
		return
	}
	ro := m.r.roster()
	// A FailureWindow without failures first: a round troubled by the
	// failures of earlier steps judges nobody.
	m.clock.Advance(m.r.cfg.FailureWindow)
	m.r.round(context.Background(), true)
	m.r.round(context.Background(), true) // judges the reads that ended before the step
	reachable := m.reachable()
	if len(reachable) < 2 {
		return
	}
	slow := rapid.SampledFrom(reachable).Draw(t, "slow member")
	predicted := map[int]time.Duration{}
	m.r.mu.Lock()
	for _, i := range reachable {
		h := ro.health[i]
		if base, perRead, ok := h.cost.judge.baseline.line(math.Inf(1)); ok && h.cost.judge.baseline.w >= baselineMinWeight && h.busy.Load() == 0 {
			predicted[i] = time.Duration(1e3 * (base + perRead*float64(h.inflight.Load()+1))) // the fit is in µs
		}
	}
	m.r.mu.Unlock()
	if predicted[slow] <= 0 || len(predicted) < 2 {
		return // no baseline to judge against, or nobody to compare with
	}
	for k := 1; k <= 5; k++ {
		for i, d := range predicted {
			if i == slow {
				d *= 9
			}
			m.readsOn(t, i, 2, d)
		}
		m.r.round(context.Background(), true)
		if !slices.Equal(m.reachable(), reachable) {
			return // the rounds changed who is judged
		}
		m.r.mu.Lock()
		failing := ro.health[slow].cost.judge.failing
		m.r.mu.Unlock()
		if failing {
			return
		}
	}
	t.Fatalf("member %d, nine times slower than its baseline, not found failing in 5 rounds", slow)
}

// reachable returns the router's reachable members.
func (m *machine) reachable() []int {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return slices.Clone(m.r.snap.Load().reachable)
}

// readOn picks member i for a linearizable read.
func (m *machine) readOn(t *rapid.T, i int) Pick {
	p, err := m.r.Pick(WithMember(context.Background(), m.r.roster().members[i].ID), LinearizableRead)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readsOn runs n linearizable reads on member i, one at a time, each
// taking d on the clock and succeeding.
func (m *machine) readsOn(t *rapid.T, i, n int, d time.Duration) {
	for range n {
		p := m.readOn(t, i)
		m.clock.Advance(d)
		p.Done(OK)
	}
}

// errorBurst fails reads on every reachable member at once (an election:
// every member answers "leader changed" for a while), some members' runs
// ended by a success before the round and others not, then runs a round.
// TestClusterWideFailuresEndingUnevenlyEjectNobody asserts what the round
// must not do; here the invariants are checked.
func (m *machine) errorBurst(t *rapid.T) {
	for _, i := range m.reachable() {
		pick := func() Pick {
			p := m.readOn(t, i)
			m.clock.Advance(time.Millisecond)
			return p
		}
		for range rapid.IntRange(1, 2*m.r.cfg.ConsecutiveFailures).Draw(t, "failures") {
			pick().Done(MemberFault)
		}
		if rapid.Bool().Draw(t, "run ended") {
			pick().Done(OK)
		}
	}
	m.r.round(context.Background(), true)
}

// observeTerm reports a term a response carried: older, the same or newer
// than the cluster's.
func (m *machine) observeTerm(t *rapid.T) {
	m.mu.Lock()
	term := m.term
	m.mu.Unlock()
	m.r.observeTerm(term + uint64(rapid.IntRange(0, 2).Draw(t, "term ahead")) - 1)
}

func (m *machine) unsettle(*rapid.T) { m.r.unsettle() }

// unanswered reports a member silent (a backend's ping unanswered), then
// runs a round: a member that answers that round's probe has no failed
// probe left (a live member's miss costs a probe round, not its place),
// and one that does not has failed min(2, UnreachableAfter) probes (the
// miss counted as one).
func (m *machine) unanswered(t *rapid.T) {
	ro := m.r.roster()
	i := rapid.IntRange(-1, len(ro.members)).Draw(t, "silent")
	m.r.unanswered(i)
	m.clock.Advance(m.r.cfg.ProbeInterval)
	m.probeRound(t, false)
	if i < 0 || i >= len(ro.members) || ro.retired[i] {
		return
	}
	m.mu.Lock()
	mm := m.model[ro.members[i].ID]
	down := mm == nil || mm.down
	m.mu.Unlock()
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	h := ro.health[i]
	if h.busy.Load() > 0 {
		return // a round overlapping maintenance is no evidence either way
	}
	switch want := min(2, m.r.cfg.UnreachableAfter); {
	case !down && h.probeFailures != 0:
		t.Fatalf("member %d answered its probe after a miss but has %d failed probes", i, h.probeFailures)
	case down && h.probeFailures < want:
		t.Fatalf("member %d missed a ping and failed its probe but has %d failed probes, want at least %d", i, h.probeFailures, want)
	}
}

func (m *machine) advance(t *rapid.T) {
	m.clock.Advance(time.Duration(rapid.IntRange(1, 40_000).Draw(t, "advance ms")) * time.Millisecond)
}

// check runs after every step.
func (m *machine) check(t *rapid.T) {
	if err := m.r.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	for _, op := range allOps {
		s := m.r.snap.Load()
		p, err := m.r.Pick(context.Background(), op)
		if err != nil {
			t.Fatalf("Pick(%v): %v", op, err)
		}
		if m.r.roster().retired[p.Index] {
			t.Fatalf("Pick(%v) chose retired member %d", op, p.Index)
		}
		if where, ok := m.pickAllowed(s, op, p.Index); !ok {
			t.Fatalf("%s: Pick(%v) chose member %d, want %s (leader %d, reachable %v, pool %v, ejected %v, serving %v)",
				m.r.cfg.Policy, op, p.Index, where, s.leader, s.reachable, s.pool, s.ejected, s.serving)
		}
		p.Abandon()
	}
	m.r.Stats()
}

// pickAllowed is the model of what each policy's pick must be, with no
// override: writes at the leader (or, unknown, a serving member); under a
// read pool, reads from the pool or an ejected member's probe share and
// streams from the pool; sticky on its member; the rest on a reachable one.
func (m *machine) pickAllowed(s *snapshot, op Op, i int) (string, bool) {
	toLeader := func() (string, bool) {
		if s.leader >= 0 {
			return "the leader", i == s.leader
		}
		if len(s.serving) > 0 {
			return "a serving member", slices.Contains(s.serving, i)
		}
		return "a reachable member", slices.Contains(s.reachable, i)
	}
	policy := m.r.cfg.Policy
	pooled := policy == Hybrid || policy == LeastCost
	switch {
	case policy == LeaderOnly || (pooled && op == Write):
		return toLeader()
	case policy == Sticky:
		return "the sticky member", i == s.sticky
	case pooled && op == Stream:
		return "a pool member", s.has(i)
	case pooled:
		return "a pool member or an ejected one", s.has(i) || slices.Contains(s.ejected, i)
	}
	return "a reachable member", slices.Contains(s.reachable, i)
}

func (m *machine) steps(t *rapid.T, n int) {
	actions := map[string]func(*rapid.T){
		"pick": m.pick, "done": m.done, "burst": m.burst, "probe": m.probe, "change": m.change,
		"setMembers": m.setMembers, "busy": m.busy, "endBusy": m.endBusy, "hedge": m.hedge, "advance": m.advance,
		"observeTerm": m.observeTerm, "unsettle": m.unsettle, "unanswered": m.unanswered, "stall": m.stall, "calm": m.calm,
		"errorBurst": m.errorBurst, "idle": m.idle, "quickReads": m.quickReads, "edgeReads": m.edgeReads,
		"baselineReads": m.baselineReads, "slowReads": m.slowReads,
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range actions {
			if !yield(k) {
				return
			}
		}
	})
	weighted := append(slices.Clone(names), "burst", "burst", "probe", "probe", "probe", "pick", "done", "change")
	m.check(t)
	for range n {
		actions[rapid.SampledFrom(weighted).Draw(t, "action")](t)
		m.check(t)
	}
}

func TestRouterStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		m.steps(t, rapid.IntRange(20, 150).Draw(t, "steps"))
	})
}

// After any history, a cluster that heals (every member up, serving, in
// line with the others, maintenance over) has every member back in the
// read pool within MaxEjection and a few rounds: no member is kept out
// for ever.
func TestHealedMembersReturn(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		m.steps(t, rapid.IntRange(10, 80).Draw(t, "steps"))
		for _, end := range m.ends {
			end()
		}
		m.ends = nil
		for _, p := range m.picks {
			p.Done(OK)
		}
		m.picks = nil
		m.mu.Lock()
		live := m.r.Members()
		m.leader, m.term = live[0].ID, m.term+1
		m.closedLoop = rapid.Bool().Draw(t, "closed loop")
		for _, mm := range m.model {
			*mm = modelMember{rtt: time.Millisecond, read: time.Millisecond}
		}
		m.mu.Unlock()
		bound := m.r.cfg.MaxEjection + 10*time.Second
		deadline := m.clock.Now().Add(bound)
		for {
			m.r.refresh(context.Background())
			st := m.r.Stats()
			out := 0
			for _, ms := range st.Members {
				if !ms.Retired && (ms.Ejected || !ms.Reachable) {
					out++
				}
			}
			if out == 0 {
				return
			}
			if m.clock.Now().After(deadline) {
				t.Fatalf("%d members still out %v after the cluster healed: %+v", out, bound, st.Members)
			}
			for range 200 {
				p, err := m.r.Pick(context.Background(), LinearizableRead)
				if err != nil {
					t.Fatal(err)
				}
				p.Done(OK)
			}
			m.clock.Advance(500 * time.Millisecond)
		}
	})
}

// A member degraded far beyond the ejection line stays out while the pool's
// members carry its share (a closed loop on a saturated cluster slows their
// reads by reachable ÷ pooled), however high that lifts their median, and
// returns once it heals. Held to the raw median, a member at 2.2–2.7 times
// the others' latency at equal load flaps back in with three members.
func TestDegradedStaysOutWhileOthersCarryItsShare(t *testing.T) {
	testutil.SkipUnderRace(t, "100 cases of up to 250 rounds of 400 reads")
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{3, 5}).Draw(t, "members")
		m := &machine{clock: &fakeClock{now: time.Unix(1e9, 0)}, model: map[string]*modelMember{}, term: 1, nextID: n, closedLoop: true}
		ms := members(n)
		base := time.Duration(rapid.IntRange(8, 40).Draw(t, "base ms")) * time.Millisecond
		for _, mem := range ms {
			m.model[mem.ID] = &modelMember{rtt: time.Millisecond, read: base}
		}
		m.leader = ms[0].ID
		r, err := New(Config{Members: ms, Prober: m, Clock: m.clock, Policy: Hybrid, ProbeInterval: 250 * time.Millisecond, Seed: uint64(rapid.IntRange(1, 1000).Draw(t, "seed"))})
		if err != nil {
			t.Fatal(err)
		}
		m.r = r
		testutil.Poll(t, 5*time.Second, "the first probe round", func() bool { return r.rounds.Load() > 0 })
		r.cancel()
		<-r.done
		t.Cleanup(func() { r.Close() })

		slow := ms[n-1].ID
		factor := rapid.Float64Range(2.2, 2.7).Draw(t, "degraded × base")
		m.model[slow].read = time.Duration(factor * float64(base))
		round := func() {
			for range 400 {
				p, err := r.Pick(context.Background(), LinearizableRead)
				if err != nil {
					t.Fatal(err)
				}
				d := m.model[p.Member.ID].read
				if s := r.snap.Load(); s.has(p.Index) {
					d = d * time.Duration(len(s.reachable)) / time.Duration(len(s.pool))
				}
				m.clock.Advance(d)
				p.Done(OK)
			}
			m.clock.Advance(r.cfg.ProbeInterval)
			r.round(context.Background(), true)
			if err := r.checkInvariants(); err != nil {
				t.Fatal(err)
			}
		}
		ejected := func() bool { return r.Stats().Members[n-1].Ejected }
		for k := 0; !ejected(); k++ {
			if k == 10 {
				t.Fatalf("degraded member (%.2f × the others' reads) not ejected in 10 rounds: %+v", factor, r.Stats().Members)
			}
			round()
		}
		for k := range 40 {
			round()
			if !ejected() {
				t.Fatalf("degraded member (%.2f × the others' reads at equal load) readmitted %d rounds after its ejection, read median %v, share-fair %v",
					factor, k+1, time.Duration(r.readMedian.Load()), time.Duration(r.fairMedian.Load()))
			}
		}
		m.model[slow].read = base
		for k := 0; ejected(); k++ {
			if k == 200 {
				t.Fatalf("healed member still out 200 rounds after it healed: %+v", r.Stats().Members)
			}
			round()
		}
	})
}
