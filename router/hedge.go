package router

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/internal/override"
)

// HedgeConfig configures hedged reads: when a read has not answered after
// about the pool's recent 99th-percentile read latency, the same read goes
// to a second healthy member and the first answer wins (Dean and Barroso,
// "The Tail at Scale", CACM 2013; gRPC's hedging policy, gRFC A6). EWMA
// ejection needs many slow samples; a hedge answers a short stall (a GC
// pause, a compaction, a noisy neighbour) on the read it delays.
//
// Only reads are hedged, and only under a policy with a read pool (hybrid,
// least_cost): a hedge goes to the pool, by rotation. Under least_cost a
// read's losing attempt is a model sample only when it was cut far above
// the median (as any censored read), so the model sees less of a member's
// slow tail than without hedging. Writes and streams never are. A budget caps the extra
// reads, and failing reads stop hedging, as gRFC A6's retry throttle does.
type HedgeConfig struct {
	// Enabled hedges every read unless its call opts out (WithHedging(ctx,
	// false)). When false, only calls that opt in are hedged.
	Enabled bool
	// Quantile of the pool's recent read latencies, per read class, after
	// which the hedge goes. Default 0.99: Dean and Barroso's 0.95 sends
	// ~5 % of reads twice on a healthy pool, where the hedge almost never
	// wins (measured: 2.7–3.0 % extra reads, 2–4 % of them won), and spends
	// the budget that a stalled member's reads then lack.
	Quantile float64
	// MinDelay floors the hedge delay, so that a fast, tight distribution
	// does not hedge on noise. Default 1 ms.
	MinDelay time.Duration
	// Window is how many recent answered reads per class the quantile is
	// taken over; no read is hedged before the first MinReads of them.
	// Defaults 1024 and 100.
	Window   int
	MinReads int
	// Budget is the most extra reads as a share of reads: each read earns
	// Budget tokens and each hedge spends one (a retry budget, as
	// Finagle's); each failed read (member fault or overloaded) spends one
	// too, as gRFC A6's retry throttle, so that a failing pool is not sent
	// more. A hedge goes only if at least half of MaxTokens remain after
	// it. Defaults 0.05 (at least 0.001) and 100: half of it is the burst,
	// 50 hedges, enough for the reads a member in the pool holds when it
	// freezes until a probe round takes it out: the one its stall brings,
	// within three rounds when settled (a third of ~1 000 reads/s for
	// 250 ms is ~80 reads, most of them answered in time).
	Budget    float64
	MaxTokens float64
}

func (h *HedgeConfig) setDefaults() {
	orDefault(&h.Quantile, 0.99)
	orDefault(&h.MinDelay, time.Millisecond)
	orDefault(&h.Window, 1024)
	orDefault(&h.MinReads, 100)
	orDefault(&h.Budget, 0.05)
	orDefault(&h.MaxTokens, 100)
}

func (h *HedgeConfig) validate(policy string) error {
	switch {
	case policyFor(policy).poolRule() == nil:
		return fmt.Errorf("%w: hedging needs a read pool (%s or %s), not %s", ErrInvalidConfig, Hybrid, LeastCost, policy)
	case !(h.Quantile > 0 && h.Quantile < 1):
		return fmt.Errorf("%w: hedge quantile %v outside (0, 1)", ErrInvalidConfig, h.Quantile)
	case h.MinDelay < 0:
		return fmt.Errorf("%w: hedge min delay %v is negative", ErrInvalidConfig, h.MinDelay)
	case h.Window < 1 || h.MinReads < 1 || h.MinReads > h.Window:
		return fmt.Errorf("%w: hedge window %d and min reads %d: want 1 ≤ min reads ≤ window", ErrInvalidConfig, h.Window, h.MinReads)
	case !(h.Budget >= 0.001 && h.Budget <= 1):
		return fmt.Errorf("%w: hedge budget %v outside [0.001, 1]", ErrInvalidConfig, h.Budget)
	case !(h.MaxTokens >= 2) || math.IsInf(h.MaxTokens, 0):
		return fmt.Errorf("%w: hedge max tokens %v: want at least 2", ErrInvalidConfig, h.MaxTokens)
	}
	return nil
}

