package bench

import (
	"fmt"
	"math"
	"strings"

	"github.com/oproute/oproute/router"
)

// The dominance summary asks, cell by cell of the dominance grid (one
// Comparison per cell), whether the candidate default is as good as the
// best of the other policies there.
const (
	// dominanceCandidate is the candidate default, left out when the
	// best policy of a cell is chosen.
	dominanceCandidate = router.LeastCost
	// dominanceTolerance is how far from 1 a ratio to the best may be and
	// still count as a tie (or its sd over trials, if larger).
	dominanceTolerance = 0.05
)

// dominanceJudged are the policies held against each cell's best: the
// candidate, and the paper's rule to show where it trails.
var dominanceJudged = []string{dominanceCandidate, router.Hybrid}

// Verdicts of a judged policy against a cell's best.
const (
	verdictWithin   = "within"         // |ratio − 1| ≤ tolerance, or better than the best
	verdictWithinSD = "within (by sd)" // tolerance < |ratio − 1| ≤ sd: the floor's "one sd", but the trials cannot tell
	verdictTrails   = "trails"         // beyond both
	verdictFailed   = "failed trials"  // a trial with no operations, or errors over maxErrorShare of them
)

// maxErrorShare is the share of a trial's operations that may fail before
// the trial counts as failed: a policy whose trials failed is neither a
// cell's best nor judged against it.
const maxErrorShare = 0.01

// judgedMetric is a metric the summary judges and which way is better.
type judgedMetric struct {
	name, unit   string // the columns'
	m            Metric
	higherBetter bool
}

// dominanceJudgedMetrics are the summary's metrics; write latency is
// undefined (–) in cells without writes.
var dominanceJudgedMetrics = []judgedMetric{
	{"Read P50", "ms", whenReads(ReadP50), false},
	{"Write P50", "ms", whenWrites(WriteP50), false},
	{"Tput", "ops/s", Throughput, true},
}

// judgement is one metric of one cell: its best policy and how each
// judged policy compares with it.
type judgement struct {
	best   string  // "" when no policy but the candidate has a value
	mean   Summary // the best policy's metric over its trials
	ratios []Summary
	// verdicts[i] is dominanceJudged[i]'s: verdictWithin, verdictTrails,
	// or "" without a ratio.
	verdicts []string
}

// judge compares, on jm, each of judged with the best policy of c other
// than candidate (by its mean over trials), as ratios paired trial by
// trial (Comparison.RatioTo).
func judge(c *Comparison, jm judgedMetric, candidate string, judged []string) judgement {
	j := judgement{best: bestPolicy(c, jm, candidate)}
	if j.best != "" {
		j.mean = c.Summary(j.best, jm.m)
	}
	for _, p := range judged {
		r := Summary{Mean: math.NaN(), SD: math.NaN()}
		if j.best != "" {
			r = c.RatioTo(p, j.best, jm.m)
		}
		j.ratios = append(j.ratios, r)
		v := verdict(r, jm.higherBetter)
		if v != "" && !soundTrials(c, p) {
			v = verdictFailed
		}
		j.verdicts = append(j.verdicts, v)
	}
	return j
}

// soundTrials reports whether every trial of policy in c did operations,
// with at most maxErrorShare of them failed: a policy with none has a
// latency of 0, which must not count as the fastest.
func soundTrials(c *Comparison, policy string) bool {
	trials := c.Trials[policy]
	for _, r := range trials {
		ops := r.Reads + r.Writes
		if ops == 0 || float64(r.Errors) > maxErrorShare*float64(ops+r.Errors) {
			return false
		}
	}
	return len(trials) > 0
}

// whenReads is m, undefined (NaN) for a trial without reads.
func whenReads(m Metric) Metric { return definedWhen(m, func(r Result) bool { return r.Reads > 0 }) }

// bestPolicy is the policy of c, other than exclude, with the best mean
// of jm over its trials (the first in c's order on a tie); "" if none has
// a value.
func bestPolicy(c *Comparison, jm judgedMetric, exclude string) string {
	best, bestMean := "", math.NaN()
	for _, p := range c.Policies {
		if p == exclude || !soundTrials(c, p) {
			continue
		}
		m := c.Summary(p, jm.m).Mean
		if math.IsNaN(m) {
			continue
		}
		if best == "" || jm.higherBetter && m > bestMean || !jm.higherBetter && m < bestMean {
			best, bestMean = p, m
		}
	}
	return best
}

