package router

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oproute/oproute/ewma"
)

// memberHealth is the per-member state updated on the hot path.
type memberHealth struct {
	read  *ewma.EWMA // read latency: the read pool's health signal at low traffic
	all   *ewma.EWMA // every op's latency: boltzmann's blended signal
	probe *ewma.EWMA // probe round trips

	consecutiveFailures atomic.Int64 // any class: boltzmann's rule
	readFailStreak      atomic.Int64 // reads only: the failure rule
	readFails           atomic.Uint64
	// readStalls counts reads cut by their callers far above the median
	// (censored samples that count): with failures, what makes a window
	// troubled.
	readStalls atomic.Uint64
	// freshInLine counts an ejected member's probe-share reads in a row
	// that were in line with the others: its evidence for readmission.
	freshInLine atomic.Int64
	// busy counts maintenance calls in flight (see Backend.Busy); busyEpoch
	// is bumped when one starts or ends, so that a read or probe that
	// overlapped one is not taken as evidence.
	busy      atomic.Int32
	busyEpoch atomic.Uint64
	// inflight counts reads picked and not yet done, under LoadAware and
	// least_cost.
	inflight atomic.Int64
	cost     readCost // least_cost's model
	// weight is boltzmann's exp(−EWMA/τ), as float64 bits, refreshed when a
	// sample lands so that Pick does no exp of its own.
	weight atomic.Uint64
	ops    [numOps]atomic.Uint64
	oks    [numOps]atomic.Uint64 // answered: OK or AppError
	errs   [numOps]atomic.Uint64
	gaveUp [numOps]atomic.Uint64
	// ignored counts calls that ended while the member was busy (not
	// evidence): with the others, every pick's end is counted once.
	ignored [numOps]atomic.Uint64

	// Off the hot path, guarded by Router.mu.
	probeFailures int
	probeErr      error // why the last probe failed; nil once one succeeds
	lastProbe     ProbeResult
	probed        bool
	// forgotten: a write pinned to this member as leader failed since its
	// last good probe, so its last claim to lead is not carried over a
	// failed probe (electedLeader). forgottenAt is r.forgets after that
	// failure: only a probe from a round that began later clears it.
	forgotten     bool
	forgottenAt   uint64
	window        failureWindow
	ejected       bool      // ejected on reads' evidence; survives a spell on the bench
	ejectWhy      string    // why it was ejected
	benchWhy      string    // why its probes bench it, "" when they do not
	ejectUntil    time.Time // the least end of the current ejection
	ejectedAt     time.Time // the start of the current or last ejection
	ejections     int       // ejections not yet forgiven: the backoff's exponent
	totalEjected  uint64
	readmissions  uint64
	reached       bool // a probe has succeeded
	added         bool // added by SetMembers: no traffic before its first good probe
	outAnnounced  bool // an EventLeftPool was sent and no EventBackInPool since
	downAnnounced bool // an EventUnreachable was sent and no EventReachable since
	// totalProbeFailures counts every failed probe (probeFailures only
	// those in a row).
	totalProbeFailures uint64
	admittedAt         time.Time // last readmission
	// slowReadRounds and slowProbeRounds count the probe rounds in a row
	// at which the latency rule, or the probe-RTT rule, held.
	slowReadRounds, slowProbeRounds int
	// idleRounds counts the rounds in a row that ended no read of the
	// member: they hold slowReadRounds, up to EjectRounds of them.
	// edgeRounds counts the rounds of the current run whose reads were on
	// the edge (between the readmission and ejection lines): they hold it
	// too, up to EjectRounds-1 of them.
	idleRounds, edgeRounds int
	// reads sums the read samples the EWMA gets (see readSumBits): at load a
	// round's mean over them is the latency rule's signal, where the EWMA
	// holds the last few reads only. roundReads is its value at the last
	// round.
	reads      atomic.Uint64
	roundReads uint64
	// stalled counts the rounds in a row at which the member answered no
	// call (OK, AppError or a fault) while it held calls or its callers
	// gave up on some; lastAnswered and lastGaveUp are the counts at the
	// round before.
	stalled                  int
	lastAnswered, lastGaveUp uint64
	// probedIn is the probe round (r.rounds) of the member's last answer;
	// picksAtProbe its picks at its last probe, and settledSkips the
	// settled rounds in a row that left it out (settledSkip). probeWhy is
	// what its probes said (benchedLocked) at the last round that probed
	// it and the leader together.
	probedIn     uint64
	picksAtProbe uint64
	settledSkips int
	probeWhy     string

	_ [64]byte // keep neighbours' hot counters off this cache line
}

