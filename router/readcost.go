package router

import (
	"math"
	"sync/atomic"
	"time"
)

// readCost is one member's read-cost model, the least_cost policy's. A
// linearizable read placed on the member while q of the client's reads are
// in flight there is expected to take
//
//	latency(q) = base + perRead × (q + 1)
//
// base is what the member's place costs at any load: the client's link to
// it and, for a follower, its ReadIndex exchange with the leader (the
// leader's reads take one hop fewer). perRead is what each read in flight
// there adds: a learned service time, which folds in the member's capacity
// (its CPU budget, a ZooKeeper session that serves its requests in order).
// The read is priced at what it costs the client's reads in all:
//
//	cost(q) = latency(q) + perRead × q = base + perRead × (2q + 1)
//
// its own latency, plus what it adds to the q reads that, as many as are
// queued now, will queue behind it. Priced at its own latency only (the
// selfish choice), the cheapest member keeps its reads until its queue
// costs as much as the next member's distance, and the reads queued there
// pay for it: in the simulation (TestLeastCostTracksTheBestRuleInSimulation)
// that trails an even spread by up to a quarter at 32 workers.
//
// Both are fitted by least squares to the member's recent reads, each taken
// as (x, y): the reads in flight there when it was placed, itself included,
// and its latency. Older reads weigh less, by half every costHalfLife reads.
// Where x barely varied (one worker; a member that gets only its
// exploration share) the slope is not identified, so the fit leans towards
// a prior slope (ridge regression, weight costPrior): the mean latency's
// excess over the least one seen in the last rounds, per read in flight,
// which is the service time where reads never queue.
//
// What is taken from where: C3 (NSDI '15) prices a replica by its response
// time and its queue times its service time, and penalises the queue more
// than linearly so that clients do not herd; here the queue is the
// client's own reads in flight, as in Finagle's peak EWMA (latency × (in
// flight + 1)), since a member reports none, and the penalty is the
// queue's cost to the reads behind it. Prequal (NSDI '24) places by
// requests in flight and latency together and keeps probing: ProbeShare of
// the reads go to a pool member drawn uniformly whatever its cost (each of
// n members gets ProbeShare ÷ n of them), so that each model stays fresh. Unlike either, the base is fitted per member rather
// than taken as equal, so a leader beside the client, whose reads skip the
// ReadIndex hop, keeps the reads until its queue costs more than that hop.
//
// Done feeds the running sums lock-free; the round folds them into the fit
// (fitLocked) and publishes base and perRead for Pick.
type readCost struct {
	// Running sums over the reads that ended, fed by Done, latencies in
	// µs: ny packs the count and Σy as memberHealth.reads does (see
	// readSumBits), so that a round reads both at one instant; then Σx,
	// Σx², Σxy and Σy² (the judge's noise), which a read racing the round
	// may split across two rounds. Unsigned and wrapping: only differences
	// are read.
	ny, sx, sxx, sxy, syy atomic.Uint64
	// line is the fit the round published for Pick, nil until it holds
	// costMinWeight reads: both numbers of one round.
	line atomic.Pointer[costLine]
	// least is the least latency of a read that ended since the last round
	// (µs; MaxUint64 when none): with the rounds before, the fit's floor.
	least atomic.Uint64

	// Under Router.mu: the sums at the last round, the reads that ended
	// in the round (count, Σx, Σy, Σx², Σxy, Σy²; µs), and the fit.
	seen  [5]uint64
	round [6]float64
	fit   costFit
	// floors are the least latencies of the last len(floors) rounds with
	// reads, newest at floorAt.
	floors  [8]float64
	floorAt int
	judge   judgeState
}

// costLine is a fitted line, in nanoseconds: a read placed with x reads in
// flight (itself included) takes base + perRead × x.
type costLine struct{ base, perRead float64 }

const (
	// costHalfLife is how many of a member's reads halve the weight of the
	// ones before: at thousands of reads a second the fit follows the last
	// round or two; a member that gets only its exploration share keeps a
	// longer memory, in reads rather than in time.
	costHalfLife = 64
	// costPrior is the ridge's weight: the prior slope counts as much as
	// reads whose x varies by ±0.5 around its mean.
	costPrior = 0.25
	// costMinWeight is the fit's least weight of reads before it is
	// trusted; until then the member is priced as Config.InitialLatency
	// per read in flight.
	costMinWeight = 8
)

// record feeds one read that took y with x reads in flight (itself
// included) when it was placed.
func (c *readCost) record(x int64, y time.Duration) {
	us := uint64(min(max((y+500*time.Nanosecond)/time.Microsecond, 0), readSumMask)) // rounded; capped as memberHealth.reads caps
	ux := uint64(max(x, 1))
	c.ny.Add(1<<readSumBits | us)
	c.sx.Add(ux)
	c.sxx.Add(ux * ux)
	c.sxy.Add(ux * us)
	c.syy.Add(us * us)
	for {
		old := c.least.Load()
		if us >= old || c.least.CompareAndSwap(old, us) {
			return
		}
	}
}

// fitLocked takes the reads that ended since the last round (round),
// folds them into the fit and publishes it. Caller must hold Router.mu.
func (c *readCost) fitLocked() {
	now := [5]uint64{c.ny.Load(), c.sx.Load(), c.sxx.Load(), c.sxy.Load(), c.syy.Load()}
	n, total := readsSince(c.seen[0], now[0])
	c.round = [6]float64{float64(n), float64(now[1] - c.seen[1]), float64(total.Microseconds()), float64(now[2] - c.seen[2]), float64(now[3] - c.seen[3]), float64(now[4] - c.seen[4])}
	c.seen = now
	d := [5]float64(c.round[:5])
	if least := c.least.Swap(math.MaxUint64); d[0] > 0 && least != math.MaxUint64 {
		c.floorAt = (c.floorAt + 1) % len(c.floors)
		c.floors[c.floorAt] = float64(least)
	}
	c.fit.add(d, costHalfLife)
	floor := math.Inf(1)
	for _, f := range c.floors {
		if f > 0 {
			floor = min(floor, f)
		}
	}
	c.publish(floor)
}

