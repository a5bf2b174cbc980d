package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oproute/oproute/ewma"
)

// Router picks a member for each operation. Create one with New and release
// its background prober with Close.
type Router struct {
	cfg Config
	// ros is the member list with each member's health: indexes into it
	// never change (members are only added or retired), so a snapshot's
	// indexes stay valid in any later roster. Replaced under mu.
	ros     atomic.Pointer[roster]
	epoch   time.Time // monotonic base of Pick timestamps
	sysTime bool      // cfg.Clock is the system clock: use the monotonic fast path
	kind    policyKind
	seeded  bool         // random() uses rnd; else the runtime's per-thread generator
	timed   [numOps]bool // the policy consumes this class's latency

	snap atomic.Pointer[snapshot]
	// hedge is nil unless Config.Hedge is set.
	hedge *hedger

	// The two cursors are written on almost every pick: each gets its own
	// cache line, away from the fields above that every pick reads.
	_   [64]byte
	rr  atomic.Uint64 // round-robin cursor shared by all rotations
	_   [56]byte
	rnd atomic.Uint64 // splitmix64 state
	_   [56]byte

	leaderChanges atomic.Uint64
	fallbacks     atomic.Uint64
	forgets       atomic.Uint64 // bumped by forgetLeader
	rounds        atomic.Uint64 // completed probe rounds

	collectorOnce sync.Once
	collector     *collector
	latency       *prometheus.HistogramVec // the collector's, for members added later; guarded by mu
	// readMedian is the median read EWMA of the judged members at the last
	// probe round (ns), 0 while unknown: the yardstick for censored samples
	// and for an ejected member's fresh reads.
	readMedian atomic.Int64

	mu         sync.Mutex // serialises snapshot rebuilds
	lastLeader int        // last known leader index, for counting changes; guarded by mu
	// announcedLeader is the leader the last leader event named, -1 after
	// leader_lost or before any; guarded by mu.
	announcedLeader int

	cadence
	refreshc chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
	closed   atomic.Bool
}

// memberHealth is the per-member state updated on the hot path.
type memberHealth struct {
	read  *ewma.EWMA // read latency: the read pool's health signal at low traffic
	all   *ewma.EWMA // every op's latency: boltzmann's blended signal
	probe *ewma.EWMA // probe round trips

	consecutiveFailures atomic.Int64 // any class: boltzmann's rule
	readFailStreak      atomic.Int64 // reads only: the failure rule
	readFails           atomic.Uint64
	// freshInLine counts an ejected member's probe-share reads in a row
	// that were in line with the others: its evidence for readmission.
	freshInLine atomic.Int64
	// busy counts maintenance calls in flight (see Router.Busy); busyEpoch
	// is bumped when one starts or ends, so that a read or probe that
	// overlapped one is not taken as evidence.
	busy      atomic.Int32
	busyEpoch atomic.Uint64
	// inflight counts reads picked and not yet done, under LoadAware.
	inflight atomic.Int64
	// weight is boltzmann's exp(−EWMA/τ), as float64 bits, refreshed when a
	// sample lands so that Pick does no exp of its own.
	weight atomic.Uint64
	ops    [numOps]atomic.Uint64
	oks    [numOps]atomic.Uint64 // answered: OK or AppError
	errs   [numOps]atomic.Uint64
	gaveUp [numOps]atomic.Uint64
	// ignored counts calls that ended while the member was busy (not
	// evidence): with the others, every pick's end is counted once.
	ignored [numOps]atomic.Uint64

	// Off the hot path, guarded by Router.mu.
	probeFailures int
	lastProbe     ProbeResult
	probed        bool
	// forgotten: a write pinned to this member as leader failed since its
	// last good probe, so its last claim to lead is not carried over a
	// failed probe (electedLeader). forgottenAt is r.forgets after that
	// failure: only a probe from a round that began later clears it.
	forgotten     bool
	forgottenAt   uint64
	window        failureWindow
	ejected       bool      // ejected on reads' evidence; survives a spell on the bench
	ejectWhy      string    // why it was ejected
	benchWhy      string    // why its probes bench it, "" when they do not
	ejectUntil    time.Time // the least end of the current ejection
	ejections     int       // ejections not yet forgiven: the backoff's exponent
	totalEjected  uint64
	readmissions  uint64
	reached       bool // a probe has succeeded
	added         bool // added by SetMembers: no traffic before its first good probe
	outAnnounced  bool // an EventLeftPool was sent and no EventBackInPool since
	downAnnounced bool // an EventUnreachable was sent and no EventReachable since
	// totalProbeFailures counts every failed probe (probeFailures only
	// those in a row).
	totalProbeFailures uint64
	admittedAt         time.Time // last readmission
	// slowReadRounds and slowProbeRounds count the probe rounds in a row
	// at which the latency rule, or the probe-RTT rule, held.
	slowReadRounds, slowProbeRounds int
	// readTotal and readCount sum the read samples the EWMA gets: at load a
	// round's mean over them is the latency rule's signal, where the EWMA
	// holds the last few reads only. roundTotal and roundCount are their
	// values at the last round.
	readTotal, readCount   atomic.Int64
	roundTotal, roundCount int64
	// stalled counts the rounds in a row at which the member answered no
	// call (OK, AppError or a fault) while it held calls or its callers
	// gave up on some; lastAnswered and lastGaveUp are the counts at the
	// round before.
	stalled                  int
	lastAnswered, lastGaveUp uint64

	_ [64]byte // keep neighbours' hot counters off this cache line
}

