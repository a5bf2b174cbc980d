package router

import (
	"context"
	"sync/atomic"
	"time"
)

// settleRounds is how many probe rounds in a row must find nothing to watch
// before the router probes at Config.StableProbeInterval.
const settleRounds = 8

// stallTicks is how many rounds in a row a member may answer no call while
// calls to it hang or are given up before that counts as evidence.
const stallTicks = 2

// cadence is the probe rate's state: settled (probing rarely) or not.
type cadence struct {
	calm      int       // probe rounds in a row that found nothing to watch; guarded by Router.mu
	nextProbe time.Time // the next probe round while settled; guarded by Router.mu
	settled   atomic.Bool
	evidence  atomic.Bool   // something seen since the last round calls for probes
	knownTerm atomic.Uint64 // the leader's term by the last probe round
	termSeen  atomic.Uint64 // the newest term Backend.ObserveTerm was told of
}

// round is one turn of the background loop: a probe round when one is due
// (forced by Refresh, not settled, evidence, or the stable wait over), else
// a judgement of the reads alone on the last probes' word.
func (r *Router) round(ctx context.Context, forced bool) {
	if forced || r.probeDue() {
		var skip []bool
		if !forced {
			skip = r.settledSkip()
		}
		r.probeRound(ctx, skip)
		return
	}
	r.apply(nil, r.forgets.Load(), false)
	if r.hedge != nil {
		r.hedge.update()
	}
}

func (r *Router) probeDue() bool {
	if r.cfg.Prober == nil || !r.settled.Load() || r.evidence.Load() {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.cfg.Clock.Now().Before(r.nextProbe)
}

// settledSkip returns the members a round the settled cadence asks for
// need not probe (nil when the router is not settled or evidence is
// pending: every member then). The leader is always probed: its answer is
// what shows a leader change to a client with no traffic. So is a member
// that was picked for calls since its last probe (reads there depend on
// its lag and its leader), and every member once in IdleProbeRounds
// settled rounds (never, if it is negative). An idle client's settled
// rounds then cost the cluster little more than one probe, of the leader.
func (r *Router) settledSkip() []bool {
	if !r.settled.Load() || r.evidence.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ro := r.snap.Load(), r.roster()
	skip := make([]bool, len(ro.members))
	for i, h := range ro.health {
		if ro.retired[i] || i == s.leader || h.picks() != h.picksAtProbe || (r.cfg.IdleProbeRounds > 0 && h.settledSkips+1 >= r.cfg.IdleProbeRounds) {
			continue
		}
		skip[i] = true
		h.settledSkips++
	}
	return skip
}

// unsettle is Backend.Unsettle.
func (r *Router) unsettle() {
	r.evidence.Store(true)
	r.Refresh()
}

// unanswered is Backend.Unanswered.
func (r *Router) unanswered(idx int) {
	r.mu.Lock()
	ro := r.roster()
	if idx >= 0 && idx < len(ro.members) && !ro.retired[idx] {
		if h := ro.health[idx]; h.probeFailures < r.cfg.UnreachableAfter-1 {
			h.probeFailures++
		}
	}
	r.mu.Unlock()
	r.unsettle()
}

// unsettleIfSettled is unsettle for the hot path: it costs one atomic load
// unless the router is settled.
func (r *Router) unsettleIfSettled() {
	if r.settled.Load() {
		r.unsettle()
	}
}

// observeTerm is Backend.ObserveTerm.
func (r *Router) observeTerm(term uint64) {
	if term <= r.knownTerm.Load() {
		return
	}
	for {
		seen := r.termSeen.Load()
		if term <= seen {
			return
		}
		if r.termSeen.CompareAndSwap(seen, term) {
			break
		}
	}
	r.unsettle()
}

// settleLocked updates the cadence after a round that built next. Caller
// must hold r.mu.
func (r *Router) settleLocked(prev, next *snapshot, probed bool, now time.Time) {
	if next.leader >= 0 && probed {
		r.knownTerm.Store(r.leaderTermLocked(next.leader, next.reachable))
	}
	quiet := r.quietLocked(next)
	if !quiet || r.evidence.Swap(false) || (probed && next.leader != prev.leader) || r.cfg.StableProbeInterval <= r.cfg.ProbeInterval {
		r.calm = 0
		r.settled.Store(false)
		return
	}
	if !probed {
		return
	}
	r.calm++
	if r.calm >= settleRounds {
		r.nextProbe = now.Add(r.jitter(r.cfg.StableProbeInterval))
		r.settled.Store(true)
	}
}

// jitter spreads d uniformly over ±20 %.
func (r *Router) jitter(d time.Duration) time.Duration {
	return d*8/10 + time.Duration(r.random()%uint64(d*4/10+1))
}

// quietLocked reports whether next and the members' health leave nothing
// to watch: a leader, every member reachable, serving and in the read
// pool, and none failing, slow, stalled or busy. Caller must hold r.mu.
func (r *Router) quietLocked(next *snapshot) bool {
	ro := r.roster()
	if r.cfg.Prober == nil || next.leader < 0 || len(next.unfit) > 0 || len(next.pool) != len(next.reachable) {
		return false
	}
	live := 0
	for i, h := range ro.health {
		if ro.retired[i] {
			continue
		}
		live++
		if !h.probed || h.probeFailures > 0 || h.busy.Load() > 0 || h.ejected || h.slowReadRounds > 0 || h.slowProbeRounds > 0 ||
			h.readFailStreak.Load() > 0 || h.stalled >= stallTicks {
			return false
		}
	}
	return live == len(next.reachable)
}

// leaderTermLocked is the leader's term: the highest the reachable members
// claim for it (the followers may name it at a newer term than its own
// last answer). Caller must hold r.mu.
func (r *Router) leaderTermLocked(leader int, reachable []int) uint64 {
	term := r.roster().health[leader].lastProbe.Term
	for _, i := range reachable {
		if h := r.roster().health[i]; h.probed && h.lastProbe.LeaderID != "" && r.byServerID(h.lastProbe.LeaderID, reachable) == leader {
			term = max(term, h.lastProbe.Term)
		}
	}
	return term
}

// trackStallsLocked counts, per member, the rounds in a row at which it
// answered no call (other than streams) while it held calls, or its callers
// gave up on some since the round before: a member that stopped answering
// (frozen, cut off) shows no failure, only calls that hang or are cut by
// their callers (and by hedges). Caller must hold r.mu.
func (r *Router) trackStallsLocked() {
	for _, h := range r.roster().health {
		var answered, gaveUp, ignored, picked uint64
		for op := range Op(numOps) {
			if op == Stream {
				continue
			}
			answered += h.oks[op].Load() + h.errs[op].Load()
			gaveUp += h.gaveUp[op].Load()
			ignored += h.ignored[op].Load()
		}
		for op := range Op(numOps) {
			if op != Stream {
				picked += h.ops[op].Load() // after the ends: a call counted ended is counted picked
			}
		}
		held := picked > answered+gaveUp+ignored
		if answered == h.lastAnswered && (held || gaveUp > h.lastGaveUp) {
			h.stalled++
		} else {
			h.stalled = 0
		}
		h.lastAnswered, h.lastGaveUp = answered, gaveUp
	}
}
