package router

import (
	"slices"
	"time"
)

// Stats is a point-in-time view of the router.
type Stats struct {
	// Policy is the routing policy: one of Policies(). Hybrid's variants
	// (HybridHedge, HybridP2C) are hybrid with the options below.
	Policy string
	// LoadAware: hybrid chooses within the read pool by power of two
	// choices (Config.LoadAware).
	LoadAware bool
	// Hedge is the hedging configuration (Config.Hedge, its defaults
	// applied); nil without hedging.
	Hedge *HedgeConfig
	// Leader is the ID of the member writes are pinned to, "" when unknown.
	Leader string
	// LeaderChanges counts moves of the known leader from one member to another.
	LeaderChanges uint64
	// Fallbacks counts leader-bound operations sent round robin because the
	// leader was unknown.
	Fallbacks uint64
	// Hedges counts hedged reads (Config.Hedge): sent, and won.
	Hedges HedgeStats
	// Settled: the router probes every StableProbeInterval, nothing to
	// watch (see the package doc, Probe cadence).
	Settled bool
	// ProbeRounds counts the probe rounds so far.
	ProbeRounds uint64
	Members     []MemberStats
}

// MemberStats is one member's share of Stats.
type MemberStats struct {
	Member Member
	// Ops counts operations routed to the member, by Op (in flight ones
	// included); OK those it answered (OK or AppError), Errors those that
	// ended in MemberFault or Overloaded, GaveUp those the caller gave up on.
	Ops    [numOps]uint64
	OK     [numOps]uint64
	Errors [numOps]uint64
	GaveUp [numOps]uint64
	// ReadLatency is the member's read EWMA (kept by the hybrid policy,
	// which uses it); ProbeRTT its probe EWMA.
	ReadLatency time.Duration
	ProbeRTT    time.Duration
	// ProbeOK: the member answered its last leader probe.
	ProbeOK   bool
	Reachable bool
	// Ejected: reachable but out of the read pool; OutReason says why
	// ("latency", "failures", "probe_rtt", "no_leader", "older_term",
	// "apply_lag"). Ejections counts how often it was ejected.
	Ejected   bool
	OutReason string
	Ejections uint64
	// Readmissions counts its returns to the read pool after an ejection;
	// ProbeFailures its failed probes.
	Readmissions  uint64
	ProbeFailures uint64
	Leader        bool
	// Retired: SetMembers removed it; it takes no traffic.
	Retired bool
	// ReadCost is the least_cost policy's model of the member; zero under
	// the other policies.
	ReadCost ReadCostStats
}

// ReadCostStats is least_cost's read-cost model of one member and its
// baseline judge's verdict (see the godoc of readCost and judgeRound in
// router/readcost.go and router/readjudge.go).
type ReadCostStats struct {
	// Base and PerRead are the fitted line: a read placed while q of the
	// client's reads are in flight there is expected to take
	// Base + PerRead × (q + 1). Zero until the fit holds enough reads.
	Base, PerRead time.Duration
	// Excess is the baseline judge's evidence that the member is slower
	// than its own baseline predicts, as a share of its threshold: it finds
	// the member failing from when Excess reaches 1 until it falls below
	// 0.5, and the member leaves the read pool on latency meanwhile.
	// Verdicts counts the times it reached 1.
	Excess   float64
	Verdicts uint64
}

// Reads returns the linearizable and stale reads routed to the member.
func (m MemberStats) Reads() uint64 { return m.Ops[LinearizableRead] + m.Ops[StaleRead] }

// Stats returns a snapshot of the router's counters and state.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.snap.Load() // under mu: the view and the health fields of one round
	st := Stats{
		Policy:        r.cfg.Policy,
		LoadAware:     r.cfg.LoadAware,
		Hedge:         r.hedgeConfig(),
		LeaderChanges: r.leaderChanges.Load(),
		Fallbacks:     r.fallbacks.Load(),
		Hedges:        r.Hedges(),
		Settled:       r.settled.Load(),
		ProbeRounds:   r.rounds.Load(),
		Members:       make([]MemberStats, len(r.roster().members)),
	}
	if s.leader >= 0 {
		st.Leader = r.roster().members[s.leader].ID
	}
	for i := range r.roster().members {
		h := r.roster().health[i]
		ms := MemberStats{
			Member:        r.roster().members[i],
			Retired:       r.roster().retired[i],
			ReadLatency:   h.read.Value(),
			ProbeRTT:      h.probe.Value(),
			Ejected:       slices.Contains(s.ejected, i) || slices.Contains(s.benched, i),
			Ejections:     h.totalEjected,
			Readmissions:  h.readmissions,
			ProbeFailures: h.totalProbeFailures,
			Leader:        i == s.leader,
			ProbeOK:       h.probed && h.probeFailures == 0,
		}
		for _, j := range s.reachable {
			ms.Reachable = ms.Reachable || i == j
		}
		r.policy.describe(h, &ms)
		switch {
		case slices.Contains(s.benched, i):
			ms.OutReason = h.benchWhy
		case slices.Contains(s.ejected, i):
			ms.OutReason = h.ejectWhy
		}
		for op := range numOps {
			ms.Ops[op] = h.ops[op].Load()
			ms.OK[op] = h.oks[op].Load()
			ms.Errors[op] = h.errs[op].Load()
			ms.GaveUp[op] = h.gaveUp[op].Load()
		}
		st.Members[i] = ms
	}
	return st
}