// verdict judges a ratio to the best: within when it is better than 1 or
// |mean − 1| ≤ dominanceTolerance; within by sd when only the ratio's sd
// over trials covers it (the floor counts it, but the trials
// cannot tell a tie from a loss); else trails; "" without one.
func verdict(r Summary, higherBetter bool) string {
	switch {
	case math.IsNaN(r.Mean):
		return ""
	case higherBetter && r.Mean > 1, !higherBetter && r.Mean < 1:
		return verdictWithin
	case math.Abs(r.Mean-1) <= dominanceTolerance+1e-9: // 1.05 is within 5 %, whatever its binary
		return verdictWithin
	case math.Abs(r.Mean-1) <= r.SD:
		return verdictWithinSD
	}
	return verdictTrails
}

// dominanceGroup is the cells of one dominance scenario on one layout and
// CPU mode.
type dominanceGroup struct {
	scenario, setup string
	cells           []*Comparison
}

// dominanceGroups collects the dominance grid's comparisons in comps by
// scenario, layout and CPU mode, in the order they ran.
func dominanceGroups(comps []*Comparison) []dominanceGroup {
	defs := scenarioDefs(layoutOf(nil))
	var groups []dominanceGroup
	index := map[[2]string]int{}
	for _, c := range comps {
		if !defs[c.Scenario].dominance {
			continue
		}
		key := [2]string{c.Scenario, c.setup()}
		i, ok := index[key]
		if !ok {
			i = len(groups)
			index[key] = i
			groups = append(groups, dominanceGroup{scenario: c.Scenario, setup: key[1]})
		}
		groups[i].cells = append(groups[i].cells, c)
	}
	return groups
}

// DominanceMarkdown summarizes the dominance grid's comparisons among
// comps, one table per scenario, layout and CPU mode, one row per cell:
// for read P50, write P50 and throughput, the best policy but least_cost
// by its mean over trials, and least_cost's and hybrid's ratios to it,
// paired trial by trial (mean ± sd), each judged within (|ratio − 1| ≤
// max(0.05, sd), or better than 1) or trails. "" when comps has none.
func DominanceMarkdown(comps []*Comparison) string {
	var b strings.Builder
	for i, g := range dominanceGroups(comps) {
		if i > 0 {
			b.WriteString("\n")
		}
		g.markdown(&b)
	}
	return b.String()
}

func (g dominanceGroup) markdown(b *strings.Builder) {
	fmt.Fprintf(b, "#### %s summary · %s\n\n", g.scenario, g.setup)
	fmt.Fprintf(b, "Per cell and metric: the best policy but %s by its mean over trials (lower latency, higher throughput; policies with %s left out), and each judged policy's ratio to it, paired trial by trial (mean ± sd): %s when |ratio − 1| ≤ %.2f or the ratio is better than 1; %s when only the sd covers it; else %s.\n\n",
		dominanceCandidate, verdictFailed, verdictWithin, dominanceTolerance, verdictWithinSD, verdictTrails)
	b.WriteString("| Cell |")
	for _, jm := range dominanceJudgedMetrics {
		fmt.Fprintf(b, " %s: best (%s) |", jm.name, jm.unit)
		for _, p := range dominanceJudged {
			fmt.Fprintf(b, " %s / best | verdict |", p)
		}
	}
	b.WriteString("\n|---|")
	for range dominanceJudgedMetrics {
		b.WriteString(strings.Repeat("---|", 1+2*len(dominanceJudged)))
	}
	b.WriteString("\n")
	judged, trails := make([]int, len(dominanceJudged)), make([][]string, len(dominanceJudged))
	for _, c := range g.cells {
		fmt.Fprintf(b, "| %s |", c.Variant)
		for _, jm := range dominanceJudgedMetrics {
			j := judge(c, jm, dominanceCandidate, dominanceJudged)
			if j.best == "" {
				b.WriteString(" – |")
			} else {
				fmt.Fprintf(b, " %s (%s) |", j.best, j.mean.Format(jm.m.Decimals))
			}
			for k := range dominanceJudged {
				v := j.verdicts[k]
				if v == "" {
					b.WriteString(" – | – |")
					continue
				}
				fmt.Fprintf(b, " %s | %s |", j.ratios[k].Format(3), v)
				judged[k]++
				if v != verdictWithin {
					trails[k] = append(trails[k], fmt.Sprintf("%s %s %s (%s)", c.Variant, jm.name, j.ratios[k].Format(3), v))
				}
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	for k, p := range dominanceJudged {
		if k > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(b, "%s within the best in %d of %d", p, judged[k]-len(trails[k]), judged[k])
		if len(trails[k]) > 0 {
			fmt.Fprintf(b, "; not in %s", strings.Join(trails[k], "; "))
		}
		b.WriteString(".")
	}
	b.WriteString("\n")
}
