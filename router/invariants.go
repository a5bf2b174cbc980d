package router

import (
	"errors"
	"fmt"
	"slices"
)

// checkInvariants returns the first promise (package doc, Invariants) that
// the router's current state breaks, nil when it keeps them all. The
// state-machine property test calls it after every step.
func (r *Router) checkInvariants() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ro := r.snap.Load(), r.roster()
	n := len(ro.members)
	live := 0
	for i := range ro.members {
		if !ro.retired[i] {
			live++
		}
	}
	sets := map[string][]int{"reachable": s.reachable, "pool": s.pool, "local": s.local, "ejected": s.ejected, "benched": s.benched, "serving": s.serving, "unfit": s.unfit}
	for name, set := range sets {
		for _, i := range set {
			if i < 0 || i >= n {
				return fmt.Errorf("one index space: %s holds %d, roster has %d", name, i, n)
			}
			if ro.retired[i] {
				return fmt.Errorf("retired member %d in %s", i, name)
			}
			if name != "reachable" && !slices.Contains(s.reachable, i) {
				return fmt.Errorf("%s holds %d, which is not reachable", name, i)
			}
		}
	}
	if len(s.inPool) > n {
		return fmt.Errorf("one index space: inPool has %d entries, roster %d", len(s.inPool), n)
	}
	if s.leader >= n || (s.leader >= 0 && ro.retired[s.leader]) {
		return fmt.Errorf("leader %d retired or outside the roster", s.leader)
	}
	if s.sticky < 0 || s.sticky >= n || ro.retired[s.sticky] {
		return fmt.Errorf("sticky member %d retired or outside the roster", s.sticky)
	}
	if live > 0 && len(s.reachable) == 0 {
		return errors.New("no member reachable while members remain")
	}
	if len(s.reachable) > 0 && len(s.pool) == 0 {
		return errors.New("read pool empty while a member is reachable")
	}
	if out := len(s.ejected) + len(s.benched); out > (len(s.reachable)-1)/2 {
		return fmt.Errorf("minority cap: %d of %d reachable members out of the pool (ejected %v, benched %v)", out, len(s.reachable), s.ejected, s.benched)
	}
	for _, i := range s.benched {
		if !slices.Contains(s.unfit, i) {
			return fmt.Errorf("member %d benched but not unfit", i)
		}
	}
	for _, i := range s.pool {
		if slices.Contains(s.ejected, i) || slices.Contains(s.benched, i) || !s.has(i) {
			return fmt.Errorf("member %d both in and out of the pool", i)
		}
	}
	if fair, median := r.fairMedian.Load(), r.readMedian.Load(); fair < 0 || fair > median {
		return fmt.Errorf("share-fair read median %v outside [0, median %v]", fair, median)
	}
	for i, h := range ro.health {
		if err := h.cost.check(); err != nil {
			return fmt.Errorf("member %d's read-cost model: %w", i, err)
		}
	}
	if r.settled.Load() && !r.evidence.Load() {
		// Probing rarely only while nothing needs watching.
		if s.leader < 0 || len(s.reachable) != live || len(s.pool) != live || len(s.unfit) > 0 {
			return fmt.Errorf("settled without a leader or with members out (leader %d, %d live, reachable %v, pool %v, unfit %v)", s.leader, live, s.reachable, s.pool, s.unfit)
		}
	}
	return nil
}
