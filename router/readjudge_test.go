package router

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

// judgeWorld simulates rounds of reads on members whose latency follows
// base + perRead × x, times a log-normal factor per read (sd readSD in log
// latency), times a factor per round shared by every member (a busy host)
// and one per member (what the line misses, sd modelSD).
type judgeWorld struct {
	rnd             *rand.Rand
	costs           []*readCost
	base, perRead   []time.Duration
	slow            []float64 // a grey failure: the member's reads take this many times longer
	lo, hi          []int     // a read on member i is placed with lo[i]..hi[i] reads in flight, itself included
	readSD, modelSD float64
}

func newJudgeWorld(seed uint64, members int) *judgeWorld {
	w := &judgeWorld{rnd: rand.New(rand.NewPCG(seed, 1)), readSD: 0.5, modelSD: 0.1}
	for i := range members {
		w.costs = append(w.costs, &readCost{})
		w.base = append(w.base, time.Duration(1+i)*time.Millisecond) // farther members read slower, for ever
		w.perRead = append(w.perRead, 200*time.Microsecond)
		w.slow = append(w.slow, 1)
		w.lo, w.hi = append(w.lo, 1), append(w.hi, 4)
	}
	return w
}

// round ends reads[i] reads on each member i, the round's shared slowdown
// being common, and judges the round.
func (w *judgeWorld) round(reads []int, common float64) {
	for i, c := range w.costs {
		c.round = [6]float64{}
		member := math.Exp(w.rnd.NormFloat64() * w.modelSD)
		for range reads[i] {
			x := float64(w.lo[i] + w.rnd.IntN(w.hi[i]-w.lo[i]+1))
			ns := float64(w.base[i]+time.Duration(x)*w.perRead[i]) * w.slow[i] * common * member * math.Exp(w.rnd.NormFloat64()*w.readSD-w.readSD*w.readSD/2)
			us := ns / 1e3 // the round's sums are in µs
			c.round[0]++
			c.round[1] += x
			c.round[2] += us
			c.round[3] += x * x
			c.round[4] += x * us
			c.round[5] += us * us
		}
	}
	judgeRound(w.costs, false)
}

func (w *judgeWorld) verdicts() (n uint64) {
	for _, c := range w.costs {
		n += c.judge.verdicts
	}
	return n
}

// A member nine times slower than its baseline (the degraded follower's
// +8 ms on 1 ms reads) is found failing within four rounds (the godoc
// derives three), with two reads a round on it; the others are not.
func TestJudgeFindsAMemberSlowerThanItsBaseline(t *testing.T) {
	w := newJudgeWorld(1, 3)
	reads := []int{200, 2, 2}
	for range 400 {
		w.round(reads, 1)
	}
	if n := w.verdicts(); n != 0 {
		t.Fatalf("%d verdicts while healthy", n)
	}
	w.slow[1] = 9
	for k := 1; ; k++ {
		w.round(reads, 1)
		if w.costs[1].judge.failing {
			t.Logf("failing after %d rounds", k)
			break
		}
		if k == 4 {
			t.Fatalf("not failing after 4 rounds: excess %.2f of the threshold (%+v)", w.costs[1].judge.excess/judgeThreshold, w.costs[1].judge)
		}
	}
	if w.costs[0].judge.failing || w.costs[2].judge.failing {
		t.Fatal("a healthy member found failing beside the slow one")
	}
	// Healed: it comes back to its baseline, which did not learn the failure.
	w.slow[1] = 1
	for range 20 {
		w.round(reads, 1)
	}
	if w.costs[1].judge.failing {
		t.Fatalf("still failing 20 rounds after the heal: excess %.2f", w.costs[1].judge.excess/judgeThreshold)
	}
}

