package zk_test

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
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
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := &recorder{}
	conn, _ := connect(t, c, ozk.WithEventLogger(slog.New(rec)))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(conn.Collector()); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if _, err := conn.CreateContext(ctx, "/m", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	eps := c.Endpoints()
	_, reads0 := requests(t, c)
	const n = 300
	for range n {
		if _, _, err := conn.GetContext(ctx, "/m"); err != nil {
			t.Fatal(err)
		}
	}
	_, reads1 := requests(t, c)
	for i, ep := range eps {
		routed := testutil.ToFloat64(metric(t, reg, "oproute_operations_total", "member", ep, "class", "linearizable_read", "outcome", "ok"))
		// mntr counts a linearizable read's sync as a read too.
		served := float64(reads1[i]-reads0[i]) / 2
		t.Logf("z%d: %v reads in the metrics, %v (sync+read pairs) served by its mntr", i, routed, served)
		if math.Abs(routed-served) > 1 {
			t.Errorf("z%d: metrics say %v reads, the server served %v", i, routed, served)
		}
	}

	frozen := 2
	if err := c.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	defer c.Resume(frozen)
	conformance.Poll(t, 10*time.Second, "the frozen server down in the metrics", func() bool {
		return testutil.ToFloat64(metric(t, reg, "oproute_member_up", "member", eps[frozen])) == 0
	})
	conformance.Poll(t, 10*time.Second, "its session moved", func() bool {
		return rec.count(ozk.EventSessionMoved, "from="+eps[frozen]) > 0
	})
	if k := rec.count(router.EventUnreachable, "member="+eps[frozen]); k != 1 {
		t.Errorf("%d %s events for the frozen server, want 1", k, router.EventUnreachable)
	}
	if moves := testutil.ToFloat64(metric(t, reg, "oproute_zk_session_moves_total")); moves < 1 {
		t.Errorf("session moves = %v", moves)
	}
	if err := c.Resume(frozen); err != nil {
		t.Fatal(err)
	}
	conformance.Poll(t, 10*time.Second, "the server back", func() bool {
		return rec.count(router.EventReachable, "member="+eps[frozen]) == 1
	})
}

// metric finds the one series of name with the given label values.
func metric(t *testing.T, g prometheus.Gatherer, name string, labels ...string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				match = match && got[labels[i]] == labels[i+1]
			}
			if match {
				v := 0.0
				switch {
				case m.GetCounter() != nil:
					v = m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					v = m.GetGauge().GetValue()
				}
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(v)
				return g
			}
		}
	}
	t.Fatalf("%s%v not exported", name, labels)
	return nil
}
