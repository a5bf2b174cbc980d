package router

import (
	"math"
	"time"
)

// policy is what differs between the routing policies: where a pick
// goes, what an answer teaches it, and, for a policy with a read pool, the
// latency rule that takes a member out of the pool. One value per Router,
// chosen at New; everything else (leader tracking, probes, the failure and
// probe rules, the minority cap, the bounded return) is the same for all.
type policy interface {
	// choose returns the member for an operation of class op from s, and
	// whether it went to the leader as such (pinned) or to an ejected
	// member for its probe share (probing). Values, not a *Pick: a
	// pointer passed through an interface escapes, and Pick must not
	// allocate.
	choose(r *Router, s *snapshot, op Op) (idx int, pinned, probing bool)
	// timed reports whether op's latencies feed the policy: the clock is
	// read only for those.
	timed(op Op) bool
	// countsInflight reports whether the policy needs reads in flight
	// per member.
	countsInflight() bool
	// home is where session-bound traffic belongs (Backend.Home).
	home(s *snapshot) (int, bool)
	// answered folds in a timed operation the member answered after
	// latency.
	answered(r *Router, h *memberHealth, p Pick, latency time.Duration)
	// failed folds in a timed operation the member failed after latency.
	failed(r *Router, h *memberHealth, p Pick, latency time.Duration)
	// gaveUp folds in a timed operation its caller cut after d.
	gaveUp(r *Router, h *memberHealth, p Pick, d time.Duration)
	// poolRule is the read pool's latency rule; nil: no read pool, nobody
	// is ejected, and hedging has nowhere to go.
	poolRule() latencyRule
	// describe adds what the policy models of h to its stats.
	describe(h *memberHealth, ms *MemberStats)
}

// latencyRule is how a read pool judges a member's reads. ejectionsLocked
// applies it beside the rules every pool shares.
type latencyRule interface {
	// round runs once a probe round, before the ejections, over the
	// reachable members; troubled: the cluster as a whole is (see
	// clusterTroubleLocked). Caller holds r.mu.
	round(r *Router, reachable []int, troubled bool)
	// slow reports whether h's reads put it out of the pool this round.
	slow(r *Router, h *memberHealth) bool
	// back reports whether h, out for its reads, may return once its
	// ejection time is over and its probes are in line; inLine: its
	// probe-share reads have been.
	back(r *Router, h *memberHealth, now time.Time, inLine bool) bool
	// readmitted resets what the rule models of h as it returns to the
	// pool. Caller holds r.mu.
	readmitted(h *memberHealth)
	// severity is how far out h's reads (read, against the others'
	// median) are, to order candidates under the minority cap.
	severity(h *memberHealth, read, median time.Duration) float64
}

// policyFor returns the policy named name (a Config.Policy, defaults set).
func policyFor(name string) policy {
	switch name {
	case RoundRobin:
		return roundRobin{}
	case LeaderOnly:
		return leaderOnly{}
	case Sticky:
		return sticky{}
	case Boltzmann:
		return boltzmann{}
	case LeastCost:
		return leastCost{}
	}
	return hybrid{}
}

// basePolicy is what a policy does unless it says otherwise: it times
// nothing, learns nothing from latencies and keeps no read pool.
type basePolicy struct{}

func (basePolicy) timed(Op) bool        { return false }
func (basePolicy) countsInflight() bool { return false }
func (basePolicy) home(s *snapshot) (int, bool) {
	return s.leader, s.leader >= 0
}
func (basePolicy) answered(*Router, *memberHealth, Pick, time.Duration) {}
func (basePolicy) failed(*Router, *memberHealth, Pick, time.Duration)   {}
func (basePolicy) gaveUp(*Router, *memberHealth, Pick, time.Duration)   {}
func (basePolicy) poolRule() latencyRule                                { return nil }
func (basePolicy) describe(*memberHealth, *MemberStats)                 {}

// roundRobin rotates every operation over the reachable members.
type roundRobin struct{ basePolicy }

func (roundRobin) choose(r *Router, s *snapshot, _ Op) (int, bool, bool) {
	return r.rotate(s.reachable), false, false
}

// leaderOnly sends everything to the leader.
type leaderOnly struct{ basePolicy }

func (leaderOnly) choose(r *Router, s *snapshot, _ Op) (int, bool, bool) {
	idx, pinned := r.toLeader(s)
	return idx, pinned, false
}

// sticky keeps everything on one member, as ZooKeeper's client does.
type sticky struct{ basePolicy }

func (sticky) choose(_ *Router, s *snapshot, _ Op) (int, bool, bool) { return s.sticky, false, false }
func (sticky) home(s *snapshot) (int, bool)                          { return s.sticky, true }

// boltzmann draws every operation but streams by the members' blended
// latency estimates (Router.boltzmann).
type boltzmann struct{ basePolicy }

func (boltzmann) choose(r *Router, s *snapshot, _ Op) (int, bool, bool) {
	return r.boltzmann(s), false, false
}
func (boltzmann) timed(op Op) bool { return op != Stream }

func (boltzmann) answered(r *Router, h *memberHealth, _ Pick, latency time.Duration) {
	// Only the blended signal: the read estimate serves the read pools,
	// and every extra atomic update here is contended across cores.
	h.all.Add(latency)
	r.updateWeight(h)
}