// publish stores the fit's line for Pick, in nanoseconds, once the fit
// holds enough reads; before that the last line stands. Caller must hold
// Router.mu.
func (c *readCost) publish(floor float64) {
	if base, perRead, ok := c.fit.line(floor); ok {
		c.line.Store(&costLine{base: base * 1e3, perRead: perRead * 1e3})
	}
}

// restore puts the model back on the member's baseline, its healthy self
// (or forgets it, with no baseline yet): readmitted while its judge does
// not find it failing, its model still holds the reads of its failure,
// which its exploration share alone would take tens of seconds to
// outweigh. The baseline weighs as costHalfLife reads at most, so that
// the reads that follow move the model as fast as ever. Caller must hold
// Router.mu.
func (c *readCost) restore() {
	b := c.judge.baseline
	c.fit = costFit{}
	clear(c.floors[:])
	c.line.Store(nil)
	if b.w >= baselineMinWeight {
		k := min(1, costHalfLife/b.w)
		c.fit = costFit{w: k * b.w, x: k * b.x, y: k * b.y, xx: k * b.xx, xy: k * b.xy}
		c.publish(math.Inf(1))
	}
}

// predict returns the cost of a read placed with q reads in flight on the
// member, in nanoseconds; an unknown member is priced at initial per read in
// flight.
func (c *readCost) predict(q int64, initial time.Duration) float64 {
	l := c.line.Load()
	if l == nil {
		return float64(initial) * float64(q+1)
	}
	return l.base + l.perRead*float64(2*q+1)
}

// expected returns the latency the model expects of a read placed with x
// reads in flight (itself included), in nanoseconds; 0 while it knows
// nothing.
func (c *readCost) expected(x int64) float64 {
	l := c.line.Load()
	if l == nil {
		return 0
	}
	return l.base + l.perRead*float64(x)
}

// costFit holds recency-weighted sums of a member's reads: weight, Σx, Σy,
// Σx², Σxy.
type costFit struct{ w, x, y, xx, xy float64 }

// add decays the sums by half per halfLife new reads and adds the new ones
// (d: count, Σx, Σy, Σx², Σxy).
func (f *costFit) add(d [5]float64, halfLife float64) {
	if d[0] <= 0 {
		return
	}
	keep := math.Exp2(-d[0] / halfLife)
	f.w = keep*f.w + d[0]
	f.x = keep*f.x + d[1]
	f.y = keep*f.y + d[2]
	f.xx = keep*f.xx + d[3]
	f.xy = keep*f.xy + d[4]
}

// line returns the fitted base and per-read latency, in nanoseconds, given
// the least latency seen lately (floor; +Inf for none); ok is false while
// the fit holds fewer than costMinWeight reads.
func (f costFit) line(floor float64) (base, perRead float64, ok bool) {
	if f.w < costMinWeight {
		return 0, 0, false
	}
	mx, my := f.x/f.w, f.y/f.w
	if mx <= 0 || my <= 0 {
		return 0, 0, false
	}
	varX := max(f.xx/f.w-mx*mx, 0)
	covXY := f.xy/f.w - mx*my
	prior := max(my-min(floor, my), 0) / mx
	perRead = max((covXY+costPrior*prior)/(varX+costPrior), 0)
	base = my - perRead*mx
	if base < 0 { // a line through the origin at most: no read costs less than nothing
		base, perRead = 0, my/mx
	}
	return base, perRead, true
}

// cheapest draws a member of set (the read pool, not empty) for a
// linearizable read: ProbeShare of the draws uniformly, so that every model
// stays fresh, the rest with weight (c_min ÷ c)^16 over each member's
// cost c (readCost): a member 5 % dearer than the cheapest gets 0.46 of
// its weight, 20 % dearer 0.05. The weights depend
// only on the ratios of the costs, so the leader a zone away and a leader
// beside the client are treated alike; the cost's in-flight term spreads
// the reads as the cheapest member's queue grows, and the draw (rather than
// the cheapest always) keeps a fleet of clients that see the same costs
// from moving in step.
func (r *Router) cheapest(set []int) int {
	if len(set) == 1 {
		return set[0]
	}
	u := r.uniform()
	if u < r.cfg.ProbeShare {
		return set[int(u/r.cfg.ProbeShare*float64(len(set)))%len(set)]
	}
	var costs [16]float64
	if len(set) > len(costs) {
		return r.rotate(set)
	}
	ro := r.roster()
	least := math.Inf(1)
	for k, i := range set {
		h := ro.health[i]
		costs[k] = h.cost.predict(h.inflight.Load(), r.cfg.InitialLatency)
		least = min(least, costs[k])
	}
	if least <= 0 {
		return r.rotate(set) // a member that costs nothing: nothing to weigh
	}
	sum := 0.0
	for k := range set {
		w := least / costs[k]
		w *= w       // ^2
		w *= w       // ^4
		w *= w       // ^8
		w *= w       // ^16
		costs[k] = w // now its weight
		sum += w
	}
	return drawWeighted(set, costs[:len(set)], sum, r.uniform())
}
