package router

import (
	"fmt"
	"math"
	"time"
)

// The baseline judge: a grey failure is a member slower than its own
// baseline predicts, not slower than the others (a far member is slower for
// ever: that is where it is). It runs beside the read-cost model, over the
// same reads, and is least_cost's latency rule: a member it finds failing
// leaves the read pool on latency (ejectionsLocked; its severity under the
// minority cap is how many times slower than its baseline its last round
// was), and comes back once its least ejection time has passed, its probes
// are in line and the judge no longer finds it failing; or, out for
// MaxEjection, with its baseline forgotten, so that a member slower for
// good is not kept out for ever: the cost model then keeps reads off it
// while it is dear.
// Failures and probe verdicts are hybrid's, and so are the invariants.
//
// Each member keeps a baseline: a line like its read-cost fit, but with a
// long memory (baselineHalfLife reads), no prior slope (no floor: where
// reads never queued, the line is flat) and fed only by rounds the judge
// finds healthy, so that a failure is not learned as the new normal.
// A round's evidence on a member is
//
//	z = log(ȳ ÷ ŷ)
//
// with ȳ the mean latency of its reads that ended in the round and ŷ what
// the baseline predicts at their mean reads in flight. What slows every
// member at once (a busy host, a compaction, load from other clients)
// raises every z together: the round's residual is u = z − the other
// judged members' mean z, each weighted by its precision (two members with
// reads in the round at least; with fewer nothing is judged). A failing
// member so raises the others' yardstick, which convicts none of them. u
// is taken as normal with mean 0 while the member is healthy and
// judgeShift (twice as slow as its baseline) once it is not, with variance
// v = σ²/n + τ² + the yardstick's: σ² a read's spread of latency (its
// squared coefficient of variation, learned from rounds of two reads or
// more), n the round's reads, τ² what the model misses from round to
// round, learned from the member's healthy rounds. The judge is Page's
// CUSUM over the log-likelihood ratio of the two,
//
//	S ← max(0, S + (δ ÷ v)(clip(u, ±judgeClip) − δ/2)),  δ = judgeShift
//
// and finds the member failing from when S reaches judgeThreshold (h) until
// it falls below h/2. A round's residual counts at most judgeClip either
// way, and a round adds at most judgeStep (h/3) to S: one stalled round
// cannot convict alone, nor one fast round acquit. Rounds that leave S
// below h/2, their residual below judgeClip, feed the baseline and τ²:
// learning only from rounds that leave S at 0 would bias the baseline low,
// and a round judgeClip out is the first round of a failure as surely as
// one round can say (learned, it would teach the baseline a slope that
// explains the failure away).
//
// Detection delay: a member k times slower than its baseline adds
// min((δ ÷ v)(min(log k, 3δ) − δ/2), h/3) a round; at the degraded
// follower's +8 ms on 1 ms reads (k ≈ 9) with two reads a round on it
// (σ² ≈ 0.28, τ² ≈ 0.05, the yardstick's 0.04: v ≈ 0.23) that is 5.2,
// capped at 4, past h = 12 in 3 rounds (0.75 s at the default
// ProbeInterval). False verdicts: with
// Gaussian residuals Page's CUSUM first crosses h after about e^h · 2v ÷ δ²
// healthy rounds (Siegmund's approximation), 11 hours per member at four
// rounds a second, 0.3 an hour over three members. Latency is not
// Gaussian; TestJudgeFalseVerdictRate checks a log-normal world, and a
// soak on the test bed measures the rate that holds.
//
// Load steps: a round at more reads in flight than the baseline has seen
// adds at most h/3 to S, so that unless S was already past h/6 it is
// learned, and a member whose load rose, its reads on its line, is judged
// against that line from the next round
// (TestJudgeKeepsAMemberThroughALoadStep). A step that makes one member's
// reads e^judgeClip (8×) slower than its baseline predicts, beyond what the
// others' moved, is not learned and is convicted like a failure. least_cost
// does not make such a step while no member is 8 times cheaper than the
// next: it spreads reads as the cheapest member's queue grows, so that its
// reads cost about what the next member's do (TestLeastCostLoadStepEjectsNobody:
// one worker to 64 at once, with followers up to 5.7 times the leader's
// cost, no verdict).
const (
	judgeShift     = math.Ln2
	judgeClip      = 3 * judgeShift
	judgeThreshold = 12
	// judgeStep is the most one round adds to S: convicting takes three
	// rounds, however sure one round looks (a member whose reads hardly
	// vary has a small v, and one stalled round would convict it).
	judgeStep = judgeThreshold / 3
	// judgeCap bounds S, so that a member healed after a long failure
	// comes back within a few rounds of reads in line: S falls by about
	// (δ ÷ v)(δ/2) ≈ 1 a round with reads, and the member is readmitted
	// below h/2: from the cap, 12 such rounds (3 s at the default
	// ProbeInterval, with reads in each round).
	judgeCap         = 1.5 * judgeThreshold
	baselineHalfLife = 2048
	// A baseline is trusted once it holds this many reads; until then every
	// round feeds it and nothing is judged.
	baselineMinWeight = 64
	// readVarPrior is σ² before a round with two reads: a coefficient of
	// variation of 0.5. A round's own spread is clamped to
	// [judgeVarFloor, judgeVarCeiling].
	readVarPrior    = 0.25
	judgeVarFloor   = 0.01
	judgeVarCeiling = 4
	// modelVarPrior is τ² before any healthy round: the residual of a
	// round's mean beyond its reads' noise, in log latency; modelVarFloor
	// its least value, so that a quiet spell does not make the judge
	// hair-triggered.
	modelVarPrior = 0.05
	modelVarFloor = 0.005
	// judgeVarWeight is the weight of a round's sample in σ² and τ²: an
	// exponential average over about 20 rounds.
	judgeVarWeight = 0.05
)

