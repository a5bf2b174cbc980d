package router

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

// timerClock is a fake clock whose AfterFunc timers fire only when the test
// says so.
type timerClock struct {
	*fakeClock
	mu      sync.Mutex
	pending []*fakeTimer
}

type fakeTimer struct {
	f       func()
	delay   time.Duration
	stopped bool
	fired   bool
}

func newTimerClock() *timerClock {
	return &timerClock{fakeClock: &fakeClock{now: time.Unix(1e9, 0)}}
}

func (c *timerClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{f: f, delay: d}
	c.pending = append(c.pending, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.fired || t.stopped {
			return false
		}
		t.stopped = true
		return true
	}
}

// next waits for a timer that has neither fired nor been stopped.
func (c *timerClock) next(t *testing.T) *fakeTimer {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		for _, ft := range c.pending {
			if !ft.fired && !ft.stopped {
				c.mu.Unlock()
				return ft
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no hedge timer armed")
		}
		time.Sleep(time.Millisecond)
	}
}

// fire runs the timer's func in its own goroutine, as time.AfterFunc does,
// unless it was stopped first.
func (c *timerClock) fire(ft *fakeTimer) (done <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if ft.stopped || ft.fired {
		close(ch)
		return ch
	}
	ft.fired = true
	go func() { defer close(ch); ft.f() }()
	return ch
}

func hedgingRouter(t *testing.T, hc HedgeConfig) (testRouter, *timerClock) {
	t.Helper()
	clock := newTimerClock()
	tr := newTestRouter(t, Config{Clock: clock, Hedge: &hc})
	tr.run(t, 300, LinearizableRead, flat(2*time.Millisecond))
	tr.probeRound()
	return tr, clock
}

// readAt is a backend's read: it picks on ctx, then answers at once when
// the member is in fast, and otherwise waits for ctx (a stalled member),
// reporting the outcome as a backend does.
func readAt(tr testRouter, fast map[string]bool, picked chan<- string) func(ctx context.Context, hedge bool) (string, error) {
	return func(ctx context.Context, _ bool) (string, error) {
		p, err := tr.Pick(ctx, LinearizableRead)
		if err != nil {
			return "", err
		}
		if picked != nil {
			picked <- p.Member.ID
		}
		if fast[p.Member.ID] {
			p.Done(OK)
			return p.Member.ID, nil
		}
		<-ctx.Done()
		p.Done(CallerGaveUp)
		return "", ctx.Err()
	}
}

// outcome classifies a test attempt's error: any error is a fault.
func outcome(err error) Outcome {
	if err != nil {
		return MemberFault
	}
	return OK
}

func TestHedgeDelayFromThePoolsQuantile(t *testing.T) {
	clock := newTimerClock()
	tr := newTestRouter(t, Config{Clock: clock, Hedge: &HedgeConfig{Enabled: true, Quantile: 0.95}})
	ctx := context.Background()
	if _, ok := tr.hedgeDelay(ctx, LinearizableRead); ok {
		t.Fatal("hedging before any read is known")
	}
	// Reads of 1..100 ms in equal numbers: the 95th percentile is ~95 ms.
	for i := range 1000 {
		p, _ := tr.Pick(ctx, LinearizableRead)
		tr.clock.Advance(time.Duration(i%100+1) * time.Millisecond)
		p.Done(OK)
	}
	tr.probeRound()
	d, ok := tr.hedgeDelay(ctx, LinearizableRead)
	if !ok || d < 94*time.Millisecond || d > 97*time.Millisecond {
		t.Fatalf("delay %v %v, want ~95 ms", d, ok)
	}
	if _, ok := tr.hedgeDelay(ctx, StaleRead); ok {
		t.Fatal("stale reads hedged on linearizable reads' latencies")
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		op   Op
	}{
		{"write", ctx, Write},
		{"stream", ctx, Stream},
		{"opted out", WithHedging(ctx, false), LinearizableRead},
		{"pinned to a member", WithMember(ctx, "m1"), LinearizableRead},
		{"pinned to the leader", WithLeader(ctx), LinearizableRead},
	} {
		if _, ok := tr.hedgeDelay(c.ctx, c.op); ok {
			t.Errorf("%s: hedged", c.name)
		}
	}

	// A fast, tight distribution is floored at MinDelay.
	tr2 := newTestRouter(t, Config{Clock: newTimerClock(), Hedge: &HedgeConfig{Enabled: true, MinDelay: 3 * time.Millisecond}})
	tr2.run(t, 300, LinearizableRead, flat(100*time.Microsecond))
	tr2.probeRound()
	if d, _ := tr2.hedgeDelay(ctx, LinearizableRead); d != 3*time.Millisecond {
		t.Fatalf("floored delay = %v, want 3ms", d)
	}

	// Off by default: only calls that opt in.
	tr3 := newTestRouter(t, Config{Clock: newTimerClock(), Hedge: &HedgeConfig{}})
	tr3.run(t, 300, LinearizableRead, flat(time.Millisecond))
	tr3.probeRound()
	if _, ok := tr3.hedgeDelay(ctx, LinearizableRead); ok {
		t.Fatal("hedged without Enabled or an opt-in")
	}
	if _, ok := tr3.hedgeDelay(WithHedging(ctx, true), LinearizableRead); !ok {
		t.Fatal("opt-in not hedged")
	}
}

