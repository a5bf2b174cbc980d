package router

// Leader returns the member writes are pinned to; ok is false while the
// leader is unknown.
func (r *Router) Leader() (idx int, ok bool) {
	l := r.snap.Load().leader
	return l, l >= 0
}

func (r *Router) toLeader(s *snapshot) (int, bool) {
	if s.leader >= 0 {
		return s.leader, true
	}
	r.fallbacks.Add(1)
	if len(s.serving) > 0 {
		// Not to a member that has no leader or is under maintenance: it
		// would hold the call until the caller gives up.
		return r.rotate(s.serving), false
	}
	return r.rotate(s.reachable), false
}

// forgetLeader clears the cached leader if it is still idx, and asks for an
// immediate re-probe. Writes fall back to round robin meanwhile. A failure
// at a member that is no longer the leader changes nothing: it must not
// cost the current leader its place.
func (r *Router) forgetLeader(idx int) {
	r.mu.Lock()
	s := r.snap.Load()
	if s.leader != idx {
		r.mu.Unlock()
		return
	}
	h := r.roster().health[idx]
	h.forgotten, h.forgottenAt = true, r.forgets.Add(1)
	r.snap.Store(r.buildSnapshot(-1, s.reachable, s.ejected, s.unfit, s.sticky))
	r.mu.Unlock()
	r.unsettle()
}

// electedLeader returns the reachable member that the highest-term claim
// names as leader, or -1. A member whose last probe failed, but not yet
// UnreachableAfter in a row, keeps its last claim, below a fresh claim at
// the same term: ZooKeeper's followers never name the leader, so one lost
// probe of the leader (a GC pause, a lost SYN) would otherwise send writes
// round robin and move sessions for a round. The claim lapses when another
// member leads at a higher term, when the member becomes unreachable, or
// when a write pinned to it failed since (forgetLeader).
func (r *Router) electedLeader(reachable []int) int {
	leader, term, fresh := -1, uint64(0), false
	for _, i := range reachable {
		h := r.roster().health[i]
		if !h.probed || (h.probeFailures > 0 && h.forgotten) || h.probeFailures >= r.cfg.UnreachableAfter {
			continue
		}
		res := h.lastProbe
		cand := -1
		switch {
		case res.IsLeader:
			cand = i
		case res.LeaderID != "" && h.probeFailures == 0:
			cand = r.byServerID(res.LeaderID, reachable)
		}
		isFresh := h.probeFailures == 0
		if cand >= 0 && (leader < 0 || res.Term > term || (res.Term == term && isFresh && !fresh)) {
			leader, term, fresh = cand, res.Term, isFresh
		}
	}
	return leader
}

func (r *Router) byServerID(id string, among []int) int {
	for _, i := range among {
		if h := r.roster().health[i]; h.probed && h.lastProbe.ServerID == id {
			return i
		}
	}
	return -1
}
