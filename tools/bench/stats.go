package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Summary is the mean and sample standard deviation of one metric over trials.
type Summary struct {
	Mean float64 `json:"mean"`
	SD   float64 `json:"sd"`
	N    int     `json:"n"`
}

// Summarize returns the mean and sample standard deviation of xs (NaNs are
// skipped).
func Summarize(xs []float64) Summary {
	var s Summary
	sum := 0.0
	for _, x := range xs {
		if !math.IsNaN(x) {
			sum += x
			s.N++
		}
	}
	if s.N == 0 {
		return Summary{Mean: math.NaN(), SD: math.NaN()}
	}
	s.Mean = sum / float64(s.N)
	if s.N > 1 {
		ss := 0.0
		for _, x := range xs {
			if !math.IsNaN(x) {
				ss += (x - s.Mean) * (x - s.Mean)
			}
		}
		s.SD = math.Sqrt(ss / float64(s.N-1))
	}
	return s
}

// Format prints "mean ± sd" with the given decimals ("mean" alone for one trial).
func (s Summary) Format(decimals int) string {
	if math.IsNaN(s.Mean) {
		return "–"
	}
	if s.N < 2 {
		return fmt.Sprintf("%.*f", decimals, s.Mean)
	}
	return fmt.Sprintf("%.*f ± %.*f", decimals, s.Mean, decimals, s.SD)
}

// Metric is one row of a comparison table.
type Metric struct {
	Name     string
	Decimals int
	Get      func(Result) float64
	// Share marks a percentage of a total (a member's share of writes):
	// policies are compared by the difference in percentage points, as a
	// ratio of two percentages reads as nonsense ("3.036 (+203.6 %)").
	Share bool
}

// Standard metrics.
var (
	ReadP50    = Metric{Name: "Read P50 (ms)", Decimals: 2, Get: func(r Result) float64 { return r.ReadP50ms }}
	ReadP99    = Metric{Name: "Read P99 (ms)", Decimals: 2, Get: func(r Result) float64 { return r.ReadP99ms }}
	ReadP999   = Metric{Name: "Read P99.9 (ms)", Decimals: 2, Get: func(r Result) float64 { return r.ReadP999ms }}
	WriteP50   = Metric{Name: "Write P50 (ms)", Decimals: 2, Get: func(r Result) float64 { return r.WriteP50ms }}
	WriteP99   = Metric{Name: "Write P99 (ms)", Decimals: 2, Get: func(r Result) float64 { return r.WriteP99ms }}
	Throughput = Metric{Name: "Tput (ops/s)", Decimals: 0, Get: func(r Result) float64 { return r.ThroughputOps }}
	Errors     = Metric{Name: "Errors", Decimals: 0, Get: func(r Result) float64 { return float64(r.Errors) }}
	ClientCPU  = Metric{Name: "Client CPU (cores)", Decimals: 2, Get: func(r Result) float64 { return measuredCPU(r, r.ClientCPU) }}
	ServerCPU  = Metric{Name: "Server CPU (cores)", Decimals: 2, Get: func(r Result) float64 { return measuredCPU(r, r.ServerCPU) }}
	// CPU per operation: what a paced workload compares (its throughput
	// is fixed, so cores alone would hide nothing, but per op is exact).
	ClientCPUPerOp = Metric{Name: "Client CPU (µs/op)", Decimals: 1, Get: func(r Result) float64 { return perOp(measuredCPU(r, r.ClientCPU), r.ThroughputOps) }}
	ServerCPUPerOp = Metric{Name: "Server CPU (µs/op)", Decimals: 1, Get: func(r Result) float64 { return perOp(measuredCPU(r, r.ServerCPU), r.ThroughputOps) }}
)

// Bytes that crossed zones through the test bed's proxies (TCP payload,
// both ways) per operation done in the window; – when unknown (an external
// cluster). Background traffic counts too: heartbeats, the router's
// probes, failed operations.
var (
	CrossZoneBytesPerOp       = trafficPerOp("Cross-zone (B/op)", Traffic.CrossZone)
	ClientCrossZoneBytesPerOp = trafficPerOp("Client cross-zone (B/op)", func(t Traffic) uint64 { return t.ClientCrossZone })
	PeerCrossZoneBytesPerOp   = trafficPerOp("Peer cross-zone (B/op)", func(t Traffic) uint64 { return t.PeerCrossZone })
)

// measuredCPU is cores, or NaN (–) for a simulated trial, which measures
// no CPU.
func measuredCPU(r Result, cores float64) float64 {
	if CPUModeName(r.CPUMode) == CPUModeSimulated {
		return math.NaN()
	}
	return cores
}

