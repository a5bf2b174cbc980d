package router

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Router picks a member for each operation. Create one with New and release
// its background prober with Close.
type Router struct {
	cfg Config
	// ros is the member list with each member's health: indexes into it
	// never change (members are only added or retired), so a snapshot's
	// indexes stay valid in any later roster. Replaced under mu.
	ros     atomic.Pointer[roster]
	epoch   time.Time // monotonic base of Pick timestamps
	sysTime bool      // cfg.Clock is the system clock: use the monotonic fast path
	policy  policy
	rule    latencyRule  // policy.poolRule(): nil without a read pool
	seeded  bool         // random() uses rnd; else the runtime's per-thread generator
	timed   [numOps]bool // the policy consumes this class's latency
	// countsInflight: reads in flight per member are counted (LoadAware's
	// and least_cost's load term).
	countsInflight bool

	snap atomic.Pointer[snapshot]
	// hedge is nil unless Config.Hedge is set.
	hedge *hedger

	// The two cursors are written on almost every pick: each gets its own
	// cache line, away from the fields above that every pick reads.
	_   [64]byte
	rr  atomic.Uint64 // round-robin cursor shared by all rotations
	_   [56]byte
	rnd atomic.Uint64 // splitmix64 state
	_   [56]byte

	leaderChanges atomic.Uint64
	fallbacks     atomic.Uint64
	forgets       atomic.Uint64 // bumped by forgetLeader
	rounds        atomic.Uint64 // completed probe rounds

	collectorOnce sync.Once
	collector     *collector
	latency       *prometheus.HistogramVec // the collector's, for members added later; guarded by mu
	writeLatency  *prometheus.HistogramVec // likewise, for writes
	// readMedian is the median read EWMA of the judged members at the last
	// probe round (ns), 0 while unknown: the yardstick for censored samples
	// and for an ejected member's fresh reads.
	readMedian atomic.Int64
	// fairMedian is readMedian scaled back to the share the pool's members
	// had with every reachable member in the pool (storeMedians): the
	// ratio line for an ejected member's probe-share reads.
	fairMedian atomic.Int64

	mu         sync.Mutex // serialises snapshot rebuilds
	lastLeader int        // last known leader index, for counting changes; guarded by mu
	// announcedLeader is the leader the last leader event named, -1 after
	// leader_lost or before any; guarded by mu.
	announcedLeader int

	cadence
	refreshc chan struct{}
	// manualForced: the next Round probes every member (Config.Manual).
	manualForced atomic.Bool
	// manualMu serialises Rounds, and Close with the one under way.
	manualMu sync.Mutex
	cancel   context.CancelFunc
	done     chan struct{}
	closed   atomic.Bool
}

// New validates cfg, starts probing the members in the background and
// returns the router. Until the first probe answers, every member counts as
// reachable and the leader as unknown.
func New(cfg Config) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Members = slices.Clone(cfg.Members)
	r := &Router{
		cfg:        cfg,
		lastLeader: -1, announcedLeader: -1,
		refreshc: make(chan struct{}, 1),
		done:     make(chan struct{}),
		epoch:    cfg.Clock.Now(),
	}
	_, r.sysTime = cfg.Clock.(systemClock)
	r.policy = policyFor(cfg.Policy)
	r.rule = r.policy.poolRule()
	r.countsInflight = cfg.LoadAware || r.policy.countsInflight()
	if cfg.Hedge != nil {
		r.hedge = newHedger(*cfg.Hedge)
	}
	for op := range Op(numOps) {
		// Reading the clock costs more than the rest of Pick, so only the
		// classes whose latency the policy uses are timed.
		r.timed[op] = r.policy.timed(op)
	}
	r.rnd.Store(cfg.Seed)
	r.seeded = cfg.Seed != 0
	// Every client starts its rotations at a random member: a fleet whose
	// cursors all started at 0 would open every first stream on member 0.
	r.rr.Store(r.random())
	ro := &roster{members: cfg.Members, retired: make([]bool, len(cfg.Members))}
	for range cfg.Members {
		ro.health = append(ro.health, r.newHealth())
	}
	r.ros.Store(ro)
	sticky := int(r.random() % uint64(len(cfg.Members)))
	if cfg.StickyMember != "" {
		sticky = r.indexOf(cfg.StickyMember)
	}
	all := make([]int, len(cfg.Members))
	for i := range all {
		all[i] = i
	}
	r.snap.Store(r.buildSnapshot(-1, all, nil, nil, sticky))

	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	if cfg.Manual {
		r.manualForced.Store(true) // the first round probes every member, as the loop's does
		close(r.done)
	} else {
		go r.loop(ctx)
	}
	return r, nil
}

