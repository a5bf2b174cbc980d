package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oproute/oproute/internal/override"
)

// Pick is the router's choice for one operation. Call Done exactly once when
// the operation ends.
type Pick struct {
	// Member is the chosen member.
	Member Member
	// Index is Member's position in Config.Members.
	Index int

	r            *Router
	op           Op
	start        time.Duration // since r.epoch; 0 when neither the policy nor a histogram needs the latency
	leaderPinned bool
	probing      bool   // an ejected member's probe-share read
	inflight     bool   // counted in the member's inflight (LoadAware, least_cost)
	queued       int64  // reads in flight on the member at the pick, this one included (least_cost)
	hedge        bool   // a hedge's pick: its latency is no sample of the pool's
	observe      bool   // a read or write whose latency goes to a histogram
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
	if o, ok := override.From(ctx); ok {
		switch {
		case o.Member != "":
			p.Index = r.indexOf(o.Member)
			switch {
			case p.Index < 0 && o.Prefer && r.wasMember(o.Member):
				// A preference for a member since retired (a stream that
				// resumes where it started) falls back to the pool.
			case p.Index < 0:
				return Pick{}, fmt.Errorf("%w: %q", ErrUnknownMember, o.Member)
			case o.Prefer && !s.has(p.Index):
				// Not in the read pool, or added since this snapshot.
				p.Index = -1
			}
		default:
			p.Index, p.leaderPinned = r.toLeader(s)
		}
	}
	if p.Index < 0 {
		p.Index, p.leaderPinned, p.probing = r.policy.choose(r, s, op)
	}
	ro := r.roster()
	h := ro.health[p.Index]
	h.ops[op].Add(1)
	if r.countsInflight && op.IsRead() {
		p.queued = h.inflight.Add(1)
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
	p.observe = (op.IsRead() || op == Write) && ro.hist != nil
	if r.timed[op] || p.observe {
		p.start = r.elapsed()
	}
	return p, nil
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
			r.policy.gaveUp(r, h, p, latency)
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
		if timed {
			r.policy.failed(r, h, p, latency)
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
		if ro := r.roster(); p.op == Write {
			ro.writeHist[p.Index].Observe(latency.Seconds())
		} else {
			ro.hist[p.Index].Observe(latency.Seconds())
		}
	}
	if !timed {
		return
	}
	r.policy.answered(r, h, p, latency)
	if r.rule == nil {
		return
	}
	if r.hedge != nil && p.op.IsRead() && !p.probing && !p.hedge {
		r.hedge.rings[p.op].add(latency)
	}
	if p.probing {
		if r.readInLine(latency) {
			h.freshInLine.Add(1)
		} else {
			h.freshInLine.Store(0)
		}
	}
}

// censored folds in a read the caller gave up on after d: the member took
// at least d. Only a d far above the others' median says anything; then d
// itself (a lower bound) is the sample, and censored reports true.
func (r *Router) censored(h *memberHealth, p Pick, d time.Duration) bool {
	median := time.Duration(r.readMedian.Load())
	if median <= 0 || !r.farAbove(d, median) {
		return false
	}
	h.sample(d)
	h.readStalls.Add(1)
	r.unsettleIfSettled()
	if p.probing {
		h.freshInLine.Store(0)
	}
	return true
}

// farAbove reports whether v is far above median: beyond EjectRatio times
// it and by more than MinEjectGap.
func (r *Router) farAbove(v, median time.Duration) bool {
	return float64(v) > r.cfg.EjectRatio*float64(median) && v-median > r.cfg.MinEjectGap
}

// inLine reports whether a probe RTT v is in line with median: within
// ReadmitRatio times it, or within gap (MinProbeEjectGap: what could not
// have ejected is in line).
func (r *Router) inLine(v, median, gap time.Duration) bool {
	return float64(v) <= r.cfg.ReadmitRatio*float64(median) || v-median <= gap
}

// readInLine reports whether an ejected member's probe-share read of v is in
// line with the pool: within ReadmitRatio times the share-fair median, or
// within MinEjectGap of the median (a few milliseconds more is topology,
// never a grey failure).
func (r *Router) readInLine(v time.Duration) bool {
	median, fair := time.Duration(r.readMedian.Load()), time.Duration(r.fairMedian.Load())
	return float64(v) <= r.cfg.ReadmitRatio*float64(fair) || v-median <= r.cfg.MinEjectGap
}

// Abandon takes back a Pick whose operation was never sent: Done(NotSent).
func (p Pick) Abandon() { p.Done(NotSent) }

// probeBudget is Backend.ProbeBudget.
func (p Pick) probeBudget() time.Duration {
	if !p.probing || p.r == nil {
		return 0
	}
	median := time.Duration(p.r.readMedian.Load())
	if median <= 0 {
		return 0
	}
	return 2 * max(time.Duration(p.r.cfg.EjectRatio*float64(median)), median+p.r.cfg.MinEjectGap)
}

// choosePooled is a read pool's choice: writes to the leader, the rest
// from the pool (fromPool).
func (r *Router) choosePooled(s *snapshot, op Op, cheapest bool) (idx int, pinned, probing bool) {
	if op == Write {
		idx, pinned = r.toLeader(s)
		return idx, pinned, false
	}
	idx, probing = r.fromPool(s, op, cheapest)
	return idx, false, probing
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
// cheapest: a linearizable read goes where the read-cost model prices it
// cheapest (least_cost), else as choosePool spreads it.
func (r *Router) fromPool(s *snapshot, op Op, cheapest bool) (idx int, probing bool) {
	if len(s.ejected) > 0 && op != Stream && (op != StaleRead || len(s.local) == 0) {
		share := r.cfg.ProbeShare * float64(len(s.ejected))
		if u := r.uniform(); u < share {
			return s.ejected[int(u/r.cfg.ProbeShare)%len(s.ejected)], true
		}
	}
	if op == StaleRead && len(s.local) > 0 {
		return r.choosePool(s.local), false
	}
	if op == LinearizableRead && cheapest {
		return r.cheapest(s.pool), false
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
