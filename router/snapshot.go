package router

import "slices"

// snapshot is the immutable routing state read by Pick.
type snapshot struct {
	leader    int   // index into members, -1 when unknown
	reachable []int // members taking traffic, in member order
	pool      []int // reachable members in the read pool
	local     []int // pool members in the client's zone
	ejected   []int // out of the read pool on reads' evidence: they get the probe share
	benched   []int // out of the read pool on probes' evidence: no reads at all
	// unfit are the reachable members whose probes bench them, beyond the
	// cap too: they keep their place in the read pool when the cap says so,
	// but they hold no sessions or streams (Backend.Serves).
	unfit   []int
	serving []int // reachable and not unfit: where leader-bound calls fall back
	sticky  int   // the sticky policy's member
	inPool  []bool
}

// buildSnapshot assembles a snapshot; it is the only place one is built,
// so the minority cap holds on every path (probe rounds, Backend.Busy, SetMembers,
// forgetLeader). benched and ejected name the members out of the read pool
// in order of precedence (benched ones beyond the cap stay in the pool but
// are unfit: they hold no sessions or streams) (benchedLocked puts busy members first,
// ejectionsLocked the most severe first); members not reachable are
// dropped. Of the n reachable members at most ⌊(n−1)/2⌋ are kept out, the
// first in that order: the rest stay in the pool, which is so never empty.
func (r *Router) buildSnapshot(leader int, reachable, ejected, benched []int, sticky int) *snapshot {
	ro := r.roster()
	s := &snapshot{leader: leader, reachable: reachable, sticky: sticky, inPool: make([]bool, len(ro.members))}
	room := (len(reachable) - 1) / 2
	out := func(from []int, to *[]int) { // kept in precedence order, for the paths that rebuild from it
		for _, i := range from {
			if room > 0 && slices.Contains(reachable, i) && !slices.Contains(s.benched, i) && !slices.Contains(s.ejected, i) {
				*to = append(*to, i)
				room--
			}
		}
	}
	out(benched, &s.benched)
	out(ejected, &s.ejected)
	for _, i := range reachable {
		if slices.Contains(benched, i) {
			s.unfit = append(s.unfit, i)
		} else {
			s.serving = append(s.serving, i)
		}
		if !slices.Contains(s.benched, i) && !slices.Contains(s.ejected, i) {
			s.inPool[i] = true
			s.pool = append(s.pool, i)
			if r.cfg.ClientZone != "" && ro.members[i].Zone == r.cfg.ClientZone {
				s.local = append(s.local, i)
			}
		}
	}
	return s
}

// has reports whether member i is in the read pool; false for an index
// added to the roster after s was built.
func (s *snapshot) has(i int) bool { return i >= 0 && i < len(s.inPool) && s.inPool[i] }