func TestHedgeFirstAnswerWins(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	before := tr.Stats()
	picked := make(chan string, 2)
	// Every member but the first pick answers; the first stalls.
	fast := map[string]bool{"m0": true, "m1": true, "m2": true}
	attempt := readAt(tr, fast, picked)
	res := make(chan string, 1)
	go func() {
		v, err := Hedge(context.Background(), tr.Router, LinearizableRead, func(ctx context.Context, hedge bool) (string, error) {
			if !hedge {
				// The first attempt: make its member the stalled one.
				p, err := tr.Pick(ctx, LinearizableRead)
				if err != nil {
					return "", err
				}
				picked <- p.Member.ID
				<-ctx.Done()
				p.Done(CallerGaveUp)
				return "", ctx.Err()
			}
			return attempt(ctx, hedge)
		}, outcome)
		if err != nil {
			v = "error: " + err.Error()
		}
		res <- v
	}()
	first := <-picked
	ft := clock.next(t)
	if ft.delay != 2*time.Millisecond {
		t.Errorf("hedge delay %v, want the pool's P95 (2ms)", ft.delay)
	}
	<-clock.fire(ft)
	second := <-picked
	got := <-res
	if second == first || got != second {
		t.Fatalf("first attempt on %s, hedge on %s, answer %q: want the hedge's answer from another member", first, second, got)
	}
	if h := tr.Hedges(); h.Sent != 1 || h.Won != 1 {
		t.Fatalf("hedges = %+v, want 1 sent, 1 won", h)
	}
	want := `
# HELP oproute_hedged_reads_total Hedged reads: second copies sent, those that answered first, and those due but refused by the budget.
# TYPE oproute_hedged_reads_total counter
oproute_hedged_reads_total{result="sent"} 1
oproute_hedged_reads_total{result="throttled"} 0
oproute_hedged_reads_total{result="won"} 1
`
	if err := promtestutil.CollectAndCompare(tr.Collector(), strings.NewReader(want), "oproute_hedged_reads_total"); err != nil {
		t.Error(err)
	}
	after := tr.Stats()
	for i, m := range after.Members {
		if m.Member.ID != first {
			continue
		}
		if m.GaveUp[LinearizableRead]-before.Members[i].GaveUp[LinearizableRead] != 1 || m.Errors != before.Members[i].Errors {
			t.Fatalf("the cancelled first attempt counted as %+v, want one CallerGaveUp and no fault", m)
		}
	}
}