// snapshot is the immutable routing state read by Pick.
type snapshot struct {
	leader    int   // index into members, -1 when unknown
	reachable []int // members taking traffic, in member order
	pool      []int // reachable members in the read pool
	local     []int // pool members in the client's zone
	ejected   []int // out of the read pool on reads' evidence: they get the probe share
	benched   []int // out of the read pool on probes' evidence: no reads at all
	// unfit are the reachable members whose probes bench them, beyond the
	// cap too: they keep their place in the read pool when the cap says so,
	// but they hold no sessions or streams (Serves).
	unfit   []int
	serving []int // reachable and not unfit: where leader-bound calls fall back
	sticky  int   // the sticky policy's member
	inPool  []bool
}

// New validates cfg, starts probing the members in the background and
// returns the router. Until the first probe answers, every member counts as
// reachable and the leader as unknown.
func New(cfg Config) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Members = slices.Clone(cfg.Members)
	r := &Router{
		cfg:        cfg,
		lastLeader: -1, announcedLeader: -1,
		refreshc: make(chan struct{}, 1),
		done:     make(chan struct{}),
		epoch:    cfg.Clock.Now(),
	}
	_, r.sysTime = cfg.Clock.(systemClock)
	r.kind = kindOf(cfg.Policy)
	if cfg.Hedge != nil {
		r.hedge = newHedger(*cfg.Hedge)
	}
	for op := range Op(numOps) {
		// Reading the clock costs more than the rest of Pick, so only the
		// classes whose latency the policy uses are timed.
		r.timed[op] = (r.kind == hybridKind && op.IsRead()) || (r.kind == boltzmannKind && op != Stream)
	}
	r.rnd.Store(cfg.Seed)
	r.seeded = cfg.Seed != 0
	// Every client starts its rotations at a random member: a fleet whose
	// cursors all started at 0 would open every first stream on member 0.
	r.rr.Store(r.random())
	ro := &roster{members: cfg.Members, retired: make([]bool, len(cfg.Members))}
	for range cfg.Members {
		ro.health = append(ro.health, r.newHealth())
	}
	r.ros.Store(ro)
	sticky := int(r.random() % uint64(len(cfg.Members)))
	if cfg.StickyMember != "" {
		sticky = r.indexOf(cfg.StickyMember)
	}
	all := make([]int, len(cfg.Members))
	for i := range all {
		all[i] = i
	}
	r.snap.Store(r.buildSnapshot(-1, all, nil, nil, sticky))

	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.loop(ctx)
	return r, nil
}

// roster is the router's member list. Its slices are never changed in
// place: SetMembers publishes a new roster.
type roster struct {
	members []Member
	health  []*memberHealth
	retired []bool // removed by SetMembers: never picked, probed or leader
	// hist holds each member's read latency observer once Collector has
	// been called; nil before (Pick and Done then skip it).
	hist []prometheus.Observer
}

func (r *Router) roster() *roster { return r.ros.Load() }

