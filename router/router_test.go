package router

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oproute/oproute/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigErrors(t *testing.T) {
	ms := members(3)
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no members", Config{}, ErrNoMembers},
		{"duplicate id", Config{Members: []Member{ms[0], ms[0]}}, ErrDuplicateMember},
		{"duplicate addr", Config{Members: []Member{ms[0], {ID: "x", Addr: ms[0].Addr}}}, ErrDuplicateMember},
		{"empty id", Config{Members: []Member{{Addr: "a"}}}, ErrInvalidConfig},
		{"unknown policy", Config{Members: ms, Policy: "random"}, ErrUnknownPolicy},
		{"alpha", Config{Members: ms, Alpha: 2}, ErrInvalidConfig},
		{"eject ratio", Config{Members: ms, EjectRatio: 0.5}, ErrInvalidConfig},
		{"readmit above eject", Config{Members: ms, ReadmitRatio: 3}, ErrInvalidConfig},
		{"probe share", Config{Members: ms, ProbeShare: 0.7}, ErrInvalidConfig},
		{"negative interval", Config{Members: ms, ProbeInterval: -time.Second}, ErrInvalidConfig},
		{"negative temperature", Config{Members: ms, Temperature: -1}, ErrInvalidConfig},
		{"sticky member", Config{Members: ms, StickyMember: "nope"}, ErrUnknownMember},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.cfg)
			if !errors.Is(err, tt.want) {
				if r != nil {
					r.Close()
				}
				t.Fatalf("New: err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestClosed(t *testing.T) {
	tr := newTestRouter(t, Config{})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := tr.Pick(context.Background(), Write); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pick after Close: %v", err)
	}
}

// Hybrid's variants are hybrid with options, and Stats says which.
func TestStatsReportHybridVariants(t *testing.T) {
	for _, tc := range []struct {
		policy    string
		loadAware bool
		hedge     bool
	}{{Hybrid, false, false}, {HybridP2C, true, false}, {HybridHedge, false, true}} {
		st := newTestRouter(t, Config{Policy: tc.policy}).Stats()
		if st.Policy != Hybrid || st.LoadAware != tc.loadAware || (st.Hedge != nil) != tc.hedge {
			t.Errorf("%s: Stats reports policy %q, load-aware %v, hedge %+v", tc.policy, st.Policy, st.LoadAware, st.Hedge)
		}
		if tc.hedge && (!st.Hedge.Enabled || st.Hedge.Quantile == 0) {
			t.Errorf("%s: hedge %+v, want enabled with its defaults", tc.policy, *st.Hedge)
		}
	}
}

// Under Config.Manual the router probes only when the caller runs a
// Round, on the caller's clock: a simulator's virtual time.
func TestManualRounds(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	cluster := &fakeCluster{leader: "m1", term: 1}
	r, err := New(Config{Members: members(3), Prober: cluster, Clock: clock, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Backend().Home(); ok {
		t.Fatal("leader known before the first Round")
	}
	if err := r.Round(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l, ok := r.Backend().Home(); !ok || l != 1 {
		t.Fatalf("leader m%d (%v) after the first Round, want m1", l, ok)
	}
	p, err := r.Pick(t.Context(), Write)
	if err != nil || p.Index != 1 {
		t.Fatalf("write to m%d (%v), want the leader m1", p.Index, err)
	}
	p.Done(OK)
	cluster.set("m2", 2)
	r.Refresh() // forces the next Round's probes
	if err := r.Round(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l, _ := r.Backend().Home(); l != 2 {
		t.Fatalf("leader m%d after the move and a forced Round, want m2", l)
	}
	r.Close()
	if err := r.Round(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Round after Close: %v, want ErrClosed", err)
	}
	// Close waits for a Round under way, and no probe runs after it.
	release := make(chan struct{})
	var probes, after atomic.Int32
	var closed atomic.Bool
	blocking := ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		probes.Add(1)
		if closed.Load() {
			after.Add(1)
		}
		<-release
		return cluster.Probe(ctx, m)
	})
	r2, err := New(Config{Members: members(3), Prober: blocking, Clock: clock, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	roundDone := make(chan error, 1)
	go func() { roundDone <- r2.Round(context.Background()) }()
	testutil.Poll(t, 5*time.Second, "the round's probes under way", func() bool { return probes.Load() == 3 })
	closeDone := make(chan struct{})
	go func() { r2.Close(); closed.Store(true); close(closeDone) }()
	select {
	case <-closeDone:
		t.Fatal("Close returned while a Round was under way")
	case <-time.After(50 * time.Millisecond): // a window for a wrong early return, not synchronisation
	}
	close(release)
	<-closeDone
	if err := <-roundDone; err != nil {
		t.Fatalf("the Round under way at Close: %v", err)
	}
	if after.Load() > 0 {
		t.Fatalf("%d probes after Close", after.Load())
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	r3, err := New(Config{Members: members(3), Prober: cluster, Clock: clock, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	if err := r3.Round(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Round with a cancelled context: %v, want context.Canceled", err)
	}
	bg := newTestRouter(t, Config{})
	if err := bg.Round(t.Context()); !errors.Is(err, ErrNotManual) {
		t.Fatalf("Round on a router that probes in the background: %v, want ErrNotManual", err)
	}
}

// TestProbeErrorsSaySo: when no member answers its probes, WaitProbed's
// ErrUnreachable wraps why (a refused credential, say), and the
// unreachable events carry it.
func TestProbeErrorsSaySo(t *testing.T) {
	errDenied := errors.New("permission denied")
	var events, withoutError atomic.Int32
	r, err := New(Config{Members: members(3), ProbeInterval: 5 * time.Millisecond,
		Prober: ProberFunc(func(context.Context, Member) (ProbeResult, error) { return ProbeResult{}, errDenied }),
		OnEvent: func(e Event) {
			if e.Kind != EventUnreachable {
				return
			}
			events.Add(1)
			if !slices.ContainsFunc(e.Attrs, func(a slog.Attr) bool { return a.Key == "error" && a.Value.String() == errDenied.Error() }) {
				withoutError.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	testutil.Poll(t, 10*time.Second, "a failed probe applied", func() bool { _, err := r.lastProbeErr(); return err != nil })
	err = r.WaitProbed(100 * time.Millisecond)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, errDenied) {
		t.Errorf("WaitProbed: %v, want ErrUnreachable wrapping the probes' error", err)
	}
	testutil.Poll(t, 10*time.Second, "three unreachable events", func() bool { return events.Load() >= 3 })
	if n := withoutError.Load(); n > 0 {
		t.Errorf("%d unreachable events without the probes' error", n)
	}
}