func (boltzmann) failed(r *Router, h *memberHealth, _ Pick, latency time.Duration) {
	// Errors inflate the estimate so that traffic shifts away.
	h.all.Add(max(latency, 4*h.all.Value(), 10*r.cfg.InitialLatency))
	r.updateWeight(h)
}

func (boltzmann) gaveUp(r *Router, h *memberHealth, _ Pick, d time.Duration) {
	if d > h.all.Value() {
		h.all.Add(d)
		r.updateWeight(h)
	}
}

// hybrid is the paper's rule: writes to the leader, reads spread evenly
// over the read pool (or, LoadAware, by power of two choices); a member
// leaves the pool when its reads run far above the others' median
// (medianRule).
type hybrid struct{ basePolicy }

func (hybrid) choose(r *Router, s *snapshot, op Op) (int, bool, bool) {
	return r.choosePooled(s, op, false)
}
func (hybrid) timed(op Op) bool { return op.IsRead() }
func (hybrid) answered(_ *Router, h *memberHealth, _ Pick, latency time.Duration) {
	h.sample(latency)
}
func (hybrid) gaveUp(r *Router, h *memberHealth, p Pick, d time.Duration) {
	r.censored(h, p, d)
}
func (hybrid) poolRule() latencyRule { return medianRule{} }

// medianRule: a member is out once its reads ran far above the others'
// median for EjectRounds rounds, and back once its probe-share reads are
// in line (ejectionsLocked).
type medianRule struct{}

func (medianRule) round(*Router, []int, bool) {}
func (medianRule) slow(r *Router, h *memberHealth) bool {
	return h.slowReadRounds >= r.cfg.EjectRounds
}
func (medianRule) back(_ *Router, _ *memberHealth, _ time.Time, inLine bool) bool { return inLine }
func (medianRule) readmitted(*memberHealth)                                       {} // readmitLocked resets its EWMA
func (medianRule) severity(_ *memberHealth, read, median time.Duration) float64 {
	return float64(read) / float64(max(median, 1))
}

// leastCost places each linearizable read on the member its read-cost
// model (readCost) prices cheapest, and judges each member against its own
// baseline (judgeRound, readjudge.go); writes and the rest as hybrid.
type leastCost struct{ hybrid }

func (leastCost) choose(r *Router, s *snapshot, op Op) (int, bool, bool) {
	return r.choosePooled(s, op, true)
}
func (leastCost) countsInflight() bool { return true }

// costSample reports whether p's latency is a sample of the read-cost
// model: a linearizable read's, not a hedge's.
func costSample(p Pick) bool { return p.op == LinearizableRead && !p.hedge }

func (leastCost) answered(_ *Router, h *memberHealth, p Pick, latency time.Duration) {
	h.sample(latency)
	if costSample(p) {
		h.cost.record(p.queued, latency)
	}
}

func (leastCost) failed(_ *Router, h *memberHealth, p Pick, latency time.Duration) {
	if costSample(p) {
		// A member that fails fast keeps few reads in flight and would
		// look cheapest: a failure costs what four reads there are
		// expected to, at the least.
		h.cost.record(p.queued, max(latency, time.Duration(4*h.cost.expected(p.queued))))
	}
}

func (leastCost) gaveUp(r *Router, h *memberHealth, p Pick, d time.Duration) {
	if r.censored(h, p, d) && costSample(p) {
		h.cost.record(p.queued, d)
	}
}
func (leastCost) poolRule() latencyRule { return baselineRule{} }
func (leastCost) describe(h *memberHealth, ms *MemberStats) {
	ms.ReadCost = h.cost.stats()
}

// baselineRule: a member is out while its baseline judge finds it failing
// (judgeRound), and back once it no longer does, or after MaxEjection with
// its probes in line, its baseline forgotten (readmitted): a member
// slower for good is where it is, and the cost model keeps reads off it
// while it is dear.
type baselineRule struct{}

func (baselineRule) round(r *Router, reachable []int, troubled bool) {
	costs := make([]*readCost, 0, len(reachable))
	for _, h := range r.roster().health {
		h.cost.fitLocked()
	}
	for _, i := range reachable {
		costs = append(costs, &r.roster().health[i].cost)
	}
	judgeRound(costs, troubled)
}
func (baselineRule) slow(_ *Router, h *memberHealth) bool { return h.cost.judge.failing }
func (baselineRule) back(r *Router, h *memberHealth, now time.Time, _ bool) bool {
	return !h.cost.judge.failing || now.Sub(h.ejectedAt) >= r.cfg.MaxEjection
}

// readmitted: back after MaxEjection while still found failing, the
// member's baseline is forgotten (slower for good is where it is); back
// because its judge no longer finds it failing, or its failures ended, its
// model restarts from its baseline (readCost.restore).
func (baselineRule) readmitted(h *memberHealth) {
	if h.cost.judge.failing {
		h.cost.judge.rebaseline()
	} else {
		h.cost.restore()
	}
}
func (baselineRule) severity(h *memberHealth, _, _ time.Duration) float64 {
	return h.cost.judge.ratio // times slower than its baseline predicts
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
	return drawWeighted(set, weights[:len(set)], sum, r.uniform())
}

// drawWeighted returns set[k] with probability weights[k] ÷ sum, for u
// drawn uniformly from [0, 1).
func drawWeighted(set []int, weights []float64, sum, u float64) int {
	v := u * sum
	for k, i := range set {
		if v < weights[k] {
			return i
		}
		v -= weights[k]
	}
	return set[len(set)-1]
}