// newHealth returns a member's initial health.
// sample adds a read latency sample to the member's estimates.
func (h *memberHealth) sample(d time.Duration) {
	h.read.Add(d)
	h.readTotal.Add(int64(d))
	h.readCount.Add(1)
}

func (r *Router) newHealth() *memberHealth {
	h := &memberHealth{}
	h.read, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	h.all, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	h.probe, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	r.updateWeight(h)
	return h
}

// Members returns the current members, retired ones left out.
func (r *Router) Members() []Member {
	ro := r.roster()
	var out []Member
	for i, m := range ro.members {
		if !ro.retired[i] {
			out = append(out, m)
		}
	}
	return out
}

// Member returns the member at stable index idx (the index Pick.Index,
// Stats and Busy use; retired members keep theirs). ok is false for an
// index the router never had and for a retired member.
func (r *Router) Member(idx int) (m Member, ok bool) {
	ro := r.roster()
	if idx < 0 || idx >= len(ro.members) || ro.retired[idx] {
		return Member{}, false
	}
	return ro.members[idx], true
}

// Policy returns the policy's name.
func (r *Router) Policy() string { return r.cfg.Policy }

// Close stops the background prober and waits for it. Later Picks fail with
// ErrClosed. Close is idempotent.
func (r *Router) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.cancel()
	<-r.done
	return nil
}

// Refresh asks for an immediate probe round without waiting for it.
func (r *Router) Refresh() {
	select {
	case r.refreshc <- struct{}{}:
	default:
	}
}

// Pick is the router's choice for one operation. Call Done exactly once when
// the operation ends.
type Pick struct {
	// Member is the chosen member.
	Member Member
	// Index is Member's position in Config.Members.
	Index int

	r            *Router
	op           Op
	start        time.Duration // since r.epoch; 0 when the policy ignores latency
	leaderPinned bool
	probing      bool   // an ejected member's probe-share read
	inflight     bool   // counted in the member's inflight (LoadAware)
	hedge        bool   // a hedge's pick: its latency is no sample of the pool's
	observe      bool   // a read whose latency goes to the histogram
	busyEpoch    uint64 // the member's busyEpoch at the pick, for timed ops
}

// Pick chooses a member for an operation of class op. It never blocks and,
// without per-call overrides, never allocates. It fails only when the
// router is closed or an override names an unknown member.
func (r *Router) Pick(ctx context.Context, op Op) (Pick, error) {
	if r.closed.Load() {
		return Pick{}, ErrClosed
	}
	s := r.snap.Load()
	p := Pick{Index: -1, r: r, op: op}
	if o, ok := overrideFrom(ctx); ok {
		switch {
		case o.member != "":
			p.Index = r.indexOf(o.member)
			switch {
			case p.Index < 0 && o.prefer && r.wasMember(o.member):
				// A preference for a member since retired (a stream that
				// resumes where it started) falls back to the pool.
			case p.Index < 0:
				return Pick{}, fmt.Errorf("%w: %q", ErrUnknownMember, o.member)
			case o.prefer && !s.has(p.Index):
				// Not in the read pool, or added since this snapshot.
				p.Index = -1
			}
		default:
			p.Index, p.leaderPinned = r.toLeader(s)
		}
	}
	if p.Index < 0 {
		r.choose(s, &p)
	}
	ro := r.roster()
	h := ro.health[p.Index]
	h.ops[op].Add(1)
	if r.cfg.LoadAware && op.IsRead() {
		h.inflight.Add(1)
		p.inflight = true
	}
	if r.hedge != nil && op.IsRead() {
		if slot, ok := ctx.Value(attemptKey{}).(*attemptSlot); ok {
			slot.idx.Store(int32(p.Index))
			p.hedge = slot.hedge
		}
	}
	p.Member = ro.members[p.Index]
	p.busyEpoch = h.busyEpoch.Load()
	p.observe = op.IsRead() && ro.hist != nil
	if r.timed[op] || p.observe {
		p.start = r.elapsed()
	}
	return p, nil
}

// policyKind is the policy resolved once at New, so that the hot path
// switches on a small integer rather than comparing strings.
type policyKind uint8

const (
	hybridKind policyKind = iota
	roundRobinKind
	leaderOnlyKind
	stickyKind
	boltzmannKind
)