// Timers is an optional interface of a Clock: a fake clock that implements
// it decides when hedges fire. Without it they fire on real timers.
type Timers interface {
	// AfterFunc calls f in its own goroutine after d, unless stop, called
	// first, returns true.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// hedger is the router's hedging state: recent read latencies per class,
// the delay taken from them at each probe round, and the token bucket.
type hedger struct {
	cfg   HedgeConfig
	rings [numOps]latencyRing
	// Written at each probe round, read by every hedged read: away from
	// the counters every read writes.
	_     [64]byte
	delay [numOps]atomic.Int64 // ns; 0 while too few reads are known
	_     [32]byte
	// tokens is the bucket in thousandths of a token.
	tokens    atomic.Int64
	_         [56]byte
	sent      atomic.Uint64 // hedges launched
	won       atomic.Uint64 // hedges whose answer was the one returned
	throttled atomic.Uint64 // hedges the budget refused
}

func newHedger(cfg HedgeConfig) *hedger {
	h := &hedger{cfg: cfg}
	for op := range Op(numOps) {
		if op.IsRead() {
			h.rings[op].ns = make([]atomic.Int64, cfg.Window)
		}
	}
	h.tokens.Store(int64(cfg.MaxTokens * 1000))
	return h
}

// latencyRing keeps the last len(ns) answered reads' latencies.
type latencyRing struct {
	next atomic.Uint64
	ns   []atomic.Int64
	_    [32]byte // each ring's cursor on a line of its own
}

func (l *latencyRing) add(d time.Duration) {
	l.ns[(l.next.Add(1)-1)%uint64(len(l.ns))].Store(int64(d))
}

// update sets each read class's hedge delay from its ring. Called at each
// probe round, off the hot path.
func (h *hedger) update() {
	var buf []int64
	for op := range Op(numOps) {
		if !op.IsRead() {
			continue
		}
		l := &h.rings[op]
		n := int(min(l.next.Load(), uint64(len(l.ns))))
		if n < h.cfg.MinReads {
			h.delay[op].Store(0)
			continue
		}
		buf = buf[:0]
		for i := range n {
			buf = append(buf, l.ns[i].Load())
		}
		slices.Sort(buf)
		q := time.Duration(buf[min(n-1, int(h.cfg.Quantile*float64(n)))])
		h.delay[op].Store(int64(max(q, h.cfg.MinDelay)))
	}
}

// earn credits one read's share of the budget (or, negative, takes it).
func (h *hedger) earn(milli int64) {
	limit := int64(h.cfg.MaxTokens * 1000)
	for {
		old := h.tokens.Load()
		next := min(max(old+milli, 0), limit)
		if next == old || h.tokens.CompareAndSwap(old, next) {
			return
		}
	}
}

// spend takes one token for a hedge, if at least half the bucket remains
// after it.
func (h *hedger) spend() bool {
	half := int64(h.cfg.MaxTokens * 500)
	for {
		old := h.tokens.Load()
		if old-1000 < half {
			return false
		}
		if h.tokens.CompareAndSwap(old, old-1000) {
			return true
		}
	}
}

type hedgingKey struct{}

// WithHedging returns a context whose reads are hedged (on) or not (off),
// whatever the client's default, on a router with hedging configured
// (Config.Hedge). Writes and streams are never hedged.
func WithHedging(ctx context.Context, on bool) context.Context {
	return context.WithValue(ctx, hedgingKey{}, on)
}

// attemptKey carries an attempt's slot. Pick records in a first attempt's
// slot the member it chose, so that the hedge goes elsewhere; a hedge's
// slot marks its pick, whose latency is not a sample of the pool's (a hedge
// wins on the short reads; counting them would pull the delay down until
// only the budget limited hedging).
type attemptKey struct{}

type attemptSlot struct {
	idx   atomic.Int32
	hedge bool
}

// hedgeDelay returns how long a read of class op on ctx waits for its answer
// before a hedge goes, and whether it may be hedged: hedging is configured
// and asked for (by default or on ctx), op is a read, no override pins the
// call, and enough reads are known to set the delay. Each read asked about
// earns its share of the budget.
func (r *Router) hedgeDelay(ctx context.Context, op Op) (time.Duration, bool) {
	h := r.hedge
	if h == nil || !op.IsRead() {
		return 0, false
	}
	on := h.cfg.Enabled
	if v, ok := ctx.Value(hedgingKey{}).(bool); ok {
		on = v
	}
	if !on || override.Any(ctx) {
		return 0, false
	}
	h.earn(int64(h.cfg.Budget * 1000))
	d := time.Duration(h.delay[op].Load())
	return d, d > 0
}

// hedgeTarget picks the member for a hedge: a read-pool member other than
// exclude (the first attempt's), spending a token. ok is false when the
// pool has no other member or the budget is spent.
func (r *Router) hedgeTarget(op Op, exclude int) (Member, bool) {
	s := r.snap.Load()
	var others [16]int
	set := others[:0]
	pool := s.pool
	if op == StaleRead && len(s.local) > 1 {
		pool = s.local
	}
	for _, i := range pool {
		if i != exclude && len(set) < len(others) {
			set = append(set, i)
		}
	}
	if exclude < 0 || len(set) == 0 {
		return Member{}, false
	}
	if !r.hedge.spend() {
		r.hedge.throttled.Add(1)
		return Member{}, false
	}
	idx := set[0]
	if len(set) > 1 {
		idx = r.choosePool(set)
	}
	return r.roster().members[idx], true
}

// hedgeConfig returns a copy of the hedging configuration, nil without.
func (r *Router) hedgeConfig() *HedgeConfig {
	if r.hedge == nil {
		return nil
	}
	h := r.hedge.cfg
	return &h
}

// Hedging reports whether the router has hedging configured (Config.Hedge):
// backends skip the race machinery without it.
func (r *Router) Hedging() bool { return r.hedge != nil }

// HedgeStats counts hedges: Sent, Won (those whose answer came first), and
// Throttled (due but refused by the budget: a pool slow or failing for
// longer than the budget covers).
type HedgeStats struct {
	Sent, Won, Throttled uint64
}

// Hedges returns the router's hedge counts (zero without Config.Hedge).
func (r *Router) Hedges() HedgeStats {
	if r.hedge == nil {
		return HedgeStats{}
	}
	return HedgeStats{Sent: r.hedge.sent.Load(), Won: r.hedge.won.Load(), Throttled: r.hedge.throttled.Load()}
}

// Hedge runs one read of class op, hedged when r says so (hedgeDelay):
// attempt(ctx, false) at once, which the backend routes as usual (its Pick
// on this ctx records the member it chose), and, if no answer has come
// after the delay, attempt(ctx2, true) with ctx2 preferring a second
// read-pool member (WithPreferredMember: a member retired meanwhile falls
// back to the pool rather than failing). The hedge must not share anything
// the first attempt writes: reply buffers, output call options. The first
// answer wins and the other attempt's context is cancelled: its backend
// reports it CallerGaveUp, never a fault. outcome is the backend's
// classification of an attempt's error (OK for nil): an attempt that
// answered (OK or AppError, a refusal on the merits) wins; a failed one
// waits for the other, and when both fail the first's error is returned.
// Without a hedge it is attempt(ctx, false).
func Hedge[T any](ctx context.Context, r *Router, op Op, attempt func(ctx context.Context, hedge bool) (T, error), outcome func(error) Outcome) (T, error) {
	answered := func(err error) bool {
		o := outcome(err)
		return o == OK || o == AppError
	}
	delay, ok := r.hedgeDelay(ctx, op)
	if !ok {
		return attempt(ctx, false)
	}
	start := r.elapsed()
	race := &hedgeRace[T]{done: make(chan struct{})}
	slot := &attemptSlot{}
	slot.idx.Store(-1)
	ctx1, cancel1 := context.WithCancel(context.WithValue(ctx, attemptKey{}, slot))
	defer cancel1()
	stop := r.afterFunc(delay, func() {
		defer close(race.done)
		m, ok := r.hedgeTarget(op, int(slot.idx.Load()))
		if !ok {
			return
		}
		race.mu.Lock()
		if race.winner != 0 {
			race.mu.Unlock()
			r.hedge.earn(1000) // not sent: the token goes back
			return
		}
		ctx2, cancel2 := context.WithCancel(context.WithValue(WithPreferredMember(ctx, m.ID), attemptKey{}, &attemptSlot{hedge: true}))
		race.cancel2 = cancel2
		race.mu.Unlock()
		defer cancel2()
		r.hedge.sent.Add(1)
		race.v, race.err = attempt(ctx2, true)
		race.sent = true
		if answered(race.err) && race.win(2) {
			r.hedge.won.Add(1)
			// The first attempt took at least this long: a censored sample
			// of the pool's latency, in place of the hedge's.
			r.hedge.rings[op].add(r.elapsed() - start)
			cancel1()
		}
	})
	v, err := attempt(ctx1, false)
	if answered(err) && race.win(1) {
		stop()
		return v, err
	}
	if stop() {
		return v, err // no hedge went
	}
	<-race.done
	if race.sent && answered(race.err) {
		return race.v, race.err
	}
	return v, err
}

// hedgeRace is one hedged read's shared state.
type hedgeRace[T any] struct {
	mu      sync.Mutex
	winner  int // 0 none yet, 1 the first attempt, 2 the hedge
	cancel2 context.CancelFunc
	done    chan struct{} // closed when the hedge's timer func returns
	// Written by the hedge before done closes.
	v    T
	err  error
	sent bool
}

// win makes who the winner if there is none yet; the first attempt's win
// cancels the hedge.
func (h *hedgeRace[T]) win(who int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.winner != 0 {
		return false
	}
	h.winner = who
	if who == 1 && h.cancel2 != nil {
		h.cancel2()
	}
	return true
}

func (r *Router) afterFunc(d time.Duration, f func()) (stop func() bool) {
	if t, ok := r.cfg.Clock.(Timers); ok {
		return t.AfterFunc(d, f)
	}
	return time.AfterFunc(d, f).Stop
}
