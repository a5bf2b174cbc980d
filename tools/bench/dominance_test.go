package bench

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oproute/oproute/router"
)

// cell builds a comparison of the dominance grid from per-policy trials
// of (read P50 ms, write P50 ms, throughput ops/s); a write P50 of 0 is
// a trial without writes.
func cell(variant, topology, cpu string, trials map[string][][3]float64) *Comparison {
	def := scenarioDefs(layoutOf(nil))[ScenarioDominance]
	c := &Comparison{Scenario: ScenarioDominance, Variant: variant, Baseline: Stock, Metrics: def.metrics(3), Notes: def.notes,
		Trials: map[string][]Result{}, Topology: topology, CPU: cpu}
	for _, p := range []string{Stock, Pinned, router.RoundRobin, router.LeaderOnly, router.Boltzmann, router.Hybrid, HybridP2C, router.LeastCost} {
		ts, ok := trials[p]
		if !ok {
			continue
		}
		c.Policies = append(c.Policies, p)
		for k, tr := range ts {
			writes := int64(1000)
			if tr[1] == 0 {
				writes = 0
			}
			c.Trials[p] = append(c.Trials[p], Result{Scenario: ScenarioDominance, Variant: variant, Policy: p, Trial: k + 1,
				ReadP50ms: tr[0], WriteP50ms: tr[1], ThroughputOps: tr[2], Reads: 4000, Writes: writes,
				ReadsByMember: []uint64{1, 1, 1}, CPUMode: cpu, Topology: topology})
		}
	}
	return c
}

const (
	budgetsLine = "CPU: budgets (cgroup quotas) of 0.5 / 0.5 / 0.5 cores for members m0…m2."
	sharedLine  = "CPU: shared cores: the members run unconfined."
)

func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		name         string
		r            Summary
		higherBetter bool
		want         string
	}{
		{"equal", Summary{Mean: 1, SD: 0, N: 3}, false, verdictWithin},
		{"5 % slower", Summary{Mean: 1.05, SD: 0.01, N: 3}, false, verdictWithin},
		{"6 % slower", Summary{Mean: 1.06, SD: 0.01, N: 3}, false, verdictTrails},
		{"6 % slower, sd 8 %", Summary{Mean: 1.06, SD: 0.08, N: 3}, false, verdictWithinSD},
		{"faster by far", Summary{Mean: 0.5, SD: 0.01, N: 3}, false, verdictWithin},
		{"throughput 10 % higher", Summary{Mean: 1.1, SD: 0.01, N: 3}, true, verdictWithin},
		{"throughput 10 % lower", Summary{Mean: 0.9, SD: 0.01, N: 3}, true, verdictTrails},
		{"throughput 4 % lower", Summary{Mean: 0.96, SD: 0, N: 1}, true, verdictWithin},
		{"no ratio", Summarize(nil), false, ""},
	} {
		if got := verdict(tc.r, tc.higherBetter); got != tc.want {
			t.Errorf("%s: verdict(%+v) = %q, want %q", tc.name, tc.r, got, tc.want)
		}
	}
}