func kindOf(policy string) policyKind {
	switch policy {
	case RoundRobin:
		return roundRobinKind
	case LeaderOnly:
		return leaderOnlyKind
	case Sticky:
		return stickyKind
	case Boltzmann:
		return boltzmannKind
	}
	return hybridKind
}

// elapsed returns the time since r.epoch. With the system clock it reads
// only the monotonic clock: time.Now reads the wall clock too, which doubles
// the cost on the hot path.
func (r *Router) elapsed() time.Duration {
	if r.sysTime {
		return time.Since(r.epoch)
	}
	return r.cfg.Clock.Now().Sub(r.epoch)
}

// Done reports how the operation ended; call it exactly once. The router
// alone decides what each outcome changes:
//   - OK and AppError: a latency sample (for the classes the policy times)
//     and the end of the member's failure streak.
//   - MemberFault: counts toward the failure rule (reads) and boltzmann's
//     penalty; a write pinned to the current leader clears it and asks for
//     a re-probe (a failure at a leader that is no longer current does not).
//   - Overloaded: as MemberFault, but never clears the leader.
//   - CallerGaveUp: no failure. A read cut after d is censored evidence that
//     the member takes at least d; it becomes a sample only when d is far
//     above the other members' median latency (EjectRatio and MinEjectGap),
//     so that a caller's short deadline punishes nobody.
//   - NotSent: takes the pick back: not counted, no sample.
//
// Streams are never latency samples: their lifetime is not a latency.
func (p Pick) Done(o Outcome) {
	r := p.r
	if r == nil {
		return
	}
	h := r.roster().health[p.Index]
	if p.inflight {
		h.inflight.Add(-1)
	}
	if o == NotSent {
		h.ops[p.op].Add(^uint64(0))
		return
	}
	if h.busy.Load() > 0 || h.busyEpoch.Load() != p.busyEpoch {
		// It overlapped maintenance the client asked for: whatever it shows
		// is the maintenance, not the member's health.
		h.ignored[p.op].Add(1)
		return
	}
	timed := r.timed[p.op]
	var latency time.Duration
	if timed || p.observe {
		latency = r.elapsed() - p.start
	}
	switch o {
	case CallerGaveUp:
		h.gaveUp[p.op].Add(1)
		if timed {
			r.censored(h, p, latency)
		} else if p.op == Write {
			// Writes are not timed: one cut by its caller is evidence
			// enough to look (a frozen leader answers nothing).
			r.unsettleIfSettled()
		}
		return
	case MemberFault, Overloaded:
		h.errs[p.op].Add(1)
		h.consecutiveFailures.Add(1)
		r.unsettleIfSettled()
		if p.op.IsRead() {
			if r.hedge != nil {
				r.hedge.earn(-1000) // gRFC A6's throttle: a failing pool gets no hedges
			}
			h.readFails.Add(1)
			h.readFailStreak.Add(1)
			if p.probing {
				h.freshInLine.Store(0)
			}
		}
		if timed && r.kind == boltzmannKind {
			// Errors inflate the estimate so that traffic shifts away.
			h.all.Add(max(latency, 4*h.all.Value(), 10*r.cfg.InitialLatency))
			r.updateWeight(h)
		}
		if o == MemberFault && p.leaderPinned && p.op != Stream {
			r.forgetLeader(p.Index)
		}
		return
	}
	// OK or AppError: the member answered. Stores only when something is
	// to be cleared: a store on every success would bounce the cache line.
	h.oks[p.op].Add(1)
	if h.consecutiveFailures.Load() != 0 {
		h.consecutiveFailures.Store(0)
	}
	if p.op.IsRead() && h.readFailStreak.Load() != 0 {
		h.readFailStreak.Store(0)
	}
	if p.observe {
		r.roster().hist[p.Index].Observe(latency.Seconds())
	}
	if !timed {
		return
	}
	if r.kind == boltzmannKind {
		// Only the blended signal: the read estimate serves hybrid's read
		// pool, and every extra atomic update here is contended across cores.
		h.all.Add(latency)
		r.updateWeight(h)
		return
	}
	h.sample(latency)
	if r.hedge != nil && p.op.IsRead() && !p.probing && !p.hedge {
		r.hedge.rings[p.op].add(latency)
	}
	if p.probing {
		if r.inLine(latency, time.Duration(r.readMedian.Load()), r.cfg.MinEjectGap) {
			h.freshInLine.Add(1)
		} else {
			h.freshInLine.Store(0)
		}
	}
}