func trafficPerOp(name string, bytes func(Traffic) uint64) Metric {
	return Metric{Name: name, Decimals: 0, Get: func(r Result) float64 {
		ops := r.Reads + r.Writes
		if r.Traffic == nil || ops == 0 {
			return math.NaN()
		}
		return float64(bytes(*r.Traffic)) / float64(ops)
	}}
}

// The read pool's judgement over the measured window, per member-hour
// (every member counted, the leader too): ejections, and least_cost's
// judge's verdicts; and the share of member-time out of the pool. – for a
// client without a router.
var (
	EjectionsPerMemberHour = Metric{Name: "Ejections / member-hour", Decimals: 2, Get: func(r Result) float64 {
		return perMemberHour(r.WindowEjectionsByMember, r.WindowS)
	}}
	VerdictsPerMemberHour = Metric{Name: "Judge verdicts / member-hour", Decimals: 2, Get: func(r Result) float64 {
		return perMemberHour(r.VerdictsByMember, r.WindowS)
	}}
	OutOfPoolPct = Metric{Name: "Out of pool (% of member-time)", Decimals: 3, Share: true, Get: func(r Result) float64 {
		if len(r.OutOfPoolByMember) == 0 {
			return math.NaN()
		}
		sum := 0.0
		for _, s := range r.OutOfPoolByMember {
			sum += s
		}
		return 100 * sum / float64(len(r.OutOfPoolByMember))
	}}
)

func perMemberHour(counts []uint64, windowS float64) float64 {
	if len(counts) == 0 || windowS <= 0 {
		return math.NaN()
	}
	var n uint64
	for _, c := range counts {
		n += c
	}
	return float64(n) / (float64(len(counts)) * windowS / 3600)
}

// ExtraReads is the hedges sent as a percentage of the reads done.
var ExtraReads = Metric{Name: "Extra reads (%)", Decimals: 2, Share: true, Get: func(r Result) float64 {
	if r.Reads == 0 {
		return math.NaN()
	}
	return 100 * float64(r.HedgedReads) / float64(r.Reads)
}}

func perOp(cores, opsPerSecond float64) float64 {
	if opsPerSecond <= 0 {
		return math.NaN()
	}
	return 1e6 * cores / opsPerSecond
}

// MemberReadShare is the share of reads (percent, server side when known)
// served by member i.
func MemberReadShare(i int) Metric {
	return memberShare(fmt.Sprintf("Reads to m%d (%%)", i), 2, i, func(r Result) ([]uint64, []uint64) {
		return r.ServerReadsByMember, r.ReadsByMember
	})
}

// MemberWriteShare is the share of writes (percent, server side when known)
// sent to member i.
func MemberWriteShare(i int) Metric {
	return memberShare(fmt.Sprintf("Writes to m%d (%%)", i), 1, i, func(r Result) ([]uint64, []uint64) {
		return r.ServerWritesByMember, r.WritesByMember
	})
}

// memberShare prefers the members' own counts to the router's.
func memberShare(name string, decimals, i int, counts func(Result) (server, routed []uint64)) Metric {
	return Metric{Name: name, Decimals: decimals, Share: true, Get: func(r Result) float64 {
		by, routed := counts(r)
		if by == nil {
			by = routed
		}
		return share(by, i)
	}}
}

func share(by []uint64, i int) float64 {
	total := 0.0
	for _, n := range by {
		total += float64(n)
	}
	if total == 0 || i >= len(by) {
		return math.NaN()
	}
	return 100 * float64(by[i]) / total
}

// ExtraMetric reads Result.Extra[name].
func ExtraMetric(label, name string, decimals int) Metric {
	return Metric{Name: label, Decimals: decimals, Get: func(r Result) float64 {
		if v, ok := r.Extra[name]; ok {
			return v
		}
		return math.NaN()
	}}
}

// Comparison is the trials of several policies on one scenario variant.
type Comparison struct {
	Scenario string
	Variant  string
	Section  string // the paper's section
	Baseline string
	Policies []string
	Metrics  []Metric
	// Trials[policy][k] is the k-th trial of policy; trials with the same
	// k ran back to back and are compared pairwise.
	Trials map[string][]Result
	// Notes are printed under the table.
	Notes []string
	// CPU says how the run shared the host's CPU (CPUMode); "" for a
	// cluster not on the test bed.
	CPU string `json:",omitempty"`
	// Topology names the topology it ran on (Options.TopologyName); ""
	// for a cluster not on the test bed. The title names it and the CPU
	// mode when set.
	Topology string `json:",omitempty"`
}

// Summary returns policy's metric over its trials.
func (c *Comparison) Summary(policy string, m Metric) Summary {
	var xs []float64
	for _, r := range c.Trials[policy] {
		xs = append(xs, m.Get(r))
	}
	return Summarize(xs)
}

// Ratio returns policy/baseline for m, paired trial by trial.
func (c *Comparison) Ratio(policy string, m Metric) Summary {
	return c.RatioTo(policy, c.Baseline, m)
}