func TestHedgeNotSentWhenTheFirstAnswers(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	v, err := Hedge(context.Background(), tr.Router, LinearizableRead,
		readAt(tr, map[string]bool{"m0": true, "m1": true, "m2": true}, nil), outcome)
	if err != nil || v == "" {
		t.Fatalf("read = %q, %v", v, err)
	}
	if ft := clock.pending[len(clock.pending)-1]; !ft.stopped {
		t.Fatal("the hedge timer is still armed after the answer")
	}
	if h := tr.Hedges(); h.Sent != 0 {
		t.Fatalf("hedges = %+v", h)
	}
}

// hedgedRead runs one hedged read in the background. Its first attempt
// picks, says which member on picked, then waits for first (an outcome to
// report: OK answers, anything else fails) or its context; its hedge picks,
// says so on picked too, then waits the same way for second. It returns
// the read's answer: the member that answered.
func hedgedRead(tr testRouter, picked chan<- string, first, second <-chan Outcome) <-chan string {
	res := make(chan string, 1)
	go func() {
		v, err := Hedge(context.Background(), tr.Router, LinearizableRead, func(ctx context.Context, hedge bool) (string, error) {
			p, err := tr.Pick(ctx, LinearizableRead)
			if err != nil {
				return "", err
			}
			picked <- p.Member.ID
			wait := first
			if hedge {
				wait = second
			}
			select {
			case o := <-wait:
				p.Done(o)
				if o != OK {
					return "", errors.New(o.String())
				}
				return p.Member.ID, nil
			case <-ctx.Done():
				p.Done(CallerGaveUp)
				return "", ctx.Err()
			}
		}, outcome)
		if err != nil {
			v = "error: " + err.Error()
		}
		res <- v
	}()
	return res
}

func TestHedgeFailedFirstWaitsForTheHedge(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	picked := make(chan string, 2)
	first, second := make(chan Outcome, 1), make(chan Outcome, 1)
	res := hedgedRead(tr, picked, first, second)
	<-picked
	clock.fire(clock.next(t)) // its hedge waits for us: no waiting for it
	hedgeAt := <-picked
	first <- MemberFault // fails while the hedge is under way
	second <- OK
	if got := <-res; got != hedgeAt {
		t.Fatalf("a failed first attempt with a hedge in flight returned %q, want the hedge's answer from %s", got, hedgeAt)
	}
}

func TestHedgeCancelledWhenTheFirstAnswers(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	picked := make(chan string, 2)
	first := make(chan Outcome, 1)
	res := hedgedRead(tr, picked, first, nil) // the hedge never answers
	firstAt := <-picked
	clock.fire(clock.next(t)) // its hedge waits for us: no waiting for it
	hedgeAt := <-picked
	before := tr.Stats()
	first <- OK
	if got := <-res; got != firstAt {
		t.Fatalf("answer %q, want the first attempt's (%s)", got, firstAt)
	}
	// The hedge's cancellation is the caller giving up, not a fault.
	testutil.Poll(t, 5*time.Second, "the hedge reported", func() bool {
		for i, m := range tr.Stats().Members {
			if m.Member.ID == hedgeAt && m.GaveUp[LinearizableRead] > before.Members[i].GaveUp[LinearizableRead] {
				return true
			}
		}
		return false
	})
	for _, m := range tr.Stats().Members {
		if m.Errors[LinearizableRead] != 0 {
			t.Fatalf("%s counted a fault: %+v", m.Member.ID, m)
		}
	}
	if h := tr.Hedges(); h.Sent != 1 || h.Won != 0 {
		t.Fatalf("hedges = %+v, want 1 sent, 0 won", h)
	}
}

