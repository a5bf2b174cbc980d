package router

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// minProbeSamples is how many probes a member needs before its probe RTT
// is judged: two seconds of probes at the default interval.
const minProbeSamples = 8

// Reasons a member is out of the read pool, as Stats reports them.
const (
	outLatency  = "latency"     // read EWMA far above the median
	outFailures = "failures"    // consecutive failed reads, or a failure share far above the others'
	outProbeRTT = "probe_rtt"   // probe round trips far above the others'
	outNoLeader = "no_leader"   // the member follows no leader
	outOldTerm  = "older_term"  // the member reports an older term than the leader's
	outLag      = "apply_lag"   // the member has applied far less than the leader committed
	outBusy     = "maintenance" // maintenance the client asked of it (Backend.Busy)
)

// benchedLocked returns the reachable members whose own probes say they
// cannot serve a linearizable read now: no leader, an older term (epoch)
// than the leader's, or an apply index more than MaxLag behind the leader's
// commit index. They leave the read pool at once, before any read fails
// there, and get no probe share: their probes bring them back. Members busy
// with maintenance come first: buildSnapshot keeps the first of them out
// up to the minority cap. When every reachable member's probes say the same
// (all leaderless during an election) none is benched. Caller must hold r.mu.
func (r *Router) benchedLocked(reachable []int, leader int) []int {
	var leaderTerm, committed uint64
	if leader >= 0 {
		leaderTerm, committed = r.leaderTermLocked(leader, reachable), r.roster().health[leader].lastProbe.Committed
	}
	var out []int
	busyFirst := 0
	for _, i := range reachable {
		h := r.roster().health[i]
		if !h.probed && h.busy.Load() == 0 {
			continue
		}
		res := h.lastProbe
		why := ""
		switch {
		case h.probedIn != r.rounds.Load():
			// Not answered in this round (a settled round that left it
			// out, a failed probe, a round that judges reads alone): an old
			// term or applied index against the newest is no evidence. The
			// verdict of its last answer stands.
			why = h.probeWhy
		case res.Leaderless:
			why = outNoLeader
		case leader >= 0 && res.Term > 0 && res.Term < leaderTerm:
			why = outOldTerm
		case committed > 0 && res.Applied > 0 && committed > res.Applied && committed-res.Applied > r.cfg.MaxLag:
			why = outLag
		}
		h.probeWhy = why
		if h.busy.Load() > 0 {
			why = outBusy
		}
		switch h.benchWhy = why; why {
		case "":
		case outBusy:
			out = slices.Insert(out, busyFirst, i)
			busyFirst++
		default:
			out = append(out, i)
		}
	}
	if busyFirst == 0 && len(out) == len(reachable) {
		return nil // every member says the same (an election): it singles out none
	}
	return out
}