// censored folds in a read the caller gave up on after d: the member took
// at least d. Only a d far above the others' median says anything; then d
// itself (a lower bound) is the sample.
func (r *Router) censored(h *memberHealth, p Pick, d time.Duration) {
	if r.kind == boltzmannKind {
		if d > h.all.Value() {
			h.all.Add(d)
			r.updateWeight(h)
		}
		return
	}
	median := time.Duration(r.readMedian.Load())
	if median <= 0 || !r.farAbove(d, median) {
		return
	}
	h.sample(d)
	r.unsettleIfSettled()
	if p.probing {
		h.freshInLine.Store(0)
	}
}

// farAbove reports whether v is far above median: beyond EjectRatio times
// it and by more than MinEjectGap.
func (r *Router) farAbove(v, median time.Duration) bool {
	return float64(v) > r.cfg.EjectRatio*float64(median) && v-median > r.cfg.MinEjectGap
}

// inLine reports whether v is in line with median: within ReadmitRatio
// times it, or within gap of it (MinEjectGap for reads, MinProbeEjectGap
// for probes: what could not have ejected is in line).
func (r *Router) inLine(v, median, gap time.Duration) bool {
	return float64(v) <= r.cfg.ReadmitRatio*float64(median) || v-median <= gap
}

// Busy marks member idx as busy with maintenance the client itself asked
// for (etcd's Defragment, during which the member serves nothing): until
// the returned func is called the member takes no reads, and what its reads
// and probes show meanwhile is no evidence — a planned pause is not a grey
// failure, and it is not counted as an ejection. The func is idempotent.
func (r *Router) Busy(idx int) (end func()) {
	h := r.roster().health[idx]
	r.mu.Lock()
	h.busy.Add(1)
	h.busyEpoch.Add(1)
	r.rebenchLocked()
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			h.busy.Add(-1)
			h.busyEpoch.Add(1)
			r.rebenchLocked()
			r.mu.Unlock()
		})
	}
}

// rebenchLocked rebuilds the snapshot with the benched members recomputed
// and everything else as it is (buildSnapshot keeps the minority cap: a
// busy member may take an ejected one's place out of the pool until the
// next round judges them again). Caller must hold r.mu.
func (r *Router) rebenchLocked() {
	r.evidence.Store(true) // probes follow the member through its maintenance
	s := r.snap.Load()
	r.snap.Store(r.buildSnapshot(s.leader, s.reachable, s.ejected, r.benchedLocked(s.reachable, s.leader), s.sticky))
}

// readsEnded counts the member's reads that ended, whatever the outcome
// but NotSent: unlike ops, which counts picks and gives a NotSent one back,
// it never falls, so that the failure window's deltas stay true.
func (h *memberHealth) readsEnded() uint64 {
	var n uint64
	for _, op := range [...]Op{LinearizableRead, StaleRead} {
		n += h.oks[op].Load() + h.errs[op].Load() + h.gaveUp[op].Load()
	}
	return n
}

// Abandon takes back a Pick whose operation was never sent: Done(NotSent).
func (p Pick) Abandon() { p.Done(NotSent) }

// ProbeBudget is how long a probe-share read (one the router sends to an
// ejected member to see whether it has recovered) may take before it has
// shown that the member is still far out of line: twice the ejection
// threshold over the other members' median. It is 0 for every other pick,
// and while no median is known. A backend that can send the read elsewhere
// cuts it there, reports Done(CallerGaveUp) (censored evidence, enough to
// keep the member out) and tries the pool, so that a member still out of
// line costs the caller this delay, never a failed read.
func (p Pick) ProbeBudget() time.Duration {
	if !p.probing || p.r == nil {
		return 0
	}
	median := time.Duration(p.r.readMedian.Load())
	if median <= 0 {
		return 0
	}
	return 2 * max(time.Duration(p.r.cfg.EjectRatio*float64(median)), median+p.r.cfg.MinEjectGap)
}