// RatioTo returns policy/ref for m, paired trial by trial.
func (c *Comparison) RatioTo(policy, ref string, m Metric) Summary {
	var xs []float64
	a, b := c.Trials[policy], c.Trials[ref]
	for k := range min(len(a), len(b)) {
		if den := m.Get(b[k]); den != 0 && !math.IsNaN(den) {
			xs = append(xs, m.Get(a[k])/den)
		}
	}
	return Summarize(xs)
}

// Diff returns policy − baseline for m, paired trial by trial.
func (c *Comparison) Diff(policy string, m Metric) Summary {
	var xs []float64
	a, b := c.Trials[policy], c.Trials[c.Baseline]
	for k := range min(len(a), len(b)) {
		if x, y := m.Get(a[k]), m.Get(b[k]); !math.IsNaN(x) && !math.IsNaN(y) {
			xs = append(xs, x-y)
		}
	}
	return Summarize(xs)
}

// Markdown renders the comparison as the paper's tables do: one row per
// metric, mean ± sd per policy, and each policy's ratio to the baseline
// (paired by trial, mean ± sd) with the % change of the mean ratio; for a
// share, the difference in percentage points instead.
func (c *Comparison) Markdown() string {
	var b strings.Builder
	title := c.Scenario
	if c.Variant != "" {
		title += " · " + c.Variant
	}
	if c.Topology != "" {
		title += " · " + c.setup()
	}
	fmt.Fprintf(&b, "#### %s", title)
	if c.Section != "" {
		fmt.Fprintf(&b, " (%s)", paperRef(c.Section))
	}
	b.WriteString("\n\n| Metric |")
	others := []string{}
	for _, p := range c.Policies {
		fmt.Fprintf(&b, " %s |", p)
		if p != c.Baseline {
			others = append(others, p)
		}
	}
	for _, p := range others {
		fmt.Fprintf(&b, " %s / %s |", p, c.Baseline)
	}
	b.WriteString("\n|---|")
	for range len(c.Policies) + len(others) {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, m := range c.Metrics {
		fmt.Fprintf(&b, "| %s |", m.Name)
		for _, p := range c.Policies {
			fmt.Fprintf(&b, " %s |", c.Summary(p, m).Format(m.Decimals))
		}
		for _, p := range others {
			if m.Share {
				if d := c.Diff(p, m); !math.IsNaN(d.Mean) {
					fmt.Fprintf(&b, " %+.1f ± %.1f pp |", d.Mean, d.SD)
				} else {
					b.WriteString(" – |")
				}
				continue
			}
			r := c.Ratio(p, m)
			if math.IsNaN(r.Mean) {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(&b, " %s (%+.1f%%) |", r.Format(3), 100*(r.Mean-1))
		}
		b.WriteString("\n")
	}
	n := 0
	for _, p := range c.Policies {
		n = max(n, len(c.Trials[p]))
	}
	fmt.Fprintf(&b, "\n%d trial(s) per policy, interleaved.", n)
	for _, note := range c.Notes {
		b.WriteString(" " + note)
	}
	if c.CPU != "" {
		b.WriteString(" " + c.CPU)
	}
	b.WriteString("\n")
	if e := c.ejections(); e != "" {
		b.WriteString("\nEjections from the read pool per member (m0/m1/…) over each trial, warm-up included: " + e + ".\n")
	}
	return b.String()
}

// setup names the layout and CPU mode the comparison ran on:
// "three-zones topology, shared cores".
func (c *Comparison) setup() string {
	var parts []string
	if c.Topology != "" {
		parts = append(parts, c.Topology+" topology")
	}
	if n := CPUModeName(c.CPU); n != "" {
		parts = append(parts, n)
	}
	if len(parts) == 0 {
		return "external cluster"
	}
	return strings.Join(parts, ", ")
}

// ejections lists each routed policy's ejections per member, trial by
// trial, so that a healthy run that ejects shows at a glance; "" when no
// policy has a read pool's counts.
func (c *Comparison) ejections() string {
	var parts []string
	for _, p := range c.Policies {
		var trials []string
		for _, r := range c.Trials[p] {
			if r.EjectionsByMember == nil {
				continue
			}
			ms := make([]string, len(r.EjectionsByMember))
			for i, e := range r.EjectionsByMember {
				ms[i] = strconv.FormatUint(e, 10)
			}
			trials = append(trials, strings.Join(ms, "/"))
		}
		if len(trials) > 0 {
			parts = append(parts, p+" "+strings.Join(trials, " · "))
		}
	}
	return strings.Join(parts, "; ")
}

// paperRef names where a scenario is in the paper, if it is.
func paperRef(section string) string {
	if section == "" {
		return "not in the paper"
	}
	return "paper " + section
}