// ejectionsLocked decides which reachable members are ejected from the
// read pool on the evidence of reads and probe round trips, and returns
// them (benched ones left out), the most severe first:
//   - latency: read latency (readRoundLocked; ≥ MinSamples samples,
//     censored ones included) above EjectRatio × the median of the judged
//     members' and by more than MinEjectGap, at EjectRounds rounds in a
//     row but for the rounds held as below, counting no round in which
//     reads failed or stalled (were cut far above the median) on most
//     members within FailureWindow (such a round ends the run). A round
//     counts against a member only on the reads that ended in it: the
//     mean of those must be above the line too (the EWMA remembers the
//     rounds before). A round with none neither extends nor ends the
//     run, up to EjectRounds such rounds in a row, after which the run
//     ends (an idle client's estimates stay as its last reads left them:
//     judged again each round, one slow read before a pause would eject);
//     nor does a round on the edge (above ReadmitRatio × the median, short
//     of EjectRatio ×), up to EjectRounds-1 of them in a run (a grey
//     failure near the line dips onto the edge on a noisy host);
//   - failures: ConsecutiveFailures failed reads in a row while most other
//     members are not failing (a cluster-wide failure, an election, ejects
//     nobody), or a failure share over FailureWindow that exceeds the
//     others' median share by FailureShare;
//   - probe RTT: probe EWMA (minProbeSamples probes) above EjectRatio × the
//     members' median probe EWMA and by more than MinProbeEjectGap, at
//     EjectRounds probe rounds in a row.
//
// The yardstick is the median of every judged member, the member itself
// included (the lower of the two middle values when their number is even,
// so that of two judged members the faster is the yardstick): while at most a minority is unhealthy (the cap below), it is a
// healthy member's value, whereas the median of the others alone is, with
// three members, the mean of the nearest (the leader, whose reads take no
// hop) and one other, which puts a healthy member in a farther zone at
// twice it under load. One round's EWMA reflects the last few reads only,
// and a healthy member's tail crosses any line now and then; a grey
// failure stays above it.
//
// An ejected member stays out for at least its ejection time (BaseEjection,
// doubled for each ejection since it was last forgiven, capped at
// MaxEjection) and until fresh evidence brings it back: ReadmitSamples
// probe-share reads in a row in line with the pool's share-fair median
// (storeMedians), and its probe EWMA in
// line with the others' (within ReadmitRatio × the median, or within
// MinProbeEjectGap of it: the complement of the probe rule, so that no
// member is kept out by probes that could not have ejected it). A benched
// member keeps its ejection and is judged again once its probes recover.
// At most a minority of the reachable members is out of the pool (benched
// ones included); the most severe keep the places, the incumbent on a tie.
// Only hybrid and least_cost have a read pool: under the other policies
// nobody is ejected. Under least_cost the latency rule is its baseline
// judge's (judgeRound); the rest is as above.
// Caller must hold r.mu.
func (r *Router) ejectionsLocked(reachable, benched []int, now time.Time, probed, clusterTrouble bool) []int {
	if r.rule == nil {
		return nil
	}
	rounds := make([]readRound, len(r.roster().health))
	for i, h := range r.roster().health {
		rounds[i] = r.readRoundLocked(h)
	}
	var reads, probes []time.Duration
	for _, i := range reachable {
		h := r.roster().health[i]
		if h.read.Count() >= uint64(r.cfg.MinSamples) {
			reads = append(reads, rounds[i].signal)
		}
		if h.probed && h.probeFailures == 0 {
			probes = append(probes, h.probe.Value())
		}
	}
	var median, probeMedian time.Duration
	if len(reads) > 0 {
		median = lowMedianOf(reads)
	}
	if len(probes) > 0 {
		probeMedian = medianOf(probes)
	}
	shares := map[int]float64{}
	failing := 0 // reachable members with a read failure streak
	for _, i := range reachable {
		h := r.roster().health[i]
		reads, fails, _ := h.window.delta()
		if reads >= uint64(r.cfg.MinSamples) {
			shares[i] = float64(fails) / float64(reads)
		}
		if h.readFailStreak.Load() > 0 {
			failing++
		}
	}

	type candidate struct {
		i        int
		was      bool
		severity float64
		why      string
	}
	var out []candidate
	for _, i := range reachable {
		h := r.roster().health[i]
		if slices.Contains(benched, i) {
			h.slowReadRounds, h.slowProbeRounds = 0, 0
			continue // judged again once its probes recover; an ejection is kept
		}
		if h.ejected {
			probeOK := !h.probed || len(probes) < 2 || r.inLine(h.probe.Value(), probeMedian, r.cfg.MinProbeEjectGap)
			fresh := h.freshInLine.Load() >= int64(r.cfg.ReadmitSamples)
			if h.ejectWhy == outLatency {
				fresh = r.rule.back(r, h, now, fresh)
			}
			if now.Before(h.ejectUntil) || !probeOK || !fresh {
				out = append(out, candidate{i: i, was: true, severity: r.severity(h, rounds[i].signal, h.ejectWhy, median, probeMedian), why: h.ejectWhy})
			}
			continue
		}
		// The round's own reads must be slow too: the EWMA remembers reads
		// of rounds before, which one round may not count again.
		judged := !clusterTrouble && len(reads) >= 2 && h.read.Count() >= uint64(r.cfg.MinSamples)
		slowReads := judged && r.farAbove(rounds[i].signal, median) && r.farAbove(rounds[i].mean, median)
		// On the edge: short of the ejection line, but not within
		// ReadmitRatio × the median either. A grey failure near the line
		// dips onto the edge now and then (on a noisy host every member's
		// reads slow together), which is no sign of health.
		edgeReads := judged && !slowReads && !r.inLine(rounds[i].signal, median, r.cfg.MinEjectGap) &&
			!r.inLine(rounds[i].mean, median, r.cfg.MinEjectGap)
		slowProbes := len(probes) >= 2 && h.probed && h.probeFailures == 0 && h.probe.Count() >= minProbeSamples &&
			float64(h.probe.Value()) > r.cfg.EjectRatio*float64(probeMedian) && h.probe.Value()-probeMedian > r.cfg.MinProbeEjectGap
		switch {
		case !rounds[i].fresh:
			// A round without reads holds the run (an idle client's
			// estimates are no new evidence; a member the load-aware choice
			// avoids gets reads now and then), for as many rounds in a row
			// as a run takes to build: held longer, it is stale, and it
			// would keep the router from settling.
			if h.idleRounds++; h.idleRounds > r.cfg.EjectRounds {
				h.slowReadRounds = 0
			}
		case edgeReads && h.slowReadRounds > 0:
			// A round on the edge holds the run too, but fewer of them than
			// its slow rounds: a member must still be far above the line
			// in most of the rounds that eject it.
			h.idleRounds = 0
			if h.edgeRounds++; h.edgeRounds >= r.cfg.EjectRounds {
				h.slowReadRounds = 0
			}
		default:
			h.idleRounds = 0
			if h.slowReadRounds == 0 {
				h.edgeRounds = 0 // a run starts here, and only here
			}
			h.slowReadRounds = countRun(h.slowReadRounds, slowReads)
		}
		if probed { // only probe rounds bring new probe evidence
			h.slowProbeRounds = countRun(h.slowProbeRounds, slowProbes)
		}
		why := ""
		streak := h.readFailStreak.Load()
		switch {
		case streak >= int64(r.cfg.ConsecutiveFailures) && 2*(failing-1) < len(reachable)-1 && !clusterTrouble:
			// A run of failures is evidence while the others answer; if
			// most members failed within the window, it is the tail of
			// what they all shared (an election ends later for a member
			// that learns of the new leader last).
			why = outFailures
		case r.failingMore(i, shares):
			why = outFailures
		case !clusterTrouble && r.rule.slow(r, h):
			// A verdict stands through a troubled round, but the round
			// ejects nobody new on latency: it judges nobody.
			why = outLatency
		case h.slowProbeRounds >= r.cfg.EjectRounds:
			why = outProbeRTT
		}
		if why != "" {
			out = append(out, candidate{i: i, severity: r.severity(h, rounds[i].signal, why, median, probeMedian), why: why})
		}
	}
	// The minority cap keeps the worst: a member failing its reads, then
	// the one furthest above its median. A member already out but less
	// severe than a newcomer makes room for it (a partitioned member
	// displaces one that is merely a little slow); on a tie it stays.
	slices.SortStableFunc(out, func(a, b candidate) int {
		if c := cmp.Compare(b.severity, a.severity); c != 0 {
			return c
		}
		switch {
		case a.was && !b.was:
			return -1
		case b.was && !a.was:
			return 1
		}
		return 0
	})
	limit := max(0, (len(reachable)-1)/2-len(benched))
	if len(out) > limit {
		out = out[:limit]
	}
	if median > 0 {
		r.storeMedians(median, len(reachable)-len(out)-len(benched), len(reachable))
	}
	ejected := make([]int, 0, len(out))
	for _, c := range out {
		ejected = append(ejected, c.i)
		if h := r.roster().health[c.i]; !c.was {
			h.ejectWhy = c.why
			r.ejectLocked(h, now)
		}
	}
	for _, i := range reachable {
		if h := r.roster().health[i]; h.ejected && !slices.Contains(ejected, i) && !slices.Contains(benched, i) {
			r.readmitLocked(h, median, now)
		}
	}
	return ejected
}