// choose applies the policy to p.op and fills p's member index and flags.
func (r *Router) choose(s *snapshot, p *Pick) {
	switch r.kind {
	case roundRobinKind:
		p.Index = r.rotate(s.reachable)
	case leaderOnlyKind:
		p.Index, p.leaderPinned = r.toLeader(s)
	case stickyKind:
		p.Index = s.sticky
	case boltzmannKind:
		p.Index = r.boltzmann(s)
	default: // hybridKind
		if p.op == Write {
			p.Index, p.leaderPinned = r.toLeader(s)
			return
		}
		p.Index, p.probing = r.fromPool(s, p.op)
	}
}

// Home returns the member a client's long-lived, session-bound traffic
// belongs on (a ZooKeeper session that owns ephemerals): the sticky member
// under the sticky policy, otherwise the known leader, where that traffic's
// writes commit. ok is false when the leader is unknown.
func (r *Router) Home() (idx int, ok bool) {
	s := r.snap.Load()
	if r.kind == stickyKind {
		return s.sticky, true
	}
	return s.leader, s.leader >= 0
}

// Leader returns the member writes are pinned to; ok is false while the
// leader is unknown.
func (r *Router) Leader() (idx int, ok bool) {
	l := r.snap.Load().leader
	return l, l >= 0
}

// Reachable reports whether member idx answers its probes and serves.
func (r *Router) Reachable(idx int) bool {
	return slices.Contains(r.snap.Load().reachable, idx)
}

// Serves reports whether member idx can hold long-lived streams: it is
// reachable and its probes show nothing that stops it serving (no leader,
// an older term, a large apply lag). A member ejected for slowness still
// serves; backends move streams only off members that do not.
func (r *Router) Serves(idx int) bool {
	s := r.snap.Load()
	return slices.Contains(s.serving, idx)
}

// WaitProbed waits until the leader is known or every member has answered
// a probe, so that routing is right from the first call. It fails with
// ErrUnreachable only if no member answers within timeout; if some did, it
// returns nil (the leader may come later).
func (r *Router) WaitProbed(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st := r.Stats()
		answered := 0
		for _, m := range st.Members {
			if m.ProbeOK {
				answered++
			}
		}
		switch {
		case st.Leader != "" || answered == len(st.Members):
			return nil
		case time.Now().After(deadline):
			if answered > 0 {
				return nil
			}
			return fmt.Errorf("%w: no member answered within %v", ErrUnreachable, timeout)
		}
		time.Sleep(5 * time.Millisecond) // a start-up wait, not on any hot path
	}
}

func (r *Router) toLeader(s *snapshot) (int, bool) {
	if s.leader >= 0 {
		return s.leader, true
	}
	r.fallbacks.Add(1)
	if len(s.serving) > 0 {
		// Not to a member that has no leader or is under maintenance: it
		// would hold the call until the caller gives up.
		return r.rotate(s.serving), false
	}
	return r.rotate(s.reachable), false
}

// rotate returns the next member of set, which must not be empty (every
// snapshot has a reachable member, and keeps one in the pool).
func (r *Router) rotate(set []int) int {
	return set[(r.rr.Add(1)-1)%uint64(len(set))]
}

// fromPool spreads reads and streams over the read pool, giving each
// ejected member its probe share of reads so that a recovery shows in its
// estimate (probing). A stream, which stays where it starts, never goes to
// an ejected member; nor does a stale read that has pool members in the
// client's zone, which it stays in (linearizable reads give the evidence).
func (r *Router) fromPool(s *snapshot, op Op) (idx int, probing bool) {
	if len(s.ejected) > 0 && op != Stream && (op != StaleRead || len(s.local) == 0) {
		share := r.cfg.ProbeShare * float64(len(s.ejected))
		if u := r.uniform(); u < share {
			return s.ejected[int(u/r.cfg.ProbeShare)%len(s.ejected)], true
		}
	}
	if op == StaleRead && len(s.local) > 0 {
		return r.choosePool(s.local), false
	}
	return r.choosePool(s.pool), false
}

// choosePool picks one of set, members of the read pool: the next in the
// rotation, or under LoadAware the less loaded of two drawn at random
// (power of two choices over read EWMA × (reads in flight + 1), as
// Finagle's and Envoy's peak-EWMA balancers): a member with half the
// capacity, or farther away, gets fewer reads instead of the same share,
// and no member takes them all, as choosing the best of every member would.
func (r *Router) choosePool(set []int) int {
	if !r.cfg.LoadAware || len(set) == 1 {
		return r.rotate(set)
	}
	n := uint64(len(set))
	a := r.random() % n
	b := r.random() % (n - 1)
	if b >= a {
		b++
	}
	i, j := set[a], set[b]
	if r.uniform() < r.cfg.ProbeShare {
		// A member that lost every draw while idle keeps its old estimate;
		// its probe share of picks keeps that estimate fresh.
		return i
	}
	if r.load(j) < r.load(i) {
		return j
	}
	return i
}