// judgeState is the baseline judge's per-member state, under Router.mu.
type judgeState struct {
	baseline costFit
	readVar  float64 // σ²; 0 until a round with two reads: readVarPrior
	modelVar float64 // τ²; 0 until the first healthy round: modelVarPrior
	excess   float64 // S, at most judgeCap
	failing  bool    // S reached judgeThreshold and has not fallen below half of it
	verdicts uint64  // times S reached judgeThreshold
	ratio    float64 // e^u of the last round judged: times slower than its baseline, beyond what all shared
}

// rebaseline forgets the member's baseline: its next reads teach it anew.
// Caller must hold Router.mu.
func (j *judgeState) rebaseline() { *j = judgeState{verdicts: j.verdicts} }

// judgeRound runs one round of the baseline judge over the members' models
// (their rounds taken by fitLocked). A round in which reads failed or
// stalled on most members (troubled: an election, the whole cluster or the
// client stalled) judges nobody and teaches nothing: its reads' times are
// cut short or inflated by what they all shared, and what were cut are
// lower bounds, not latencies. Caller must hold Router.mu.
func judgeRound(costs []*readCost, troubled bool) {
	if troubled {
		return
	}
	type evidence struct {
		j    *judgeState
		d    [5]float64
		z, v float64
	}
	var judged []evidence
	for _, c := range costs {
		j := &c.judge
		n, sx, sy, syy := c.round[0], c.round[1], c.round[2], c.round[5]
		if n < 1 || sy <= 0 {
			continue
		}
		d := [5]float64(c.round[:5])
		base, perRead, ok := j.baseline.line(math.Inf(1))
		if !ok || j.baseline.w < baselineMinWeight {
			j.baseline.add(d, baselineHalfLife)
			continue
		}
		predicted := base + perRead*sx/n
		if predicted <= 0 {
			continue
		}
		mean := sy / n // µs, as every sum of the round
		if n >= 2 {
			variance := (syy - n*mean*mean) / (n - 1) // unbiased: a round may hold two reads
			cv2 := min(max(variance/(mean*mean), judgeVarFloor), judgeVarCeiling)
			j.readVar = average(j.readVar, readVarPrior, cv2)
		}
		judged = append(judged, evidence{j: j, d: d, z: math.Log(mean / predicted), v: or(j.readVar, readVarPrior)/n + or(j.modelVar, modelVarPrior)})
	}
	if len(judged) < 2 {
		return
	}
	// Each member against the others' precision-weighted mean: what they
	// share cancels, and a failing member raises the others' yardstick,
	// which convicts none of them.
	var sumW, sumWZ float64
	for _, e := range judged {
		sumW += 1 / e.v
		sumWZ += e.z / e.v
	}
	for _, e := range judged {
		othersW := sumW - 1/e.v
		common := (sumWZ - e.z/e.v) / othersW
		u := e.z - common
		v := e.v + 1/othersW
		j := e.j
		j.ratio = math.Exp(u)
		step := (judgeShift / v) * (max(min(u, judgeClip), -judgeClip) - judgeShift/2)
		j.excess = min(judgeCap, max(0, j.excess+min(step, judgeStep)))
		switch {
		case j.excess >= judgeThreshold && !j.failing:
			j.failing = true
			j.verdicts++
		case j.excess < judgeThreshold/2:
			j.failing = false
		}
		if j.excess >= judgeThreshold/2 || u >= judgeClip {
			// Not learned: it may be the failure (learning only rounds
			// that left S at 0 would bias the baseline low). A round
			// judgeClip out is the first round of a failure as surely as
			// one round can say (healthy rounds stay within a few tenths):
			// learned, its reads at a load the baseline has not seen
			// would teach it a slope that explains the failure away.
			continue
		}
		j.baseline.add(e.d, baselineHalfLife)
		modelVar := or(j.modelVar, modelVarPrior)
		// This round's sample of τ², its residual capped at δ: the first
		// round of a failure, before S reaches h/2, must not teach the
		// judge that rounds vary that much.
		missed := max(min(u*u, judgeShift*judgeShift)-(v-modelVar), 0)
		j.modelVar = max(modelVarFloor, average(j.modelVar, modelVarPrior, missed))
	}
}

// average folds sample into an exponential average over about
// 1 ÷ judgeVarWeight rounds; avg 0 starts from prior.
func average(avg, prior, sample float64) float64 {
	return (1-judgeVarWeight)*or(avg, prior) + judgeVarWeight*sample
}

// or returns v, or def when v is 0 (not yet learned).
func or(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return v
}

// stats reports the model and the judge's state. Caller must hold Router.mu.
func (c *readCost) stats() ReadCostStats {
	st := ReadCostStats{Excess: c.judge.excess / judgeThreshold, Verdicts: c.judge.verdicts}
	if l := c.line.Load(); l != nil {
		st.Base, st.PerRead = time.Duration(l.base), time.Duration(l.perRead)
	}
	return st
}

// check returns what in the model or its judge is not a finite,
// non-negative number: Pick weighs members by the model, and a NaN would
// send every read to the pool's last member. Caller must hold Router.mu.
func (c *readCost) check() error {
	values := map[string]float64{"excess": c.judge.excess, "read variance": c.judge.readVar, "model variance": c.judge.modelVar}
	if l := c.line.Load(); l != nil {
		values["base"], values["per-read"] = l.base, l.perRead
	}
	for name, v := range values {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("%s is %v", name, v)
		}
	}
	return nil
}