// clusterTroubleLocked reports whether reads failed or stalled within
// FailureWindow on most reachable members: an election, or the whole
// cluster or the client itself stalled. That slows every member, a far one
// most: no latency evidence, and no run of failures is either. A stall
// that held up every caller cuts their reads over the next rounds, more of
// them on the members where reads take longest; judged one round at a
// time, those cuts would eject a healthy far member. Caller must hold r.mu.
func (r *Router) clusterTroubleLocked(reachable []int) bool {
	troubled := 0
	for _, i := range reachable {
		if _, fails, stalls := r.roster().health[i].window.delta(); fails > 0 || stalls > 0 {
			troubled++
		}
	}
	return 2*troubled > len(reachable)
}

// storeMedians publishes a round's read median and the share-fair median an
// ejected member's probe-share reads are held to. An ejected member's reads
// meet an idle member, while the pool's members also carry its share: with
// one of three out, each of the other two takes half the reads instead of
// a third, and on a saturated cluster their reads take half as long again
// for that alone. Held to that median, a member degraded by tens of
// milliseconds looks in line and flaps back in; the share-fair median scales
// the pool's median back to the share it had with every reachable member in
// the pool (median × pooled ÷ reachable), the load at which the ejection
// compared it. Caller must hold r.mu.
func (r *Router) storeMedians(median time.Duration, pooled, reachable int) {
	fair := median
	if pooled > 0 && pooled < reachable {
		fair = time.Duration(int64(median) * int64(pooled) / int64(reachable))
	}
	r.readMedian.Store(int64(median))
	r.fairMedian.Store(int64(fair))
}