func TestHedgeWinsKeepTheDelay(t *testing.T) {
	// One read in ten stalls at its first member and is saved by its
	// hedge; the others answer in 1 ms. The stalled reads never answer, so
	// unless their wait counts, the pool's P95 falls to the fast reads'
	// and hedges go out on ordinary reads.
	clock := newTimerClock()
	tr := newTestRouter(t, Config{Clock: clock, Hedge: &HedgeConfig{Enabled: true, Budget: 1, MaxTokens: 1000, Window: 200}})
	n := 0
	tr.run(t, 300, LinearizableRead, func(Member) time.Duration {
		n++
		if n%10 == 0 {
			return 10 * time.Millisecond
		}
		return time.Millisecond
	})
	tr.probeRound()
	if d, _ := tr.hedgeDelay(context.Background(), LinearizableRead); d != 10*time.Millisecond {
		t.Fatalf("delay = %v, want the P95 (10ms)", d)
	}
	for i := range 400 {
		picked := make(chan string, 2)
		first, second := make(chan Outcome, 1), make(chan Outcome, 1)
		second <- OK
		res := hedgedRead(tr, picked, first, second)
		<-picked
		ft := clock.next(t)
		if i%10 == 0 {
			tr.clock.Advance(ft.delay)
			<-clock.fire(ft)
			<-picked
		} else {
			tr.clock.Advance(time.Millisecond)
			first <- OK
		}
		if got := <-res; strings.HasPrefix(got, "error") {
			t.Fatal(got)
		}
		if i%50 == 49 {
			tr.probeRound()
		}
	}
	if d, _ := tr.hedgeDelay(context.Background(), LinearizableRead); d != 10*time.Millisecond {
		t.Fatalf("delay after 40 hedges saved stalled reads = %v, want the pool's 10ms", d)
	}
}

func TestHedgeBudget(t *testing.T) {
	h := newHedger(HedgeConfig{Budget: 0.05, MaxTokens: 10, Window: 10, MinReads: 1})
	sent := 0
	for range 1000 {
		h.earn(50)
		if h.spend() {
			sent++
		}
	}
	// 1000 reads earn 50 tokens; half the bucket (5) may go on top.
	if sent < 45 || sent > 55 {
		t.Fatalf("%d hedges for 1000 reads, want ~5%%", sent)
	}
	// Failures drain the bucket: a failing pool is sent no hedges.
	for range 20 {
		h.earn(-1000)
	}
	for range 50 {
		h.earn(50)
		if h.spend() {
			t.Fatal("hedged while reads were failing")
		}
	}
}

// A hedge the budget refuses is counted: what an operator alerts on when a
// pool stays slow longer than the budget covers.
func TestHedgeRefusedByTheBudgetIsCounted(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	tr.hedge.earn(-1 << 40) // the bucket drained
	picked := make(chan string, 2)
	first := make(chan Outcome, 1)
	res := hedgedRead(tr, picked, first, nil)
	<-picked
	<-clock.fire(clock.next(t))
	first <- OK
	<-res
	if h := tr.Hedges(); h.Sent != 0 || h.Throttled != 1 {
		t.Fatalf("hedges = %+v, want none sent and one throttled", h)
	}
}

func TestHedgeNeedsAnotherPoolMember(t *testing.T) {
	tr, clock := hedgingRouter(t, HedgeConfig{Enabled: true})
	// m1 and m2 unreachable: nothing to hedge to.
	tr.cluster.set("m0", 1, "m1", "m2")
	tr.probeRound()
	tr.probeRound()
	picked := make(chan string, 2)
	first := make(chan Outcome, 1)
	res := hedgedRead(tr, picked, first, nil)
	if at := <-picked; at != "m0" {
		t.Fatalf("read went to %s", at)
	}
	<-clock.fire(clock.next(t))
	first <- OK
	if got := <-res; got != "m0" {
		t.Fatal(got)
	}
	if h := tr.Hedges(); h.Sent != 0 {
		t.Fatalf("hedges = %+v with one pool member", h)
	}
}

func TestHedgeAndLoadAwareConfig(t *testing.T) {
	for _, c := range []Config{
		{Policy: RoundRobin, Hedge: &HedgeConfig{}},
		{Hedge: &HedgeConfig{Quantile: 1}},
		{Hedge: &HedgeConfig{Budget: -0.1}},
		{Hedge: &HedgeConfig{Window: 10, MinReads: 20}},
		{Policy: Boltzmann, LoadAware: true},
	} {
		c.Members = members(3)
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", c, err)
		}
	}
}