// Members returns the current members, retired ones left out.
func (r *Router) Members() []Member {
	ro := r.roster()
	var out []Member
	for i, m := range ro.members {
		if !ro.retired[i] {
			out = append(out, m)
		}
	}
	return out
}

// Member returns the member at stable index idx (the index Pick.Index,
// Stats and Backend.Busy use; retired members keep theirs). ok is false for an
// index the router never had and for a retired member.
func (r *Router) Member(idx int) (m Member, ok bool) {
	ro := r.roster()
	if idx < 0 || idx >= len(ro.members) || ro.retired[idx] {
		return Member{}, false
	}
	return ro.members[idx], true
}

// Policy returns the policy's name.
func (r *Router) Policy() string { return r.cfg.Policy }

// Close stops the background prober and waits for it. Later Picks fail with
// ErrClosed. Close is idempotent.
func (r *Router) Close() error {
	if r.cfg.Manual {
		r.manualMu.Lock() // the Round under way, if any, ends first
		defer r.manualMu.Unlock()
	}
	if r.closed.Swap(true) {
		return nil
	}
	r.cancel()
	<-r.done
	return nil
}

// Refresh asks for an immediate probe round without waiting for it; under
// Config.Manual, that the next Round probe every member (RoundPending).
func (r *Router) Refresh() {
	if r.cfg.Manual {
		r.manualForced.Store(true)
		return
	}
	select {
	case r.refreshc <- struct{}{}:
	default:
	}
}

// Reachable reports whether member idx answers its probes and serves.
func (r *Router) Reachable(idx int) bool {
	return slices.Contains(r.snap.Load().reachable, idx)
}

// unansweredError is WaitProbed's failure: ErrUnreachable, wrapping why a
// member's last probe failed, without repeating ErrUnreachable's text
// (the backends put theirs before it).
type unansweredError struct {
	timeout time.Duration
	member  string
	cause   error // nil when no probe failed (none came back)
}

func (e *unansweredError) Error() string {
	if e.cause == nil {
		return fmt.Sprintf("no member answered within %v", e.timeout)
	}
	return fmt.Sprintf("no member answered within %v (%s: %v)", e.timeout, e.member, e.cause)
}

func (e *unansweredError) Is(target error) bool { return target == ErrUnreachable }
func (e *unansweredError) Unwrap() error        { return e.cause }

// lastProbeErr returns a member whose last probe failed, and why: the
// first such member's, in member order.
func (r *Router) lastProbeErr() (id string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro := r.roster()
	for i, h := range ro.health {
		if h.probeErr != nil && !ro.retired[i] {
			return ro.members[i].ID, h.probeErr
		}
	}
	return "", nil
}

// WaitProbed waits until the leader is known or every member has answered
// a probe, so that routing is right from the first call. It fails with
// ErrUnreachable only if no member answers within timeout, wrapping why a
// member's last probe failed (a refused credential, say); if some did, it
// returns nil (the leader may come later).
func (r *Router) WaitProbed(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st := r.Stats()
		answered := 0
		for _, m := range st.Members {
			if m.ProbeOK {
				answered++
			}
		}
		switch {
		case st.Leader != "" || answered == len(st.Members):
			return nil
		case time.Now().After(deadline):
			if answered > 0 {
				return nil
			}
			id, err := r.lastProbeErr()
			return &unansweredError{timeout: timeout, member: id, cause: err}
		}
		time.Sleep(5 * time.Millisecond) // a start-up wait, not on any hot path
	}
}
