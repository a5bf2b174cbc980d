package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/oproute/oproute/router"
)

// CalibrationTolerance is how far a simulated ratio may sit from the test
// bed's and still match: ±10 %.
const CalibrationTolerance = 0.10

// calibrationMetrics are the figures a simulation predicts (CPU and
// traffic it does not measure).
var calibrationMetrics = []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput}

// CalibrationRow is one headline ratio (a policy's to its scenario's
// baseline, paired by trial) on the test bed and simulated.
type CalibrationRow struct {
	Scenario, Variant, Topology string
	BedCPU                      string // the bed run's CPU mode (CPUModeName)
	Policy, Baseline            string
	Metric                      string
	Bed, Sim                    Summary
}

// Off is how far the simulated ratio's mean sits from the bed's, as a
// fraction of the bed's (NaN when either is missing).
func (r CalibrationRow) Off() float64 { return r.Sim.Mean/r.Bed.Mean - 1 }

// Matches reports whether the simulated ratio is within
// CalibrationTolerance of the bed's, or within the bed's own spread of it
// (one sd) where that is wider.
func (r CalibrationRow) Matches() bool {
	d := math.Abs(r.Sim.Mean - r.Bed.Mean)
	return d <= math.Max(CalibrationTolerance*math.Abs(r.Bed.Mean), r.Bed.SD)
}

// Calibrate lines up the headline ratios of the scenarios that bed (a test
// bed run's comparisons) and sim (a simulated run's) share, by scenario,
// variant and topology (a run that named none ran on the default one):
// every policy both ran, to the scenario's baseline and to round_robin
// (the paper's) where both ran it.
func Calibrate(bed, sim []*Comparison) []CalibrationRow {
	type key struct{ scenario, variant, topology string }
	topology := func(c *Comparison) string {
		if c.Topology == "" {
			return "default"
		}
		return c.Topology
	}
	simBy := map[key]*Comparison{}
	for _, c := range sim {
		simBy[key{c.Scenario, c.Variant, topology(c)}] = c
	}
	var rows []CalibrationRow
	for _, b := range bed {
		s := simBy[key{b.Scenario, b.Variant, topology(b)}] // one simulated CPU model for each of the bed's modes
		if s == nil {
			continue
		}
		refs := []string{b.Baseline}
		if b.Baseline != router.RoundRobin {
			refs = append(refs, router.RoundRobin)
		}
		for i, ref := range refs {
			if len(b.Trials[ref]) == 0 || len(s.Trials[ref]) == 0 {
				continue
			}
			for _, p := range b.Policies {
				if p == ref || slices.Contains(refs[:i], p) || len(s.Trials[p]) == 0 { // one pair, one way
					continue
				}
				for _, m := range calibrationMetrics {
					row := CalibrationRow{Scenario: b.Scenario, Variant: b.Variant, Topology: topology(b), BedCPU: CPUModeName(b.CPU), Policy: p, Baseline: ref,
						Metric: m.Name, Bed: b.RatioTo(p, ref, m), Sim: s.RatioTo(p, ref, m)}
					if !math.IsNaN(row.Bed.Mean) && !math.IsNaN(row.Sim.Mean) {
						rows = append(rows, row)
					}
				}
			}
		}
	}
	return rows
}

// CalibrationMarkdown renders the rows with how many match.
func CalibrationMarkdown(rows []CalibrationRow) string {
	var b strings.Builder
	matched := 0
	tol := fmt.Sprintf("±%.0f %%", 100*CalibrationTolerance)
	fmt.Fprintf(&b, "| Scenario | Variant | Bed CPU | Ratio | Metric | Test bed | Simulated | Off | Within %s (or the bed's sd) |\n|---|---|---|---|---|---|---|---|---|\n", tol)
	for _, r := range rows {
		ok := "no"
		if r.Matches() {
			ok, matched = "yes", matched+1
		}
		scenario := r.Scenario
		if r.Topology != "default" {
			scenario += " (" + r.Topology + ")"
		}
		cpu := r.BedCPU
		if cpu == "" {
			cpu = "–"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s / %s | %s | %s | %s | %+.0f %% | %s |\n", scenario, r.Variant, cpu, r.Policy, r.Baseline, r.Metric,
			r.Bed.Format(3), r.Sim.Format(3), 100*r.Off(), ok)
	}
	fmt.Fprintf(&b, "\n%d of %d ratios within %s of the test bed's (or within its sd).\n", matched, len(rows), tol)
	return b.String()
}