// roster is the router's member list. Its slices are never changed in
// place: SetMembers publishes a new roster.
type roster struct {
	members []Member
	health  []*memberHealth
	retired []bool // removed by SetMembers: never picked, probed or leader
	// hist and writeHist hold each member's read and write latency
	// observers once Collector has been called; nil before (Pick and Done
	// then skip them).
	hist, writeHist []prometheus.Observer
}

func (r *Router) roster() *roster { return r.ros.Load() }

// Read sums pack a count of samples and their total in microseconds into
// one word, so that a round reads both at one instant (two counters read
// apart could count a sample without its time, or its time without it).
// A round's difference, taken modulo 2^64, is exact while the round (one
// ProbeInterval) has fewer than 2^24 samples totalling under 2^40 µs
// (about 12.7 days). A sample is stored within [0, 2^40) µs, so that
// alone it cannot carry into the count.
const (
	readSumBits = 40
	readSumMask = 1<<readSumBits - 1
)

// sample adds a read latency sample to the member's estimates.
func (h *memberHealth) sample(d time.Duration) {
	h.read.Add(d)
	h.reads.Add(1<<readSumBits | uint64(min(max(d.Microseconds(), 0), readSumMask)))
}

// readsSince returns the samples added to sums between two readings of
// memberHealth.reads, and their total.
func readsSince(prev, now uint64) (n int64, total time.Duration) {
	delta := now - prev
	return int64(delta >> readSumBits), time.Duration(delta&readSumMask) * time.Microsecond
}

// newHealth returns a member's initial health.
func (r *Router) newHealth() *memberHealth {
	h := &memberHealth{}
	h.read, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	h.all, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	h.probe, _ = ewma.New(r.cfg.Alpha, r.cfg.InitialLatency)
	r.updateWeight(h)
	h.cost.least.Store(math.MaxUint64)
	return h
}

// markBusy is Backend.Busy.
func (r *Router) markBusy(idx int) (end func()) {
	h := r.roster().health[idx]
	r.mu.Lock()
	h.busy.Add(1)
	h.busyEpoch.Add(1)
	r.rebenchLocked()
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			h.busy.Add(-1)
			h.busyEpoch.Add(1)
			r.rebenchLocked()
			r.mu.Unlock()
		})
	}
}

// rebenchLocked rebuilds the snapshot with the benched members recomputed
// and everything else as it is (buildSnapshot keeps the minority cap: a
// busy member may take an ejected one's place out of the pool until the
// next round judges them again). Caller must hold r.mu.
func (r *Router) rebenchLocked() {
	r.evidence.Store(true) // probes follow the member through its maintenance
	s := r.snap.Load()
	r.snap.Store(r.buildSnapshot(s.leader, s.reachable, s.ejected, r.benchedLocked(s.reachable, s.leader), s.sticky))
}

// readsEnded counts the member's reads that ended, whatever the outcome
// but NotSent: unlike ops, which counts picks and gives a NotSent one back,
// it never falls, so that the failure window's deltas stay true.
func (h *memberHealth) readsEnded() uint64 {
	var n uint64
	for _, op := range [...]Op{LinearizableRead, StaleRead} {
		n += h.oks[op].Load() + h.errs[op].Load() + h.gaveUp[op].Load()
	}
	return n
}