// countRun extends a run of rounds in which a rule held, or ends it.
func countRun(run int, holds bool) int {
	if holds {
		return run + 1
	}
	return 0
}

// severity orders ejection candidates: failures first, then by how many
// times the median the member's signal is.
func (r *Router) severity(h *memberHealth, read time.Duration, why string, median, probeMedian time.Duration) float64 {
	switch why {
	case outFailures:
		return math.Inf(1)
	case outProbeRTT:
		return float64(h.probe.Value()) / float64(max(probeMedian, 1))
	}
	return r.rule.severity(h, read, median)
}

// readRound is what one round brought of a member's reads.
type readRound struct {
	// signal is its read latency as the latency rule judges it: the mean
	// of the round's samples when it had MinSamples of them (at load,
	// where one round's EWMA reflects its last few reads, a healthy
	// member's tail crosses any line now and then), else the EWMA.
	signal time.Duration
	mean   time.Duration // of the round's samples however few; 0 without any
	fresh  bool          // the round had samples
}

// readRoundLocked returns member h's readRound. Called once per member and
// round: it starts the next round's sums. Caller must hold r.mu.
func (r *Router) readRoundLocked(h *memberHealth) readRound {
	now := h.reads.Load()
	dn, dt := readsSince(h.roundReads, now)
	h.roundReads = now
	if dn <= 0 {
		return readRound{signal: h.read.Value()}
	}
	mean := dt / time.Duration(dn)
	if dn >= int64(r.cfg.MinSamples) && dt > 0 {
		return readRound{signal: mean, mean: mean, fresh: true}
	}
	return readRound{signal: h.read.Value(), mean: mean, fresh: true}
}

// failingMore reports whether member i's failure share exceeds the median
// share of the other judged members by FailureShare.
func (r *Router) failingMore(i int, shares map[int]float64) bool {
	mine, ok := shares[i]
	if !ok || mine < r.cfg.FailureShare {
		return false
	}
	var others []float64
	for j, s := range shares {
		if j != i {
			others = append(others, s)
		}
	}
	if len(others) == 0 {
		return false
	}
	slices.Sort(others)
	return mine-others[len(others)/2] >= r.cfg.FailureShare
}