// load is member i's read cost as P2C sees it.
func (r *Router) load(i int) float64 {
	h := r.roster().health[i]
	return float64(h.read.Value()) * float64(h.inflight.Load()+1)
}

// maxExponent keeps exp(−EWMA/τ) above float64's underflow: members slower
// than this many temperatures all weigh the same (tiny) amount.
const maxExponent = 700

// updateWeight recomputes boltzmann's weight for h after its EWMA moved.
func (r *Router) updateWeight(h *memberHealth) {
	x := min(float64(h.all.Value())/float64(r.cfg.Temperature), maxExponent)
	h.weight.Store(math.Float64bits(math.Exp(-x)))
}

// boltzmann draws a member with probability ∝ exp(−EWMA/τ), the softmax of
// the members' negated latency estimates; members past the failure
// threshold keep a near-zero weight.
func (r *Router) boltzmann(s *snapshot) int {
	var weights [16]float64
	set := s.reachable
	if len(set) > len(weights) {
		return r.rotate(set)
	}
	sum := 0.0
	for k, i := range set {
		h := r.roster().health[i]
		w := math.Float64frombits(h.weight.Load())
		if h.consecutiveFailures.Load() > int64(r.cfg.FailureThreshold) {
			w *= 1e-9
		}
		weights[k] = w
		sum += w
	}
	u := r.uniform() * sum
	for k, i := range set {
		if u < weights[k] {
			return i
		}
		u -= weights[k]
	}
	return set[len(set)-1]
}