func TestJudge(t *testing.T) {
	c := cell("8 workers, 80/20", "default", budgetsLine, map[string][][3]float64{
		// least_cost reads fastest but is no candidate for the best.
		router.LeastCost: {{0.9, 2.2, 1000}, {1.8, 4.4, 900}},
		// boltzmann: the best read P50 (mean 1.5) and write P50 (3).
		router.Boltzmann: {{1, 2, 1100}, {2, 4, 1000}},
		router.Hybrid:    {{1.2, 2.4, 1050}, {2.4, 4.4, 1000}},
		// stock: the best throughput (mean 1150), worst latencies.
		Stock: {{3, 6, 1200}, {3, 6, 1100}},
	})
	j := judge(c, dominanceJudgedMetrics[0], dominanceCandidate, dominanceJudged)
	if j.best != router.Boltzmann || j.mean.Mean != 1.5 {
		t.Fatalf("read P50: best %s (%v), want boltzmann (1.5), least_cost left out", j.best, j.mean)
	}
	// Paired: 0.9/1 and 1.8/2 are 0.9 both, though the means' ratio is too.
	if r := j.ratios[0]; math.Abs(r.Mean-0.9) > 1e-9 || r.SD > 1e-9 || j.verdicts[0] != verdictWithin {
		t.Errorf("least_cost / best read P50 = %+v %s, want 0.9 ± 0 within", r, j.verdicts[0])
	}
	if r := j.ratios[1]; math.Abs(r.Mean-1.2) > 1e-9 || j.verdicts[1] != verdictTrails {
		t.Errorf("hybrid / best read P50 = %+v %s, want 1.2 trails", r, j.verdicts[1])
	}
	j = judge(c, dominanceJudgedMetrics[1], dominanceCandidate, dominanceJudged)
	// least_cost write P50: 2.2/2, 4.4/4: 1.1 ± 0, trails by 10 %.
	if r := j.ratios[0]; j.best != router.Boltzmann || math.Abs(r.Mean-1.1) > 1e-9 || j.verdicts[0] != verdictTrails {
		t.Errorf("write P50: best %s, least_cost %+v %s; want boltzmann, 1.1 trails", j.best, r, j.verdicts[0])
	}
	// hybrid write P50: 1.2 and 1.1, mean 1.15, sd 0.0707: trails.
	if r := j.ratios[1]; math.Abs(r.Mean-1.15) > 1e-9 || j.verdicts[1] != verdictTrails {
		t.Errorf("hybrid / best write P50 = %+v %s, want 1.15 trails", r, j.verdicts[1])
	}
	j = judge(c, dominanceJudgedMetrics[2], dominanceCandidate, dominanceJudged)
	// Throughput, higher is better: stock; least_cost 1000/1200, 900/1100.
	if r := j.ratios[0]; j.best != Stock || math.Abs(r.Mean-(1000.0/1200+900.0/1100)/2) > 1e-9 || j.verdicts[0] != verdictTrails {
		t.Errorf("throughput: best %s, least_cost %+v %s; want stock, 0.826 trails", j.best, r, j.verdicts[0])
	}

	// The paper's rule may be the best itself: a ratio of 1 ± 0, within.
	c = cell("8 workers, 50/50", "default", budgetsLine, map[string][][3]float64{
		router.Hybrid:    {{1, 2, 1000}, {1, 2, 1000}},
		router.LeastCost: {{1.04, 2.3, 1300}, {1.03, 2.4, 1200}},
	})
	j = judge(c, dominanceJudgedMetrics[0], dominanceCandidate, dominanceJudged)
	if j.best != router.Hybrid || j.ratios[1] != (Summary{Mean: 1, SD: 0, N: 2}) || !slices.Equal(j.verdicts, []string{verdictWithin, verdictWithin}) {
		t.Errorf("hybrid best: %+v", j)
	}

	// Without least_cost (--policies left it out) there is a best and no
	// ratio of its; with least_cost alone, no best.
	c = cell("as given", "default", budgetsLine, map[string][][3]float64{router.Hybrid: {{1, 2, 1000}}, router.RoundRobin: {{2, 2, 900}}})
	if j = judge(c, dominanceJudgedMetrics[0], dominanceCandidate, dominanceJudged); j.best != router.Hybrid || j.verdicts[0] != "" || j.verdicts[1] != verdictWithin {
		t.Errorf("without least_cost: %+v", j)
	}
	c = cell("as given", "default", budgetsLine, map[string][][3]float64{router.LeastCost: {{1, 2, 1000}}})
	if j = judge(c, dominanceJudgedMetrics[0], dominanceCandidate, dominanceJudged); j.best != "" || j.verdicts[0] != "" {
		t.Errorf("least_cost alone: %+v", j)
	}

	// A policy whose trial did nothing (a latency of 0) is no cell's best,
	// and one whose trials failed is judged failed, not within.
	c = cell("8 workers, 80/20", "default", budgetsLine, map[string][][3]float64{
		router.Hybrid:     {{1, 2, 1000}},
		router.LeaderOnly: {{2, 2, 900}},
		router.LeastCost:  {{1, 2, 1000}},
	})
	c.Trials[router.Hybrid][0].Reads, c.Trials[router.Hybrid][0].Writes, c.Trials[router.Hybrid][0].ReadP50ms = 0, 0, 0
	c.Trials[router.LeastCost][0].Errors = c.Trials[router.LeastCost][0].Reads
	if j = judge(c, dominanceJudgedMetrics[0], dominanceCandidate, dominanceJudged); j.best != router.LeaderOnly || j.verdicts[0] != verdictFailed {
		t.Errorf("failed trials: %+v", j)
	}
}