func TestVariantPolicyNames(t *testing.T) {
	for _, c := range []struct {
		policy            string
		hedged, loadAware bool
	}{{HybridHedge, true, false}, {HybridP2C, false, true}, {Hybrid, false, false}} {
		r, err := New(Config{Members: members(3), Policy: c.policy, ProbeInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		d, _ := r.hedgeDelay(context.Background(), LinearizableRead)
		if r.Policy() != Hybrid || r.Hedging() != c.hedged || r.cfg.LoadAware != c.loadAware || d != 0 {
			t.Errorf("%s: policy %s, hedging %v, load-aware %v", c.policy, r.Policy(), r.Hedging(), r.cfg.LoadAware)
		}
		if c.hedged && !r.hedge.cfg.Enabled {
			t.Errorf("%s: hedging not on for every read", c.policy)
		}
		r.Close()
	}
}

func TestLoadAwareChoice(t *testing.T) {
	tr := newTestRouter(t, Config{LoadAware: true})
	// m2 reads 3 ms slower than the others: not far enough out to eject.
	slow := slowMember("m2", 5*time.Millisecond, 2*time.Millisecond)
	tr.run(t, 300, LinearizableRead, slow)
	tr.probeRound()
	tr.expectNoneEjected(t, "3 ms slower")
	c := tr.run(t, 3000, LinearizableRead, slow)
	if share := float64(c["m2"]) / 3000; share > 0.02 || share == 0 {
		t.Fatalf("idle pool: slower m2 got %.2f%% of reads, want its exploration share", 100*share)
	}
	if c["m0"] < 1200 || c["m1"] < 1200 {
		t.Fatalf("equal members not shared evenly: %v", c)
	}
	// Reads in flight count: with four on each of m0 and m1, m2 is cheaper.
	var held []Pick
	for len(held) < 8 {
		p, _ := tr.Pick(context.Background(), LinearizableRead)
		if p.Member.ID == "m2" {
			p.Abandon()
			continue
		}
		held = append(held, p)
	}
	got := map[string]int{}
	for range 100 {
		p, _ := tr.Pick(context.Background(), LinearizableRead)
		got[p.Member.ID]++
		p.Abandon()
	}
	for _, p := range held {
		p.Done(OK)
	}
	if got["m2"] < 60 {
		t.Fatalf("with m0 and m1 busy, m2 got %d of 100 reads", got["m2"])
	}
	// Writes still go to the leader.
	if w := tr.run(t, 50, Write, slow); w["m0"] != 50 {
		t.Fatalf("writes = %v", w)
	}
}

func TestLoadAwareKeepsEjection(t *testing.T) {
	tr := newTestRouter(t, Config{LoadAware: true})
	slow := slowMember("m2", 17*time.Millisecond, time.Millisecond)
	// P2C avoids m2 from its first slow answer, so its samples come from
	// its exploration share: it takes longer to be judged than under round
	// robin, during which it gets few reads either way.
	c := tr.run(t, 20000, LinearizableRead, slow)
	if share := float64(c["m2"]) / 20000; share > 0.01 {
		t.Fatalf("slow m2 got %.2f%% of reads before its ejection", 100*share)
	}
	tr.probeRound()
	if st := tr.Stats(); !st.Members[2].Ejected || st.Members[0].Ejected || st.Members[1].Ejected {
		t.Fatalf("want only m2 ejected: %+v", st.Members)
	}
	c = tr.run(t, 20000, LinearizableRead, slow)
	if share := float64(c["m2"]) / 20000; share > 0.01 || share == 0 {
		t.Fatalf("ejected m2 got %.2f%% of reads, want its probe share (0.5%%)", 100*share)
	}
	for rounds := 0; tr.Stats().Members[2].Ejected; rounds++ {
		if rounds == 10 {
			t.Fatalf("m2 not readmitted after recovering: %+v", tr.Stats().Members[2])
		}
		tr.run(t, 1000, LinearizableRead, flat(time.Millisecond))
		tr.probeRound()
	}
}
