package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/testbed"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{2, 4, 4, 4, 5, 5, 7, 9})
	if s.Mean != 5 || math.Abs(s.SD-2.138) > 0.001 || s.N != 8 {
		t.Fatalf("Summarize = %+v, want mean 5, sample sd 2.138", s)
	}
	if s := Summarize([]float64{3, math.NaN()}); s.N != 1 || s.Mean != 3 || s.SD != 0 {
		t.Fatalf("NaN not skipped: %+v", s)
	}
	if s := Summarize(nil); !math.IsNaN(s.Mean) || s.Format(2) != "–" {
		t.Fatalf("empty: %+v %q", s, s.Format(2))
	}
	if got := (Summary{Mean: 1.234, SD: 0.05, N: 3}).Format(2); got != "1.23 ± 0.05" {
		t.Fatalf("Format = %q", got)
	}
	if got := (Summary{Mean: 1.234, N: 1}).Format(1); got != "1.2" {
		t.Fatalf("Format one trial = %q", got)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {90, 90 * time.Millisecond}, {99, 99 * time.Millisecond}, {99.9, 100 * time.Millisecond}, {100, 100 * time.Millisecond}, {0.5, time.Millisecond}} {
		if got := percentile(ds, tc.p); got != tc.want {
			t.Errorf("P%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("empty percentile")
	}
	if got := percentile([]time.Duration{7}, 99.9); got != 7 {
		t.Errorf("single sample P99.9 = %v", got)
	}
}

func TestRatioIsPairedByTrial(t *testing.T) {
	c := Comparison{
		Scenario: "healthy", Variant: "80/20", Baseline: "round_robin",
		Policies: []string{"round_robin", "hybrid"},
		Metrics:  []Metric{WriteP50, MemberReadShare(1)},
		Trials: map[string][]Result{
			// The machine got slower in trial 2; paired ratios see 0.5 both times.
			"round_robin": {{WriteP50ms: 4, ReadsByMember: []uint64{1, 1}}, {WriteP50ms: 8, ReadsByMember: []uint64{1, 1}}},
			"hybrid":      {{WriteP50ms: 2, ReadsByMember: []uint64{3, 1}}, {WriteP50ms: 4, ReadsByMember: []uint64{3, 1}}},
		},
	}
	r := c.Ratio("hybrid", WriteP50)
	if r.Mean != 0.5 || r.SD != 0 {
		t.Fatalf("paired ratio = %+v, want 0.5 ± 0", r)
	}
	md := c.Markdown()
	for _, want := range []string{
		"#### healthy · 80/20",
		"| Metric | round_robin | hybrid | hybrid / round_robin |",
		"| Write P50 (ms) | 6.00 ± 2.83 | 3.00 ± 1.41 | 0.500 ± 0.000 (-50.0%) |",
		"| Reads to m1 (%) | 50.00 ± 0.00 | 25.00 ± 0.00 | -25.0 ± 0.0 pp |",
		"2 trial(s) per policy, interleaved.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestServerCountsPreferred(t *testing.T) {
	r := Result{ReadsByMember: []uint64{1, 1}, ServerReadsByMember: []uint64{0, 4}}
	if got := MemberReadShare(1).Get(r); got != 100 {
		t.Fatalf("share = %v, want the server-side 100", got)
	}
}

func TestWorkloadValidate(t *testing.T) {
	if err := DefaultWorkload().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Workload){
		func(w *Workload) { w.ReadRatio = 1.5 },
		func(w *Workload) { w.Keys = 0 },
		func(w *Workload) { w.RangeSize = 2000 },
		func(w *Workload) { w.Workers = 0 },
		func(w *Workload) { w.Duration = 0 },
		func(w *Workload) { w.Warmup = -1 },
		func(w *Workload) { w.ConnsPerMember = 0 },
		func(w *Workload) { w.ValueSize = -1 },
	}
	for i, mut := range bad {
		w := DefaultWorkload()
		mut(&w)
		if err := w.Validate(); err == nil {
			t.Errorf("case %d: %+v accepted", i, w)
		}
	}
}

func TestLayoutOf(t *testing.T) {
	if l := layoutOf(nil); l != (layout{leader: 0, sameZoneFollower: 1}) {
		t.Errorf("default topology: %+v, want leader 0, same-zone follower 1", l)
	}
	three := testbed.ThreeZoneTopology()
	if l := layoutOf(&three); l != (layout{leader: 1, sameZoneFollower: 0}) {
		t.Errorf("three zones: %+v, want leader 1, same-zone follower 0", l)
	}
	if d := scenarioDefs(layoutOf(&three))[ScenarioDegraded]; !strings.Contains(d.desc, "m0") {
		t.Errorf("degraded on three zones slows %q, want m0", d.desc)
	}
}

func TestEjectionsShownPerTrial(t *testing.T) {
	c := &Comparison{Scenario: "s", Baseline: Stock, Policies: []string{Stock, "hybrid"}, Trials: map[string][]Result{
		Stock:    {{}, {}},
		"hybrid": {{EjectionsByMember: []uint64{0, 0, 2}}, {EjectionsByMember: []uint64{0, 1, 0}}},
	}}
	if md := c.Markdown(); !strings.Contains(md, "hybrid 0/0/2 · 0/1/0.") || strings.Contains(md, "stock 0") {
		t.Fatalf("ejections line missing or wrong:\n%s", md)
	}
}

// TestCrossZonePerOp: cross-zone bytes are divided by the operations done,
// client and peer apart and together; unknown traffic (an external
// cluster) reads as –, not as zero.
func TestCrossZonePerOp(t *testing.T) {
	known := Result{Policy: Stock, Reads: 80, Writes: 20,
		Traffic: &Traffic{ClientTotal: 5000, ClientCrossZone: 1000, PeerTotal: 900, PeerCrossZone: 500}}
	for _, tc := range []struct {
		m    Metric
		want float64
	}{{CrossZoneBytesPerOp, 15}, {ClientCrossZoneBytesPerOp, 10}, {PeerCrossZoneBytesPerOp, 5}} {
		if got := tc.m.Get(known); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.m.Name, got, tc.want)
		}
	}
	unknown := Result{Policy: "hybrid", Reads: 80, Writes: 20}
	if got := CrossZoneBytesPerOp.Get(unknown); !math.IsNaN(got) {
		t.Errorf("unknown traffic: %v, want NaN", got)
	}
	if got := CrossZoneBytesPerOp.Get(Result{Traffic: &Traffic{}}); !math.IsNaN(got) {
		t.Errorf("no operations: %v, want NaN", got)
	}
	c := &Comparison{Scenario: "s", Baseline: Stock, Policies: []string{Stock, "hybrid"}, Metrics: []Metric{CrossZoneBytesPerOp},
		Trials: map[string][]Result{Stock: {known}, "hybrid": {unknown}}}
	if md := c.Markdown(); !strings.Contains(md, "| Cross-zone (B/op) | 15 | – | – |") {
		t.Errorf("cross-zone row:\n%s", md)
	}
}

func TestPoolJudgementPerMemberHour(t *testing.T) {
	r := Result{WindowEjectionsByMember: []uint64{0, 3, 0}, VerdictsByMember: []uint64{1, 1, 1}, OutOfPoolByMember: []float64{0, 0.3, 0}, WindowS: 1800}
	if got := EjectionsPerMemberHour.Get(r); got != 2 {
		t.Errorf("ejections per member-hour %v, want 2 (3 in 1.5 member-hours)", got)
	}
	if got := VerdictsPerMemberHour.Get(r); got != 2 {
		t.Errorf("verdicts per member-hour %v, want 2", got)
	}
	if got := OutOfPoolPct.Get(r); math.Abs(got-10) > 1e-9 {
		t.Errorf("out of pool %v %%, want 10", got)
	}
	if got := EjectionsPerMemberHour.Get(Result{}); !math.IsNaN(got) {
		t.Errorf("a client without a router: %v, want NaN (–)", got)
	}
}