// picks counts the calls ever picked for the member, NotSent ones taken back.
func (h *memberHealth) picks() uint64 {
	var n uint64
	for op := range h.ops {
		n += h.ops[op].Load()
	}
	return n
}

// wasMember reports whether id names a retired member.
func (r *Router) wasMember(id string) bool {
	ro := r.roster()
	for i := range ro.members {
		if ro.members[i].ID == id && ro.retired[i] {
			return true
		}
	}
	return false
}

func (r *Router) indexOf(id string) int {
	ro := r.roster()
	for i := range ro.members {
		if ro.members[i].ID == id && !ro.retired[i] {
			return i
		}
	}
	return -1
}

// errRetired is a retired member's probe outcome: it is not probed.
var errRetired = errors.New("router: member retired")

// SetMembers changes the member set to ms, as New's Config.Members: a
// member whose address is already known keeps its index and its health
// (its ID and zone are updated); a new one is added and takes traffic only
// after its first good probe; a member whose address is not in ms is
// retired: it gets no new picks (calls in flight finish), is no longer
// probed, and is left out of the metrics; Stats lists it (indexes never
// move) with Retired set. It
// fails, changing nothing, on an empty list or two members with one
// address.
func (r *Router) SetMembers(ms []Member) error {
	if len(ms) == 0 {
		return ErrNoMembers
	}
	seen := map[string]bool{}
	for _, m := range ms {
		if m.Addr == "" {
			return fmt.Errorf("%w: member %q has no address", ErrInvalidConfig, m.ID)
		}
		if seen[m.Addr] {
			return fmt.Errorf("%w: %q", ErrDuplicateMember, m.Addr)
		}
		seen[m.Addr] = true
	}
	r.mu.Lock()
	old := r.roster()
	ro := &roster{members: slices.Clone(old.members), health: slices.Clone(old.health), retired: slices.Clone(old.retired),
		hist: slices.Clone(old.hist), writeHist: slices.Clone(old.writeHist)}
	keep := map[string]bool{}
	for _, m := range ms {
		i := slices.IndexFunc(ro.members, func(o Member) bool { return o.Addr == m.Addr })
		for i >= 0 && ro.retired[i] { // a live one added since?
			j := slices.IndexFunc(ro.members[i+1:], func(o Member) bool { return o.Addr == m.Addr })
			if j < 0 {
				i = -1
				break
			}
			i += 1 + j
		}
		if i >= 0 {
			ro.members[i] = m
			keep[m.Addr] = true
			continue
		}
		h := r.newHealth()
		h.added = true
		ro.members = append(ro.members, m)
		ro.health = append(ro.health, h)
		ro.retired = append(ro.retired, false)
		if ro.hist != nil {
			ro.hist = append(ro.hist, r.latency.WithLabelValues(m.ID))
			ro.writeHist = append(ro.writeHist, r.writeLatency.WithLabelValues(m.ID))
		}
		keep[m.Addr] = true
	}
	for i, m := range ro.members {
		if !keep[m.Addr] {
			ro.retired[i] = true
		}
	}
	r.ros.Store(ro)
	// The snapshot of the old roster stays valid (indexes never move) until
	// the round that Refresh asks for drops the retired members.
	s := r.snap.Load()
	reachable := slices.DeleteFunc(slices.Clone(s.reachable), func(i int) bool { return ro.retired[i] })
	if len(reachable) == 0 {
		for i := range ro.members {
			if !ro.retired[i] {
				reachable = append(reachable, i)
			}
		}
	}
	leader := s.leader
	if leader >= 0 && ro.retired[leader] {
		leader = -1
	}
	sticky := s.sticky
	if ro.retired[sticky] {
		sticky = reachable[0]
	}
	r.snap.Store(r.buildSnapshot(leader, reachable, slices.DeleteFunc(slices.Clone(s.ejected), func(i int) bool { return ro.retired[i] }), slices.DeleteFunc(slices.Clone(s.unfit), func(i int) bool { return ro.retired[i] }), sticky))
	r.mu.Unlock()
	r.unsettle()
	return nil
}