// gridCells is two cells on each of two setups, the second cell without
// writes.
func gridCells() []*Comparison {
	var cs []*Comparison
	for _, s := range []struct{ topology, cpu string }{{"default", budgetsLine}, {"three-zones", sharedLine}} {
		cs = append(cs,
			cell("8 workers, 80/20", s.topology, s.cpu, map[string][][3]float64{
				Stock:            {{2, 4, 900}, {2.2, 4.2, 850}, {2.1, 4.1, 880}},
				router.Boltzmann: {{1, 2, 1100}, {1.1, 2.1, 1050}, {1.05, 2.05, 1080}},
				router.Hybrid:    {{1.3, 2, 1000}, {1.4, 2.1, 990}, {1.3, 2.1, 1010}},
				router.LeastCost: {{1.02, 2.3, 1090}, {1.1, 2.4, 1060}, {1.06, 2.3, 1070}},
			}),
			cell("8 workers, 100/0", s.topology, s.cpu, map[string][][3]float64{
				Stock:            {{2, 0, 900}, {2, 0, 900}, {2, 0, 900}},
				router.Boltzmann: {{1, 0, 1100}, {1, 0, 1100}, {1, 0, 1100}},
				router.Hybrid:    {{1.1, 0, 1000}, {1.1, 0, 1050}, {1.1, 0, 1000}},
				router.LeastCost: {{0.95, 0, 1150}, {0.97, 0, 1120}, {0.96, 0, 1130}},
			}))
	}
	return cs
}