// random returns a uniformly random uint64: the next splitmix64 value of
// the router's seeded cursor, or, unseeded, one from Go's generator, which
// keeps its state per thread and so costs no contention.
func (r *Router) random() uint64 {
	if !r.seeded {
		return rand.Uint64()
	}
	z := r.rnd.Add(0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a float64 in [0, 1).
func (r *Router) uniform() float64 { return float64(r.random()>>11) / (1 << 53) }

// wasMember reports whether id names a retired member.
func (r *Router) wasMember(id string) bool {
	ro := r.roster()
	for i := range ro.members {
		if ro.members[i].ID == id && ro.retired[i] {
			return true
		}
	}
	return false
}

func (r *Router) indexOf(id string) int {
	ro := r.roster()
	for i := range ro.members {
		if ro.members[i].ID == id && !ro.retired[i] {
			return i
		}
	}
	return -1
}

// errRetired is a retired member's probe outcome: it is not probed.
var errRetired = errors.New("router: member retired")

// SetMembers changes the member set to ms, as New's Config.Members: a
// member whose address is already known keeps its index and its health
// (its ID and zone are updated); a new one is added and takes traffic only
// after its first good probe; a member whose address is not in ms is
// retired: it gets no new picks (calls in flight finish), is no longer
// probed, and is left out of the metrics; Stats lists it (indexes never
// move) with Retired set. It
// fails, changing nothing, on an empty list or two members with one
// address.
func (r *Router) SetMembers(ms []Member) error {
	if len(ms) == 0 {
		return ErrNoMembers
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if m.Addr == "" {
			return fmt.Errorf("%w: member %q has no address", ErrInvalidConfig, m.ID)
		}
		if seen[m.Addr] {
			return fmt.Errorf("%w: %q", ErrDuplicateMember, m.Addr)
		}
		seen[m.Addr] = true
	}
	r.mu.Lock()
	old := r.roster()
	ro := &roster{members: slices.Clone(old.members), health: slices.Clone(old.health), retired: slices.Clone(old.retired), hist: slices.Clone(old.hist)}
	keep := map[string]bool{}
	for _, m := range ms {
		i := slices.IndexFunc(ro.members, func(o Member) bool { return o.Addr == m.Addr })
		for i >= 0 && ro.retired[i] { // a live one added since?
			j := slices.IndexFunc(ro.members[i+1:], func(o Member) bool { return o.Addr == m.Addr })
			if j < 0 {
				i = -1
				break
			}
			i += 1 + j
		}
		if i >= 0 {
			ro.members[i] = m
			keep[m.Addr] = true
			continue
		}
		h := r.newHealth()
		h.added = true
		ro.members = append(ro.members, m)
		ro.health = append(ro.health, h)
		ro.retired = append(ro.retired, false)
		if ro.hist != nil {
			ro.hist = append(ro.hist, r.latency.WithLabelValues(m.ID))
		}
		keep[m.Addr] = true
	}
	for i, m := range ro.members {
		if !keep[m.Addr] {
			ro.retired[i] = true
		}
	}
	r.ros.Store(ro)
	// The snapshot of the old roster stays valid (indexes never move) until
	// the round that Refresh asks for drops the retired members.
	s := r.snap.Load()
	reachable := slices.DeleteFunc(slices.Clone(s.reachable), func(i int) bool { return ro.retired[i] })
	if len(reachable) == 0 {
		for i := range ro.members {
			if !ro.retired[i] {
				reachable = append(reachable, i)
			}
		}
	}
	leader := s.leader
	if leader >= 0 && ro.retired[leader] {
		leader = -1
	}
	sticky := s.sticky
	if ro.retired[sticky] {
		sticky = reachable[0]
	}
	r.snap.Store(r.buildSnapshot(leader, reachable, slices.DeleteFunc(slices.Clone(s.ejected), func(i int) bool { return ro.retired[i] }), slices.DeleteFunc(slices.Clone(s.unfit), func(i int) bool { return ro.retired[i] }), sticky))
	r.mu.Unlock()
	r.Unsettle()
	return nil
}

// forgetLeader clears the cached leader if it is still idx, and asks for an
// immediate re-probe. Writes fall back to round robin meanwhile. A failure
// at a member that is no longer the leader changes nothing: it must not
// cost the current leader its place.
func (r *Router) forgetLeader(idx int) {
	r.mu.Lock()
	s := r.snap.Load()
	if s.leader != idx {
		r.mu.Unlock()
		return
	}
	h := r.roster().health[idx]
	h.forgotten, h.forgottenAt = true, r.forgets.Add(1)
	r.snap.Store(r.buildSnapshot(-1, s.reachable, s.ejected, s.unfit, s.sticky))
	r.mu.Unlock()
	r.Unsettle()
}

// buildSnapshot assembles a snapshot; it is the only place one is built,
// so the minority cap holds on every path (probe rounds, Busy, SetMembers,
// forgetLeader). benched and ejected name the members out of the read pool
// in order of precedence (benched ones beyond the cap stay in the pool but
// are unfit: they hold no sessions or streams) (benchedLocked puts busy members first,
// ejectionsLocked the most severe first); members not reachable are
// dropped. Of the n reachable members at most ⌊(n−1)/2⌋ are kept out, the
// first in that order: the rest stay in the pool, which is so never empty.
func (r *Router) buildSnapshot(leader int, reachable, ejected, benched []int, sticky int) *snapshot {
	ro := r.roster()
	s := &snapshot{leader: leader, reachable: reachable, sticky: sticky, inPool: make([]bool, len(ro.members))}
	room := (len(reachable) - 1) / 2
	out := func(from []int, to *[]int) { // kept in precedence order, for the paths that rebuild from it
		for _, i := range from {
			if room > 0 && slices.Contains(reachable, i) && !slices.Contains(s.benched, i) && !slices.Contains(s.ejected, i) {
				*to = append(*to, i)
				room--
			}
		}
	}
	out(benched, &s.benched)
	out(ejected, &s.ejected)
	for _, i := range reachable {
		if slices.Contains(benched, i) {
			s.unfit = append(s.unfit, i)
		} else {
			s.serving = append(s.serving, i)
		}
		if !slices.Contains(s.benched, i) && !slices.Contains(s.ejected, i) {
			s.inPool[i] = true
			s.pool = append(s.pool, i)
			if r.cfg.ClientZone != "" && ro.members[i].Zone == r.cfg.ClientZone {
				s.local = append(s.local, i)
			}
		}
	}
	return s
}

// has reports whether member i is in the read pool; false for an index
// added to the roster after s was built.
func (s *snapshot) has(i int) bool { return i >= 0 && i < len(s.inPool) && s.inPool[i] }