// ejectLocked starts an ejection: its least duration doubles with each
// ejection since the member was last forgiven. Caller must hold r.mu.
func (r *Router) ejectLocked(h *memberHealth, now time.Time) {
	if !h.admittedAt.IsZero() && now.Sub(h.admittedAt) >= r.cfg.MaxEjection {
		h.ejections = 0 // in the pool long enough: forgiven
	}
	h.ejected = true
	h.ejectedAt = now
	h.ejections++
	h.totalEjected++
	h.ejectUntil = now.Add(ejectionTime(r.cfg.BaseEjection, r.cfg.MaxEjection, h.ejections))
	h.freshInLine.Store(0)
	h.slowReadRounds, h.slowProbeRounds = 0, 0
}

// ejectionTime is base doubled for each ejection after the first, capped
// at max; the doubling stops at the cap, so it never overflows.
func ejectionTime(base, max time.Duration, ejections int) time.Duration {
	d := base
	for k := 1; k < ejections && d < max; k++ {
		if d > max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

// readmitLocked returns a member to the pool with a fresh start: its old
// estimate and failures describe the fault, so it must earn MinSamples new
// reads before it is judged again. Caller must hold r.mu.
func (r *Router) readmitLocked(h *memberHealth, median time.Duration, now time.Time) {
	if median <= 0 {
		median = r.cfg.InitialLatency
	}
	r.rule.readmitted(h)
	h.ejected = false
	h.readmissions++
	h.read.Reset(median)
	h.readFailStreak.Store(0)
	h.freshInLine.Store(0)
	h.window.clear()
	h.admittedAt = now
	h.slowReadRounds, h.slowProbeRounds = 0, 0
}

// failureWindow keeps, at each probe round, a member's cumulative read
// picks, read failures and stalled reads, so that a share can be taken
// over the last FailureWindow of time (rounds come faster when something
// asks for one).
type failureWindow struct {
	at                   []time.Time // oldest first
	reads, fails, stalls []uint64
}

// push records a round's counts and forgets the ones that fall out of span
// (keeping one at or before its start).
func (w *failureWindow) push(now time.Time, reads, fails, stalls uint64, span time.Duration) {
	w.at = append(w.at, now)
	w.reads = append(w.reads, reads)
	w.fails = append(w.fails, fails)
	w.stalls = append(w.stalls, stalls)
	n := 0
	for n+1 < len(w.at) && !w.at[n+1].After(now.Add(-span)) {
		n++
	}
	if n > 0 {
		w.at = append(w.at[:0], w.at[n:]...)
		w.reads = append(w.reads[:0], w.reads[n:]...)
		w.fails = append(w.fails[:0], w.fails[n:]...)
		w.stalls = append(w.stalls[:0], w.stalls[n:]...)
	}
}

// delta returns the reads, failures and stalls over the window. The
// counts are cumulative and never fall; a pair that did would read as
// zero, never as a wrapped 2^64.
func (w *failureWindow) delta() (reads, fails, stalls uint64) {
	if len(w.reads) < 2 {
		return 0, 0, 0
	}
	n := len(w.reads) - 1
	return sub0(w.reads[n], w.reads[0]), sub0(w.fails[n], w.fails[0]), sub0(w.stalls[n], w.stalls[0])
}

func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// clear forgets the window's history (a readmitted member starts afresh).
func (w *failureWindow) clear() {
	if n := len(w.reads); n > 0 {
		w.at = append(w.at[:0], w.at[n-1])
		w.reads = append(w.reads[:0], w.reads[n-1])
		w.fails = append(w.fails[:0], w.fails[n-1])
		w.stalls = append(w.stalls[:0], w.stalls[n-1])
	}
}

// lowMedianOf is the median of an odd number of values, the lower middle
// one of an even number.
func lowMedianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
