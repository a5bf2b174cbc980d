package router

import (
	"context"
	"slices"
	"sync"
	"time"
)

func (r *Router) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.ProbeInterval)
	defer t.Stop()
	for {
		r.refresh(ctx)
		if r.cfg.OnRefresh != nil && ctx.Err() == nil {
			r.cfg.OnRefresh()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.refreshc:
		}
	}
}

type probeOutcome struct {
	res ProbeResult
	rtt time.Duration
	err error
}

// refresh probes every member concurrently, then rebuilds the snapshot:
// reachable members, leader, read pool.
func (r *Router) refresh(ctx context.Context) {
	var outcomes []probeOutcome
	gen := r.forgets.Load()
	if r.cfg.Prober != nil {
		outcomes = make([]probeOutcome, len(r.members))
		var wg sync.WaitGroup
		for i, m := range r.members {
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
				defer cancel()
				start := r.cfg.Clock.Now()
				res, err := r.cfg.Prober.Probe(pctx, m)
				outcomes[i] = probeOutcome{res: res, rtt: r.cfg.Clock.Now().Sub(start), err: err}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
	}
	r.apply(outcomes, gen)
}

// apply folds one probe round (nil when there is no prober) into a new
// snapshot. gen is r.forgets when the round started: a leader-pinned write
// that failed since then outranks this round's word for the same leader.
func (r *Router) apply(outcomes []probeOutcome, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.snap.Load()

	for i, o := range outcomes {
		h := &r.health[i]
		if o.err != nil {
			h.probeFailures++
			continue
		}
		h.probeFailures = 0
		h.lastProbe, h.probed = o.res, true
		h.probe.Add(o.rtt)
	}
	for i := range r.health {
		h := &r.health[i]
		if n := h.read.Count(); n != h.readsSeen {
			h.readsSeen, h.idleRounds = n, 0
		} else {
			h.idleRounds++
		}
	}

	var reachable []int
	for i := range r.members {
		h := &r.health[i]
		if h.probeFailures >= r.cfg.UnreachableAfter || (h.probed && h.lastProbe.NotServing) {
			continue
		}
		reachable = append(reachable, i)
	}
	if len(reachable) == 0 {
		// Nothing answers: keep every member in rotation and let the
		// transport report the failure, rather than having nowhere to go.
		for i := range r.members {
			reachable = append(reachable, i)
		}
	}

	leader := prev.leader
	if outcomes != nil {
		leader = r.electedLeader(reachable)
		if leader >= 0 && gen != r.forgets.Load() && leader == r.lastLeader {
			// A write pinned to this leader failed while we probed: do not
			// trust this round's word for it; probe again.
			leader = -1
			r.Refresh()
		}
	} else if !slices.Contains(reachable, leader) {
		leader = -1
	}
	if leader >= 0 && r.lastLeader >= 0 && leader != r.lastLeader {
		r.leaderChanges.Add(1)
	}
	if leader >= 0 {
		r.lastLeader = leader
	}

	sticky := prev.sticky
	if !slices.Contains(reachable, sticky) {
		// As ZooKeeper's client does on connection loss: the next server.
		for k := 1; k <= len(r.members); k++ {
			if c := (sticky + k) % len(r.members); slices.Contains(reachable, c) {
				sticky = c
				break
			}
		}
	}
	r.snap.Store(r.buildSnapshot(leader, reachable, r.ejections(reachable, prev.isEjected), sticky))
	r.rounds.Add(1)
}

// electedLeader returns the reachable member that the highest-term probe
// names as leader, or -1.
func (r *Router) electedLeader(reachable []int) int {
	leader, term := -1, uint64(0)
	for _, i := range reachable {
		h := &r.health[i]
		if !h.probed || h.probeFailures > 0 {
			continue
		}
		res := h.lastProbe
		cand := -1
		switch {
		case res.IsLeader:
			cand = i
		case res.LeaderID != "":
			cand = r.byServerID(res.LeaderID, reachable)
		}
		if cand >= 0 && (leader < 0 || res.Term > term) {
			leader, term = cand, res.Term
		}
	}
	return leader
}

func (r *Router) byServerID(id string, among []int) int {
	for _, i := range among {
		if h := &r.health[i]; h.probed && h.lastProbe.ServerID == id {
			return i
		}
	}
	return -1
}

// idleReadRounds is how many probe rounds without a read sample make an
// ejected member's read estimate stale, so that probes alone decide.
const idleReadRounds = 8

// ejections decides the read pool. A member leaves it when its read EWMA
// exceeds EjectRatio × the median of the members' read EWMAs (and by at
// least MinEjectGap). It comes back when its read EWMA (fed by its probe
// share of reads) and its probe EWMA are each within ReadmitRatio × the
// median of the same signal, like compared with like: a probe is a cheaper
// round trip than a linearizable read, so the two never mix. With no reads
// to judge by (an idle client), the probe signal alone readmits. Fewer than
// half the reachable members are ever ejected, so the pool is never empty.
func (r *Router) ejections(reachable []int, wasEjected []bool) []int {
	var judged, probes []time.Duration
	for _, i := range reachable {
		h := &r.health[i]
		if h.read.Count() >= uint64(r.cfg.MinSamples) {
			judged = append(judged, h.read.Value())
		}
		if h.probed {
			probes = append(probes, h.probe.Value())
		}
	}
	var probeMedian time.Duration
	if len(probes) > 0 {
		probeMedian = medianOf(probes)
	}
	inLine := func(v, median time.Duration) bool {
		return float64(v) <= r.cfg.ReadmitRatio*float64(median) || v-median <= r.cfg.MinEjectGap
	}
	if len(judged) < 2 {
		var keep []int
		for _, i := range reachable {
			if wasEjected[i] {
				keep = append(keep, i)
			}
		}
		return keep
	}
	median := medianOf(judged)
	type candidate struct {
		i int
		v time.Duration
	}
	var out []candidate
	for _, i := range reachable {
		h := &r.health[i]
		v := h.read.Value()
		switch {
		case wasEjected[i]:
			probeOK := !h.probed || inLine(h.probe.Value(), probeMedian)
			readOK := inLine(v, median) || h.idleRounds >= idleReadRounds
			if !probeOK || !readOK {
				out = append(out, candidate{i, v})
			}
		case h.read.Count() >= uint64(r.cfg.MinSamples) &&
			float64(v) > r.cfg.EjectRatio*float64(median) && v-median > r.cfg.MinEjectGap:
			out = append(out, candidate{i, v})
		}
	}
	slices.SortFunc(out, func(a, b candidate) int { return int(b.v - a.v) })
	if limit := (len(reachable) - 1) / 2; len(out) > limit {
		out = out[:limit]
	}
	ejected := make([]int, len(out))
	for k, c := range out {
		ejected[k] = c.i
	}
	slices.Sort(ejected)
	for _, i := range reachable {
		if wasEjected[i] && !slices.Contains(ejected, i) {
			// A readmitted member starts afresh: its old estimate describes
			// the fault, and it must earn MinSamples new reads before it is
			// judged again.
			h := &r.health[i]
			h.read.Reset(median)
			h.readsSeen, h.idleRounds = 0, 0
		}
	}
	return ejected
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
