package router

import "math"

// policyKind is the policy resolved once at New, so that the hot path
// switches on a small integer rather than comparing strings.
type policyKind uint8

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
	case LeastCost:
		return leastCostKind
	}
	return hybridKind
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

const (
	hybridKind policyKind = iota
	roundRobinKind
	leaderOnlyKind
	stickyKind
	boltzmannKind
	leastCostKind
)

// pooled reports whether the policy keeps a read pool: reads spread over
// the healthy members, judged by ejectionsLocked.
func (k policyKind) pooled() bool { return k == hybridKind || k == leastCostKind }
