package bench

import (
	"strings"
	"testing"
)

// TestCalibrate: the ratios a bed run and a simulated run share are lined
// up by scenario, variant and topology (none named is the default),
// paired by trial in each run, and judged within ±10 % or the bed's own
// sd; a ratio to a policy only one run has is left out.
func TestCalibrate(t *testing.T) {
	run := func(scenario, baseline string, base, pol []float64) *Comparison {
		c := &Comparison{Scenario: scenario, Variant: "80/20", Baseline: baseline, Policies: []string{baseline, "hybrid"}, Trials: map[string][]Result{}}
		for k := range base {
			c.Trials[baseline] = append(c.Trials[baseline], Result{WriteP50ms: base[k], ThroughputOps: 100})
			c.Trials["hybrid"] = append(c.Trials["hybrid"], Result{WriteP50ms: pol[k], ThroughputOps: 100})
		}
		return c
	}
	bed := []*Comparison{run("healthy", "round_robin", []float64{10, 10}, []float64{7, 7.4}), run("degraded", "round_robin", []float64{1}, []float64{1})}
	sim := []*Comparison{run("healthy", "round_robin", []float64{4, 4}, []float64{3.2, 3.2}), run("degraded", "sticky", []float64{1}, []float64{1})}
	sim[0].Topology = "default" // the bed's names none
	rows := Calibrate(bed, sim)
	var write *CalibrationRow
	for i, r := range rows {
		if r.Scenario != "healthy" {
			t.Errorf("row for %s: its simulated run has no round_robin", r.Scenario)
		}
		if r.Metric == WriteP50.Name {
			write = &rows[i]
		}
	}
	if write == nil {
		t.Fatalf("no write P50 row in %+v", rows)
	}
	// Bed 0.72 ± 0.028, simulated 0.80: 11 % off, outside 10 % and the sd.
	if got := write.Bed.Mean; got < 0.719 || got > 0.721 {
		t.Errorf("bed ratio %v, want 0.72", got)
	}
	if write.Matches() {
		t.Errorf("0.80 against 0.72 ± %.3f matched", write.Bed.SD)
	}
	write.Sim.Mean = 0.78 // 8 % off
	if !write.Matches() {
		t.Error("0.78 against 0.72 did not match")
	}
	if md := CalibrationMarkdown(rows); !strings.Contains(md, "of 2 ratios within") {
		t.Errorf("markdown:\n%s", md)
	}
}
