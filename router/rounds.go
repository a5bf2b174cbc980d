package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

func (r *Router) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.ProbeInterval)
	defer t.Stop()
	forced := true
	for {
		r.round(ctx, forced)
		if r.cfg.OnRefresh != nil && ctx.Err() == nil {
			r.cfg.OnRefresh()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			forced = false
		case <-r.refreshc:
			forced = true
		}
	}
}

// Round runs one round now, as the background loop would at its tick:
// probes when the cadence asks for them (every member on the first round
// and after Refresh), then judges the members and publishes the new view;
// OnRefresh and OnEvent are called from Round's goroutine. It blocks until
// the probes answer, and Rounds run one at a time. Only under
// Config.Manual (ErrNotManual otherwise); ErrClosed after Close; ctx's
// error if it ended the round before its view was published.
func (r *Router) Round(ctx context.Context) error {
	if !r.cfg.Manual {
		return ErrNotManual
	}
	r.manualMu.Lock()
	defer r.manualMu.Unlock()
	if r.closed.Load() {
		return ErrClosed
	}
	r.round(ctx, r.manualForced.Swap(false))
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.cfg.OnRefresh != nil {
		r.cfg.OnRefresh()
	}
	return nil
}

// RoundPending reports, under Config.Manual, that a round is asked for
// now (Refresh, or evidence that the background loop would probe at once
// for): a simulator runs one before its next event.
func (r *Router) RoundPending() bool { return r.cfg.Manual && r.manualForced.Load() }

type probeOutcome struct {
	res       ProbeResult
	rtt       time.Duration
	err       error
	busyEpoch uint64 // the member's busyEpoch when the probe started
	skipped   bool   // not probed this round (settledSkip): its last answer stands
}

// refresh probes every member concurrently, then rebuilds the snapshot:
// reachable members, leader, read pool.
func (r *Router) refresh(ctx context.Context) { r.probeRound(ctx, nil) }

// probeRound probes the members concurrently, but those skip marks, then
// rebuilds the snapshot: reachable members, leader, read pool.
func (r *Router) probeRound(ctx context.Context, skip []bool) {
	var outcomes []probeOutcome
	gen := r.forgets.Load()
	if r.cfg.Prober != nil {
		ro := r.roster()
		outcomes = make([]probeOutcome, len(ro.members))
		var wg sync.WaitGroup
		for i, m := range ro.members {
			if ro.retired[i] {
				outcomes[i].err = errRetired
				continue
			}
			if i < len(skip) && skip[i] {
				outcomes[i].skipped = true
				continue
			}
			wg.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
				defer cancel()
				epoch := r.roster().health[i].busyEpoch.Load()
				start := r.cfg.Clock.Now()
				res, err := r.cfg.Prober.Probe(pctx, m)
				rtt := r.cfg.Clock.Now().Sub(start)
				if res.RTT > 0 {
					rtt = res.RTT
				}
				outcomes[i] = probeOutcome{res: res, rtt: rtt, err: err, busyEpoch: epoch}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
	}
	r.apply(outcomes, gen, outcomes != nil)
	if r.hedge != nil {
		r.hedge.update()
	}
}

// apply folds one round into a new snapshot: a probe round's outcomes
// (probed), or none (no prober, or a round that judges reads on the last
// probes' word). gen is r.forgets when the round started: a leader-pinned
// write that failed since then outranks this round's word for the same
// leader.
func (r *Router) apply(outcomes []probeOutcome, gen uint64, probed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.snap.Load()
	now := r.cfg.Clock.Now()

	for i, o := range outcomes {
		if r.roster().retired[i] || o.skipped {
			continue
		}
		h := r.roster().health[i]
		h.picksAtProbe, h.settledSkips = h.picks(), 0
		if h.busy.Load() > 0 || h.busyEpoch.Load() != o.busyEpoch {
			continue // it overlapped maintenance: no evidence either way
		}
		if o.err != nil {
			h.probeFailures++
			h.totalProbeFailures++
			if h.probeErr == nil || !errors.Is(o.err, context.DeadlineExceeded) {
				h.probeErr = o.err // a timeout does not hide why the probes failed before it
			}
			h.slowReadRounds, h.slowProbeRounds = 0, 0 // the run needs rounds in a row it answered
			continue
		}
		h.probeFailures, h.probeErr = 0, nil
		h.lastProbe, h.probed, h.reached = o.res, true, true
		h.probedIn = r.rounds.Load()
		if gen >= h.forgottenAt {
			h.forgotten = false
		}
		h.probe.Add(o.rtt)
	}
	for i := range r.roster().health {
		h := r.roster().health[i]
		// Failures and stalls first: one counted after them is counted in readsEnded too.
		fails, stalls := h.readFails.Load(), h.readStalls.Load()
		h.window.push(now, h.readsEnded(), fails, stalls, r.cfg.FailureWindow)
	}

	ro := r.roster()
	var reachable []int
	for i := range ro.members {
		h := ro.health[i]
		if ro.retired[i] || (h.added && !h.probed) || h.probeFailures >= r.cfg.UnreachableAfter || (h.probed && h.lastProbe.NotServing) {
			continue
		}
		reachable = append(reachable, i)
	}
	if len(reachable) == 0 {
		// Nothing answers: keep every member in rotation and let the
		// transport report the failure, rather than having nowhere to go.
		for i := range ro.members {
			if !ro.retired[i] {
				reachable = append(reachable, i)
			}
		}
	}

	leader, leaderUnsure := prev.leader, false
	if outcomes != nil {
		leader = r.electedLeader(reachable)
		if leader >= 0 && gen != r.forgets.Load() && leader == r.lastLeader {
			// A write pinned to this leader failed while we probed: do not
			// trust this round's word for it; probe again.
			leader, leaderUnsure = -1, true
			r.unsettle()
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
		for k := 1; k <= len(r.roster().members); k++ {
			if c := (sticky + k) % len(r.roster().members); slices.Contains(reachable, c) {
				sticky = c
				break
			}
		}
	}
	unfit := r.benchedLocked(reachable, leader)
	// The cap's room goes to the benched first (buildSnapshot keeps the
	// rest in the pool): a benched member beyond it is judged, and
	// readmitted, like any member in the pool.
	benched := unfit[:min(len(unfit), (len(reachable)-1)/2)]
	trouble := r.clusterTroubleLocked(reachable)
	if r.rule != nil {
		// Before the ejections, which apply its verdicts.
		r.rule.round(r, reachable, trouble)
	}
	ejected := r.ejectionsLocked(reachable, benched, now, probed, trouble)
	next := r.buildSnapshot(leader, reachable, ejected, unfit, sticky)
	r.eventsLocked(prev, next, leaderUnsure)
	r.snap.Store(next)
	r.trackStallsLocked()
	r.settleLocked(prev, next, probed, now)
	if probed {
		r.rounds.Add(1)
	}
}