// A load step is no failure: a member whose reads in flight rise past any
// count its baseline has seen, its reads on its line (a queue, not a
// fault), is not found failing. A step is learned in one round, so long as
// its reads are less than e^judgeClip (8×) slower than the baseline
// predicts beyond what the others' moved; a member alone jumping from one
// read in flight to 64 (13.8 ms against its flat baseline's 1.2 ms) is
// convicted like a failure, a step least_cost's placement does not make
// (TestLeastCostLoadStepEjectsNobody).
func TestJudgeKeepsAMemberThroughALoadStep(t *testing.T) {
	for _, c := range []struct {
		name          string
		members       int    // the first members step
		before, after [2]int // reads in flight, least and most, before and after the step
		convicted     bool
	}{
		{"m0 from 1-4 in flight to 8-16", 1, [2]int{1, 4}, [2]int{8, 16}, false},
		{"m0 from one at a time to 1-16", 1, [2]int{1, 1}, [2]int{1, 16}, false},
		{"m0 from one at a time to 16", 1, [2]int{1, 1}, [2]int{16, 16}, false},
		{"every member from one at a time to 64", 3, [2]int{1, 1}, [2]int{64, 64}, false},
		{"every member from 1-4 to 32-64", 3, [2]int{1, 4}, [2]int{32, 64}, false},
		{"m0 alone from one at a time to 64", 1, [2]int{1, 1}, [2]int{64, 64}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newJudgeWorld(5, 3)
			reads := []int{200, 20, 20}
			for i := range c.members {
				w.lo[i], w.hi[i] = c.before[0], c.before[1]
			}
			for range 400 {
				w.round(reads, 1)
			}
			if n := w.verdicts(); n > 0 {
				t.Fatalf("%d verdicts before the step", n)
			}
			for i := range c.members {
				w.lo[i], w.hi[i] = c.after[0], c.after[1]
			}
			for k := 1; k <= 400; k++ {
				w.round(reads, 1)
				n := w.verdicts()
				switch {
				case c.convicted && n > 0:
					t.Logf("convicted %d rounds after the step", k)
					return
				case c.convicted && k == 4:
					t.Fatalf("not convicted 4 rounds after the step: m0 %.2f times its baseline beyond the others", w.costs[0].judge.ratio)
				case n > 0:
					t.Fatalf("%d verdicts %d rounds after the load stepped: m0 %.2f, m1 %.2f, m2 %.2f times its baseline beyond the others", n, k, w.costs[0].judge.ratio, w.costs[1].judge.ratio, w.costs[2].judge.ratio)
				}
			}
		})
	}
}

// What slows every member at once is no member's failure.
func TestJudgeIgnoresWhatSlowsEveryMember(t *testing.T) {
	w := newJudgeWorld(2, 3)
	reads := []int{100, 20, 20}
	for range 400 {
		w.round(reads, 1)
	}
	for range 200 {
		w.round(reads, 4)
	}
	if n := w.verdicts(); n != 0 {
		t.Fatalf("%d verdicts while every member was 4 times slower", n)
	}
}

// Distance is not failure: a member far slower than the others, as it
// always was, is not found failing.
func TestJudgeKeepsAFarMember(t *testing.T) {
	w := newJudgeWorld(3, 3)
	w.base[2] = 40 * time.Millisecond
	for range 2000 {
		w.round([]int{100, 20, 5}, 1)
	}
	if n := w.verdicts(); n != 0 {
		t.Fatalf("%d verdicts on members as they always were", n)
	}
}

// The false-verdict rate on healthy members, with log-normal reads and
// what the line misses varying round to round, stays within what the
// godoc derives for Gaussian residuals (0.3 an hour over three members):
// 100,000 rounds is about seven hours at four rounds a second.
func TestJudgeFalseVerdictRate(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 rounds")
	}
	testutil.SkipUnderRace(t, "100,000 rounds")
	w := newJudgeWorld(4, 3)
	const rounds = 100_000
	for k := range rounds {
		// The reads per round vary as a client's load does.
		reads := []int{50 + k%200, 1 + k%7, 1 + k%3}
		w.round(reads, math.Exp(w.rnd.NormFloat64()*0.2))
	}
	hours := rounds * DefaultProbeInterval.Hours()
	t.Logf("%d false verdicts in %.1f hours of rounds", w.verdicts(), hours)
	if rate := float64(w.verdicts()) / hours; rate > 1 {
		t.Fatalf("%.2f false verdicts an hour, want at most 1", rate)
	}
}

// Under least_cost the judge is the read pool's latency rule: at load
// (2,000 reads a round, placed by the policy, so a follower gets only its
// exploration share and, once out, its probe share), a member nine times
// slower than its baseline leaves within four rounds and comes back within
// eight of its reads returning to it (on its probe share alone), while a
// member that was always far stays in.
func TestLeastCostEjectsOnItsJudgesVerdict(t *testing.T) {
	tr, latency, round := leastCostWorld(t)
	for range 100 {
		round()
	}
	tr.expectNoneEjected(t, "while every member reads as it always did")
	latency[1] *= 9
	for k := 1; !tr.Stats().Members[1].Ejected; k++ {
		if k > 4 {
			t.Fatalf("m1, nine times slower than its baseline, still in the pool after 4 rounds: %+v", tr.Stats().Members[1].ReadCost)
		}
		round()
	}
	if m := tr.Stats().Members[1]; m.OutReason != outLatency {
		t.Fatalf("m1 out for %q, want %q", m.OutReason, outLatency)
	}
	latency[1] /= 9
	for k := 1; tr.Stats().Members[1].Ejected; k++ {
		if k > 8 {
			t.Fatalf("m1 still out 8 rounds after its reads returned to its baseline: %+v", tr.Stats().Members[1].ReadCost)
		}
		round()
	}
	for _, m := range tr.Stats().Members {
		if m.Member.ID != "m1" && m.Ejections > 0 {
			t.Fatalf("%s ejected %d times", m.Member.ID, m.Ejections)
		}
	}
}