func TestDominanceMarkdown(t *testing.T) {
	cs := gridCells()
	quick := &Comparison{Scenario: ScenarioQuick, Variant: "80/20", Baseline: Stock, Policies: []string{Stock}, Trials: map[string][]Result{}}
	md := DominanceMarkdown(append(cs, quick))
	t.Logf("the summary:\n%s", md)
	for _, want := range []string{
		"#### dominance summary · default topology, budgets\n",
		"#### dominance summary · three-zones topology, shared cores\n",
		"| Cell | Read P50: best (ms) | least_cost / best | verdict | hybrid / best | verdict | Write P50: best (ms) |",
		"| 8 workers, 80/20 | boltzmann (1.05 ± 0.05) | 1.010 ± 0.010 | within | 1.270 ± 0.031 | trails | boltzmann (2.05 ± 0.05) | 1.138 ± 0.015 | trails | 1.008 ± 0.014 | within | boltzmann (1077 ± 25) | 0.997 ± 0.011 | within | 0.929 ± 0.018 | trails |",
		// No writes: no best and no ratio.
		"| 8 workers, 100/0 | boltzmann (1.00 ± 0.00) | 0.960 ± 0.010 | within | 1.100 ± 0.000 | trails | – | – | – | – | – | boltzmann (1100 ± 0) |",
		"least_cost within the best in 4 of 5; not in 8 workers, 80/20 Write P50 1.138 ± 0.015 (trails). hybrid within the best in 1 of 5; not in 8 workers, 80/20 Read P50 1.270 ± 0.031 (trails);",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(md, "quick") {
		t.Error("a scenario outside the grid is summarized")
	}
	if strings.Count(md, "#### ") != 2 {
		t.Errorf("%d summaries, want one per setup (2)", strings.Count(md, "#### "))
	}
	all := Markdown(cs)
	if !strings.HasSuffix(all, md) || !strings.Contains(all, "#### dominance · 8 workers, 100/0 · three-zones topology, shared cores\n") {
		t.Errorf("Markdown: titles without their setup or no summary at the end:\n%s", all)
	}
	if !strings.Contains(all, "| Write P50 (ms) | – | – | – | – | – | – | – |") {
		t.Errorf("a cell without writes shows write latencies:\n%s", all)
	}
	if DominanceMarkdown([]*Comparison{quick}) != "" || strings.Contains(Markdown([]*Comparison{quick}), "summary") {
		t.Error("a run without the grid has a summary")
	}
}

// TestDominanceFilesRoundTrip: one --out directory holds every setup's
// records, tells them apart, and --replot redraws the same tables and a
// figure per setup.
func TestDominanceFilesRoundTrip(t *testing.T) {
	cs := gridCells()
	dir := t.TempDir()
	if err := WriteFiles(dir, cs, "header", nil); err != nil {
		t.Fatal(err)
	}
	got, err := LoadComparisons(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cs) {
		t.Fatalf("%d comparisons from results.json, want %d", len(got), len(cs))
	}
	if Markdown(got) != Markdown(cs) {
		t.Errorf("redrawn:\n%s\nwant:\n%s", Markdown(got), Markdown(cs))
	}
	for _, f := range []string{"fig_dominance_default_budgets.png", "fig_dominance_three_zones_shared_cores.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(csv), ",cpu_mode,topology,") || !strings.Contains(string(csv), ","+sharedLine+",three-zones,") {
		t.Errorf("results.csv does not tell the setups apart:\n%s", csv[:min(len(csv), 600)])
	}
}

func TestDominancePlan(t *testing.T) {
	if slices.Contains(Scenarios(), ScenarioDominance) || slices.Contains(Scenarios(), ScenarioZKDominance) {
		t.Error("the dominance grid is part of all")
	}
	if !SpansGrid(ScenarioDominance) || !SpansGrid(ScenarioZKDominance) || SpansGrid(ScenarioHealthy) || SpansGrid("nope") {
		t.Error("SpansGrid")
	}
	if d := Describe(); !strings.Contains(d, ScenarioDominance) || !strings.Contains(d, ScenarioZKDominance) {
		t.Errorf("Describe lacks the grid:\n%s", d)
	}
	r, err := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload()})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := r.plan(ScenarioDominance)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{Stock, Pinned, router.RoundRobin, router.LeaderOnly, router.Boltzmann, router.Hybrid, HybridP2C, router.LeastCost}; !slices.Equal(ps.policies, want) || ps.baseline != Stock {
		t.Errorf("policies %v (baseline %s), want %v", ps.policies, ps.baseline, want)
	}
	if len(ps.variants) != 12 {
		t.Fatalf("%d variants, want 12", len(ps.variants))
	}
	type fields struct {
		workers, value, rng int
		ratio               float64
	}
	want := map[string]fields{
		"8 workers, 80/20":                       {8, 256, 1, 0.8},
		"32 workers, 50/50":                      {32, 256, 1, 0.5},
		"128 workers, 100/0":                     {128, 256, 1, 1},
		"128 workers, 100/0, ranges of 100 keys": {128, 256, 100, 1},
	}
	for _, v := range ps.variants {
		w := Workload{ValueSize: 7, RangeSize: 7, Workers: 7, ReadRatio: 0.7}
		v.apply(&w)
		if slices.Contains([]int{w.Workers, w.ValueSize, w.RangeSize}, 7) || w.ReadRatio == 0.7 || len(v.fields) != 4 {
			t.Errorf("%s sets %+v, fields %v: want all four", v.label, w, v.fields)
		}
		if f, ok := want[v.label]; ok {
			if got := (fields{w.Workers, w.ValueSize, w.RangeSize, w.ReadRatio}); got != f {
				t.Errorf("%s: %+v, want %+v", v.label, got, f)
			}
			delete(want, v.label)
		}
	}
	if len(want) > 0 {
		t.Errorf("variants missing: %v", want)
	}
	// A flag the user sets wins: one cell, as given.
	wr, _ := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload(), Set: map[string]bool{"workers": true}})
	if ps, _ = wr.plan(ScenarioDominance); len(ps.variants) != 1 || ps.variants[0].label != "as given" {
		t.Errorf("--workers set: variants %v", ps.variants)
	}
	ps, err = r.plan(ScenarioZKDominance)
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, v := range ps.variants {
		labels = append(labels, v.label)
	}
	if ps.backend.Name() != "zk" || ps.baseline != router.RoundRobin || len(ps.policies) != 7 || !slices.Equal(labels, []string{"8 workers, 80/20", "32 workers, 80/20"}) {
		t.Errorf("zk-dominance: %s, baseline %s, %v, variants %v", ps.backend.Name(), ps.baseline, ps.policies, labels)
	}
	// On ZooKeeper, dominance keeps every cell but the ranges.
	zr, _ := NewRunner(Options{Backend: ZooKeeper{}, Workload: DefaultWorkload()})
	if ps, _ = zr.plan(ScenarioDominance); len(ps.variants) != 9 || slices.Contains(ps.policies, Stock) {
		t.Errorf("dominance on zk: %d variants, policies %v; want 9, no stock", len(ps.variants), ps.policies)
	}
}
