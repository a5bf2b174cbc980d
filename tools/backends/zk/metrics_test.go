package zk_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// recorder is a slog handler that keeps the records it is given.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// count returns how many records have message msg and every attribute in
// attrs ("key=value").
func (r *recorder) count(msg string, attrs ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if rec.Message != msg {
			continue
		}
		var got []string
		rec.Attrs(func(a slog.Attr) bool { got = append(got, a.String()); return true })
		all := true
		for _, want := range attrs {
			found := false
			for _, g := range got {
				found = found || g == want
			}
			all = all && found
		}
		if all {
			n++
		}
	}
	return n
}

// The Conn's metrics agree with the servers' own counts, and a server that
// stops answering shows in the metrics and in one event line each.
func TestMetricsAndEventsOnAnEnsemble(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := &recorder{}
	conn, _ := connect(t, c, ozk.WithEventLogger(slog.New(rec)))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(conn.Collector()); err != nil {
		t.Fatal(err)
	}
	if problems, err := promtestutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if _, err := conn.CreateContext(ctx, "/m", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	eps := c.Endpoints()
	_, reads0 := requests(t, c)
	start := time.Now()
	const n = 300
	for range n {
		if _, _, err := conn.GetContext(ctx, "/m"); err != nil {
			t.Fatal(err)
		}
	}
	_, reads1 := requests(t, c)
	// mntr counts the sessions' pings as reads too, one a session every
	// third of its timeout, whatever the traffic: a server may have served
	// more than was routed to it, by a ping a second at most.
	pings := 1 + time.Since(start).Seconds()
	for i, ep := range eps {
		routed := testutil.Metric(t, reg, "oproute_operations_total", "member", ep, "class", "linearizable_read", "outcome", "ok")
		// mntr counts a linearizable read's sync as a read too.
		served := float64(reads1[i]-reads0[i]) / 2
		t.Logf("z%d: %v reads in the metrics, %v (sync+read pairs) served by its mntr", i, routed, served)
		if served < routed-0.5 || served > routed+pings {
			t.Errorf("z%d: metrics say %v reads, the server served %v (sync+read pairs), want between those and %.1f more for pings", i, routed, served, pings)
		}
	}

	frozen := 2
	// Counted from here: a probe of the server that timed out on a loaded
	// machine before the freeze adds a pair of its own.
	unreachable0 := rec.count(router.EventUnreachable, "member="+eps[frozen])
	reachable0 := rec.count(router.EventReachable, "member="+eps[frozen])
	if err := c.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	defer c.Resume(frozen)
	testutil.Poll(t, 10*time.Second, "the frozen server down in the metrics", func() bool {
		return testutil.Metric(t, reg, "oproute_member_up", "member", eps[frozen]) == 0
	})
	testutil.Poll(t, 10*time.Second, "its session moved", func() bool {
		return rec.count(ozk.EventSessionMoved, "from="+eps[frozen]) > 0
	})
	if k := rec.count(router.EventUnreachable, "member="+eps[frozen]) - unreachable0; k != 1 {
		t.Errorf("%d %s events for the frozen server, want 1", k, router.EventUnreachable)
	}
	if moves := testutil.Metric(t, reg, "oproute_zk_session_moves_total"); moves < 1 {
		t.Errorf("session moves = %v", moves)
	}
	if err := c.Resume(frozen); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "the server back", func() bool {
		return rec.count(router.EventReachable, "member="+eps[frozen])-reachable0 == 1
	})
}
