package router

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oproute/oproute/internal/testutil"
)

type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) kinds(member string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if e.Member == member {
			out = append(out, e.Kind)
		}
	}
	return out
}

// A degraded member's ejection and readmission, seen through the metrics
// and the event log: one event per change, with the evidence.
func TestMetricsAndEvents(t *testing.T) {
	log := &eventLog{}
	tr := newTestRouter(t, Config{OnEvent: log.add})
	c := tr.Collector()
	if problems, err := promtestutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("metric names and help: %v %v", problems, err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	slow := slowMember("m2", 17*time.Millisecond, time.Millisecond)
	tr.run(t, 300, LinearizableRead, slow)
	tr.run(t, 50, Write, flat(time.Millisecond))
	tr.probeRound()
	if k := log.kinds("m2"); len(k) != 1 || k[0] != EventLeftPool {
		t.Fatalf("m2's events after its ejection: %v, want one %s", k, EventLeftPool)
	}
	var left Event
	for _, e := range log.events {
		if e.Kind == EventLeftPool {
			left = e
		}
	}
	if !strings.Contains(attrString(left), "reason=latency") || !strings.Contains(attrString(left), "read_ewma=") {
		t.Errorf("ejection event lacks its evidence: %s", attrString(left))
	}
	expect := func(name string, want float64, labels ...string) {
		t.Helper()
		if v := testutil.Metric(t, reg, name, labels...); v != want {
			t.Errorf("%s%v = %v, want %v", name, labels, v, want)
		}
	}
	expect("oproute_member_ejected", 1, "member", "m2")
	expect("oproute_member_ejected", 0, "member", "m0")
	expect("oproute_ejections_total", 1, "member", "m2")
	expect("oproute_member_leader", 1, "member", "m0")
	expect("oproute_operations_total", 50, "member", "m0", "class", "write", "outcome", "ok")
	expect("oproute_operations_total", 100, "member", "m1", "class", "linearizable_read", "outcome", "ok")
	expect("oproute_read_latency_seconds", 100, "member", "m2")
	expect("oproute_write_latency_seconds", 50, "member", "m0")
	expect("oproute_build_info", 1, "go_version", runtime.Version())

	for rounds := 0; tr.Stats().Members[2].Ejected; rounds++ {
		if rounds == 10 {
			t.Fatal("m2 not readmitted")
		}
		tr.run(t, 1000, LinearizableRead, flat(time.Millisecond))
		tr.probeRound()
	}
	if k := log.kinds("m2"); len(k) != 2 || k[1] != EventBackInPool {
		t.Fatalf("m2's events: %v, want left then back", k)
	}
	expect("oproute_readmissions_total", 1, "member", "m2")
	expect("oproute_member_ejected", 0, "member", "m2")

	// Leader changes and lost members are events too.
	tr.cluster.set("m1", 2, "m0")
	tr.probeRound()
	tr.probeRound()
	if k := log.kinds("m1"); len(k) == 0 || k[len(k)-1] != EventLeaderChanged {
		t.Errorf("m1's events: %v, want %s", k, EventLeaderChanged)
	}
	if k := log.kinds("m0"); len(k) == 0 || k[len(k)-1] != EventUnreachable {
		t.Errorf("m0's events: %v, want %s", k, EventUnreachable)
	}
	expect("oproute_leader_changes_total", 1)
	expect("oproute_member_up", 0, "member", "m0")
	expect("oproute_probe_failures_total", 2, "member", "m0")
}

func attrString(e Event) string {
	var b strings.Builder
	for _, a := range e.Attrs {
		b.WriteString(a.String() + " ")
	}
	return b.String()
}

// A member never reached is announced only after startupProbeFailures
// failed probes (at start-up connections are still being dialled), and
// then once.
func TestUnreachedMemberAnnouncedOnce(t *testing.T) {
	log := &eventLog{}
	tr := newTestRouter(t, Config{OnEvent: log.add})
	tr.cluster.set("m0", 1, "m2")
	// The first round (in newTestRouter) saw m2 up; start over as if it never answered.
	tr.mu.Lock()
	tr.roster().health[2].reached = false
	tr.mu.Unlock()
	for range startupProbeFailures - 1 {
		tr.probeRound()
	}
	if k := log.kinds("m2"); len(k) != 0 {
		t.Fatalf("events while m2 may still be connecting: %v", k)
	}
	for range 5 {
		tr.probeRound()
	}
	if k := log.kinds("m2"); len(k) != 1 || k[0] != EventUnreachable {
		t.Fatalf("m2's events: %v, want one %s", k, EventUnreachable)
	}
}

// A failed write pinned to the leader clears it until the next round; the
// same leader found again is no leader change, and the metrics' ok counts
// only answered operations.
func TestFailedWriteIsNoLeaderEvent(t *testing.T) {
	log := &eventLog{}
	tr := newTestRouter(t, Config{OnEvent: log.add})
	tr.probeRound()
	if k := log.kinds("m0"); len(k) != 1 || k[0] != EventLeaderChanged {
		t.Fatalf("m0's events: %v, want it announced as leader", k)
	}
	p, _ := tr.Pick(context.Background(), Write)
	p.Done(MemberFault)
	tr.probeRound()
	tr.probeRound()
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, e := range log.events[1:] {
		if e.Kind == EventLeaderChanged || e.Kind == EventLeaderLost {
			t.Errorf("leader event after a failed write and the same leader found again: %+v", e)
		}
	}
	if st := tr.Stats().Members[0]; st.OK[Write] != 0 || st.Errors[Write] != 1 {
		t.Errorf("ok %d, errors %d for one failed write", st.OK[Write], st.Errors[Write])
	}
}

// buildInfo reports the SDK's module version from the binary's build
// information: in the SDK's own test binary the main module's.
func TestBuildInfoNamesTheSDK(t *testing.T) {
	version, goVersion := buildInfo()
	if version == "" || version == "unknown" {
		t.Errorf("version %q: want the main module's (this test binary's module is the SDK)", version)
	}
	if goVersion != runtime.Version() {
		t.Errorf("go_version %q, want %q", goVersion, runtime.Version())
	}
}