// leastCostWorld is a least_cost router over three members whose reads,
// one at a time, take latency[i] on the fake clock (m0 leads beside the
// client, m1 is a follower beside it, m2 a far follower); round runs 2,000
// reads and a probe round.
func leastCostWorld(t *testing.T) (testRouter, []time.Duration, func()) {
	tr := newTestRouter(t, Config{Policy: LeastCost})
	latency := []time.Duration{time.Millisecond, 1500 * time.Microsecond, 4 * time.Millisecond}
	round := func() {
		t.Helper()
		for range 2000 {
			p, err := tr.Pick(t.Context(), LinearizableRead)
			if err != nil {
				t.Fatal(err)
			}
			tr.clock.Advance(latency[p.Index])
			p.Done(OK)
		}
		tr.clock.Advance(250 * time.Millisecond)
		tr.probeRound()
	}
	return tr, latency, round
}

// price is what member i's model says a read there costs alone.
func price(tr testRouter, i int) time.Duration {
	c := tr.Stats().Members[i].ReadCost
	return c.Base + c.PerRead
}

// A member readmitted once its reads are back in line with its baseline is
// priced at that baseline, not at the reads of its failure: on its
// exploration share alone those would keep it dear, and its reads away,
// for tens of seconds after it healed.
func TestLeastCostReadmittedAtItsBaseline(t *testing.T) {
	tr, latency, round := leastCostWorld(t)
	for range 100 {
		round()
	}
	healthy := price(tr, 1)
	latency[1] *= 9
	for k := 1; !tr.Stats().Members[1].Ejected; k++ {
		if k > 4 {
			t.Fatalf("m1, nine times slower than its baseline, still in the pool after 4 rounds: %+v", tr.Stats().Members[1].ReadCost)
		}
		round()
	}
	failing := price(tr, 1)
	latency[1] /= 9
	for k := 1; tr.Stats().Members[1].Ejected; k++ {
		if k > 8 {
			t.Fatalf("m1 still out 8 rounds after its reads returned to its baseline: %+v", tr.Stats().Members[1].ReadCost)
		}
		round()
	}
	got := price(tr, 1)
	t.Logf("m1 priced %v healthy, %v failing, %v once readmitted", healthy, failing, got)
	if got > healthy*12/10 {
		t.Fatalf("m1 readmitted at %v a read, want its baseline's %v (±20 %%); failing it was %v", got, healthy, failing)
	}
}

// A leader move is no grey failure: the old leader's reads gain the
// ReadIndex hop and the new leader's lose it, so that against their old
// baselines the old leader is slower for good, and every member's residual
// against the others moves. Nobody leaves the pool for it (the yardstick
// and the members' baselines follow), and the judge still finds a failure
// after it.
func TestLeastCostLeaderMoveIsNoFailure(t *testing.T) {
	tr, latency, round := leastCostWorld(t)
	for range 100 {
		round()
	}
	// The leader moves to the far member: m0's reads gain the hop, m2's
	// lose it.
	tr.cluster.set("m2", 2)
	latency[0], latency[2] = latency[1], latency[2]-time.Millisecond
	for range 40 {
		round()
		tr.expectNoneEjected(t, "after the leader moved from m0 to m2")
	}
	if l, _ := tr.Leader(); l != 2 {
		t.Fatalf("leader m%d, want m2", l)
	}
	for _, m := range tr.Stats().Members {
		if m.ReadCost.Verdicts > 0 {
			t.Fatalf("%s found failing after the leader moved: %+v", m.Member.ID, m.ReadCost)
		}
	}
	latency[0] *= 9
	for k := 1; !tr.Stats().Members[0].Ejected; k++ {
		if k > 6 {
			t.Fatalf("m0, nine times slower than its baseline, still in the pool after 6 rounds: %+v", tr.Stats().Members[0].ReadCost)
		}
		round()
	}
}
