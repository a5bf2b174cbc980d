package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// Result is one trial of one policy: the record written to results.json.
type Result struct {
	Scenario string `json:"scenario"`
	Variant  string `json:"variant"`
	Backend  string `json:"backend"`
	Policy   string `json:"policy"`
	Trial    int    `json:"trial"`
	Workers  int    `json:"workers"`

	ReadP50ms   float64 `json:"read_p50_ms"`
	ReadP90ms   float64 `json:"read_p90_ms"`
	ReadP99ms   float64 `json:"read_p99_ms"`
	ReadP999ms  float64 `json:"read_p999_ms"`
	WriteP50ms  float64 `json:"write_p50_ms"`
	WriteP90ms  float64 `json:"write_p90_ms"`
	WriteP99ms  float64 `json:"write_p99_ms"`
	WriteP999ms float64 `json:"write_p999_ms"`

	ThroughputOps float64 `json:"throughput_ops"`
	Reads         int64   `json:"reads"`
	Writes        int64   `json:"writes"`
	Errors        int64   `json:"errors"`
	// HedgedReads counts the extra copies of reads hedging sent, and
	// HedgesWon those whose answer came first.
	HedgedReads int64 `json:"hedged_reads,omitempty"`
	HedgesWon   int64 `json:"hedges_won,omitempty"`

	// Router side: operations the client sent to each member.
	ReadsByMember  []uint64 `json:"reads_by_member"`
	WritesByMember []uint64 `json:"writes_by_member"`
	// Server side: what each member counted itself (nil if unavailable).
	ServerReadsByMember  []uint64 `json:"server_reads_by_member,omitempty"`
	ServerWritesByMember []uint64 `json:"server_writes_by_member,omitempty"`
	// EjectionsByMember counts, per member, the router's ejections from
	// the read pool over the trial, warm-up included (each trial has a
	// client of its own; nil for clients without a router).
	EjectionsByMember []uint64 `json:"ejections_by_member,omitempty"`
	// Over the measured window only, per member: ejections, the share of
	// the window out of the read pool (sampled every 100 ms), and the
	// least_cost judge's verdicts; WindowS is the window's length in
	// seconds.
	WindowEjectionsByMember []uint64  `json:"window_ejections_by_member,omitempty"`
	OutOfPoolByMember       []float64 `json:"out_of_pool_by_member,omitempty"`
	VerdictsByMember        []uint64  `json:"verdicts_by_member,omitempty"`
	WindowS                 float64   `json:"window_s,omitempty"`

	// CPU seconds per second of measurement: the client process, and all
	// member processes (with their proxies) together.
	ClientCPU float64 `json:"client_cpu_cores"`
	ServerCPU float64 `json:"server_cpu_cores,omitempty"`
	// CPUMode is how the trial shared the host's CPU (CPUMode).
	CPUMode string `json:"cpu_mode,omitempty"`
	// Topology names the topology the trial ran on ("default",
	// "three-zones", a file's name; Options.TopologyName), "" for an
	// external cluster. With CPUMode it tells apart the records of the
	// dominance grid's layouts and CPU modes.
	Topology string `json:"topology,omitempty"`

	// Traffic is the bytes the test bed's proxies forwarded over the
	// measurement window, nil when unknown: a cluster not on the test bed,
	// or a member that could not tell (an etcd member paused at either end
	// of the window, its proxies frozen with it unless they run apart).
	Traffic *Traffic `json:"traffic,omitempty"`

	// Workload is the trial's workload, as its variant set it: --resume
	// takes a record only for the same one. Nil in records written
	// before it was kept.
	Workload *Workload `json:"workload,omitempty"`

	// CountersLate is set when the cluster's counters at the window's
	// start were read only after the window had closed (a starved
	// machine): the server-side counts, server CPU and traffic are then
	// left out rather than taken from what came after.
	CountersLate bool `json:"counters_late,omitempty"`
	// LeaderChanged is set when the servers' leader moved during the trial:
	// such a trial is not a steady-state measurement.
	LeaderChanged bool `json:"leader_changed,omitempty"`

	// Extra holds scenario-specific numbers (failover timings, the slow
	// member's share of reads, …).
	Extra map[string]float64 `json:"extra,omitempty"`

	// Series is the measured window second by second, from its opening
	// (the last second also takes what completed after the window's
	// nominal end, and is shorter when the duration is not whole
	// seconds); nil for simulated trials and records written before it
	// was kept.
	Series []SeriesPoint `json:"series,omitempty"`
}

// SeriesPoint is one second of a trial's measured window: the operations
// that completed in it, by class, that succeeded and that failed, and
// the P50 of those that succeeded (0 without any). An operation counts
// in the second it completed, if it started inside the window.
type SeriesPoint struct {
	Reads       int64   `json:"reads"`
	Writes      int64   `json:"writes"`
	ReadErrors  int64   `json:"read_errors"`
	WriteErrors int64   `json:"write_errors"`
	ReadP50ms   float64 `json:"read_p50_ms"`
	WriteP50ms  float64 `json:"write_p50_ms"`
}

// errorPause is how long a worker waits after a failed operation.
const errorPause = 10 * time.Millisecond

// writeEvent is one completed write, for timelines.
type writeEvent struct {
	at    time.Time // completion
	start time.Time
	ok    bool
}

// trialSpec is what runTrial needs beyond the workload.
type trialSpec struct {
	workload Workload
	trial    int
	// keys are the workload's keys (Options.KeyPrefix).
	keys keySpace
	// timeline records every write's outcome (failover).
	timeline bool
	// during runs once the measurement window opens (fault injection).
	during func(ctx context.Context, windowStart time.Time)
	// opTimeout bounds one operation. Default 5 s.
	opTimeout time.Duration
}

type trialOutput struct {
	res    Result
	events []writeEvent
}

type workerLog struct {
	reads, writes []time.Duration
	// readSecs and writeSecs are the seconds of the window each of reads
	// and writes completed in (seriesLog.second).
	readSecs, writeSecs []int32
	errors              int64
	events              []writeEvent
}

// seriesLog is a trial's per-second tally: the failures of each second of
// the window, counted by every worker at once; successes are kept with
// the workers' latencies (workerLog). Its size is the window's seconds,
// whatever the rate.
type seriesLog struct {
	start    time.Time // the window's opening
	failures []secondFailures
}

// secondFailures are the operations of one second that failed, by class.
type secondFailures struct{ reads, writes atomic.Int64 }

func newSeriesLog(start time.Time, window time.Duration) *seriesLog {
	n := max(1, int((window+time.Second-1)/time.Second))
	return &seriesLog{start: start, failures: make([]secondFailures, n)}
}

// second is the second of the window an operation that completed at t
// counts in: the last one takes what completed after the nominal end.
func (s *seriesLog) second(t time.Time) int32 {
	return int32(min(max(int(t.Sub(s.start)/time.Second), 0), len(s.failures)-1))
}

func (s *seriesLog) failed(t time.Time, isRead bool) {
	f := &s.failures[s.second(t)]
	if isRead {
		f.reads.Add(1)
	} else {
		f.writes.Add(1)
	}
}

// points is the series of the workers' logs.
func (s *seriesLog) points(logs []workerLog) []SeriesPoint {
	reads := make([][]time.Duration, len(s.failures))
	writes := make([][]time.Duration, len(s.failures))
	for _, lg := range logs {
		for i, d := range lg.reads {
			reads[lg.readSecs[i]] = append(reads[lg.readSecs[i]], d)
		}
		for i, d := range lg.writes {
			writes[lg.writeSecs[i]] = append(writes[lg.writeSecs[i]], d)
		}
	}
	out := make([]SeriesPoint, len(s.failures))
	for k := range out {
		slices.Sort(reads[k])
		slices.Sort(writes[k])
		out[k] = SeriesPoint{Reads: int64(len(reads[k])), Writes: int64(len(writes[k])),
			ReadErrors: s.failures[k].reads.Load(), WriteErrors: s.failures[k].writes.Load(),
			ReadP50ms: ms(percentile(reads[k], 50)), WriteP50ms: ms(percentile(writes[k], 50))}
	}
	return out
}

// runTrial drives cli for warm-up + duration and measures the window after
// the warm-up.
func runTrial(ctx context.Context, cl Cluster, cli Client, spec trialSpec) (trialOutput, error) {
	w := spec.workload
	if spec.opTimeout == 0 {
		spec.opTimeout = 5 * time.Second
	}
	leaderBefore, _ := cl.Leader(ctx)
	start := time.Now()
	windowStart := start.Add(w.Warmup)
	end := windowStart.Add(w.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	series := newSeriesLog(windowStart, w.Duration)

	value := make([]byte, w.ValueSize)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}
	logs := make([]workerLog, w.Workers)
	var wg sync.WaitGroup
	for wk := range w.Workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(w.Seed, uint64(spec.trial)<<32|uint64(wk)))
			lg := &logs[wk]
			runCtx := withWorker(runCtx, wk)
			var interval time.Duration
			next := time.Now()
			if w.Rate > 0 {
				interval = time.Duration(float64(w.Workers) / w.Rate * float64(time.Second))
				// Spread the workers' schedules over one interval.
				next = next.Add(time.Duration(wk) * interval / time.Duration(w.Workers))
			}
			for runCtx.Err() == nil {
				if interval > 0 {
					select {
					case <-time.After(time.Until(next)):
					case <-runCtx.Done():
					}
					if runCtx.Err() != nil {
						break
					}
					next = maxTime(next.Add(interval), time.Now())
				}
				k := rnd.IntN(w.Keys - w.RangeSize + 1)
				isRead := rnd.Float64() < w.ReadRatio
				opCtx, opCancel := context.WithTimeout(runCtx, spec.opTimeout)
				t0 := time.Now()
				var err error
				if isRead {
					end := ""
					if w.RangeSize > 1 {
						end = spec.keys.key(k + w.RangeSize)
					}
					err = cli.Read(opCtx, spec.keys.key(k), end)
				} else {
					err = cli.Write(opCtx, spec.keys.key(k), value)
				}
				t1 := time.Now()
				opCancel()
				if runCtx.Err() != nil && err != nil {
					break // cut off by the end of the trial, not a failure
				}
				if spec.timeline && !isRead && !t1.Before(windowStart) {
					lg.events = append(lg.events, writeEvent{at: t1, start: t0, ok: err == nil})
				}
				if err != nil {
					// Pace after a failure: retrying an instant refusal at once
					// would only measure how fast the client can fail.
					select {
					case <-time.After(errorPause):
					case <-runCtx.Done():
					}
				}
				if t0.Before(windowStart) {
					continue
				}
				switch {
				case err != nil:
					lg.errors++
					series.failed(t1, isRead)
				case isRead:
					lg.reads = append(lg.reads, t1.Sub(t0))
					lg.readSecs = append(lg.readSecs, series.second(t1))
				default:
					lg.writes = append(lg.writes, t1.Sub(t0))
					lg.writeSecs = append(lg.writeSecs, series.second(t1))
				}
			}
		})
	}

	// Open the window: snapshot counters.
	select {
	case <-time.After(time.Until(windowStart)):
	case <-ctx.Done():
	}
	before := readCounters(ctx, cl, cli)
	// Counters read after the window closed count nothing of it: the
	// members' counts are left out rather than taken from what came after.
	late := time.Now().After(end)
	var faultWG sync.WaitGroup
	if spec.during != nil {
		faultWG.Go(func() { spec.during(runCtx, windowStart) })
	}
	pool := samplePool(runCtx, cli)
	wg.Wait()
	faultWG.Wait()
	outOfPool := pool()
	elapsed := time.Since(windowStart)
	if ctx.Err() != nil {
		return trialOutput{}, ctx.Err()
	}
	after := readCounters(ctx, cl, cli)
	statsBefore, statsAfter := before.stats, after.stats
	leaderAfter, _ := cl.Leader(ctx)

	var reads, writes []time.Duration
	var out trialOutput
	r := &out.res
	r.Series = series.points(logs)
	for _, lg := range logs {
		reads = append(reads, lg.reads...)
		writes = append(writes, lg.writes...)
		r.Errors += lg.errors
		out.events = append(out.events, lg.events...)
	}
	slices.SortFunc(out.events, func(a, b writeEvent) int { return a.at.Compare(b.at) })
	r.Workers = w.Workers
	r.Workload = &w
	r.setLatencies(reads, writes)
	r.ThroughputOps = float64(len(reads)+len(writes)) / elapsed.Seconds()
	for i := range statsAfter.Members {
		a, b := statsAfter.Members[i], statsBefore.Members[i]
		r.ReadsByMember = append(r.ReadsByMember, a.Reads()-b.Reads())
		r.WritesByMember = append(r.WritesByMember, a.Ops[0]-b.Ops[0])
		r.EjectionsByMember = append(r.EjectionsByMember, a.Ejections) // a fresh client per trial: warm-up included
		r.WindowEjectionsByMember = append(r.WindowEjectionsByMember, a.Ejections-b.Ejections)
		r.VerdictsByMember = append(r.VerdictsByMember, a.ReadCost.Verdicts-b.ReadCost.Verdicts)
	}
	r.OutOfPoolByMember = outOfPool
	r.WindowS = elapsed.Seconds()
	if before.served != nil && after.served != nil && !late {
		for i := range after.served {
			r.ServerReadsByMember = append(r.ServerReadsByMember, after.served[i].Reads-before.served[i].Reads)
			// The workload's transactions are writes.
			r.ServerWritesByMember = append(r.ServerWritesByMember, after.served[i].Writes+after.served[i].Txns-before.served[i].Writes-before.served[i].Txns)
		}
	}
	r.HedgedReads = int64(statsAfter.Hedges.Sent - statsBefore.Hedges.Sent)
	r.HedgesWon = int64(statsAfter.Hedges.Won - statsBefore.Hedges.Won)
	r.ClientCPU = (after.cpu - before.cpu).Seconds() / elapsed.Seconds()
	if !late {
		r.ServerCPU = (after.serverCPU - before.serverCPU).Seconds() / elapsed.Seconds()
	}
	if before.trafficErr == nil && after.trafficErr == nil && !late {
		t := after.traffic.Since(before.traffic)
		r.Traffic = &t
	}
	if before.extra != nil && after.extra != nil && !late {
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		for name, v := range after.extra {
			if v0, ok := before.extra[name]; ok {
				r.Extra[name] = v - v0
			}
		}
	}
	r.CountersLate = late
	r.LeaderChanged = leaderBefore != leaderAfter || statsAfter.LeaderChanges != statsBefore.LeaderChanges
	return out, nil
}

// counters is what a trial reads at each end of its window.
type counters struct {
	stats      router.Stats
	served     []Served // nil when a member could not be read
	cpu        time.Duration
	serverCPU  time.Duration
	traffic    testbed.TrafficCounts
	trafficErr error
	extra      map[string]float64 // a CountingClient's counts
}

// readCounters reads the client's counters and the cluster's at once: read
// one after another on a loaded machine, the cluster's took longer than a
// short window.
func readCounters(ctx context.Context, cl Cluster, cli Client) counters {
	var c counters
	var wg sync.WaitGroup
	wg.Go(func() { c.served, _ = cl.Served(ctx) })
	wg.Go(func() { c.serverCPU = sum(cl.ServerCPU()) })
	wg.Go(func() { c.traffic, c.trafficErr = cl.Traffic() })
	if cc, ok := cli.(CountingClient); ok {
		wg.Go(func() { c.extra = cc.Counters(ctx) })
	}
	c.stats, c.cpu = cli.Stats(), testutil.ProcessCPU()
	wg.Wait()
	return c
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// setLatencies sorts reads and writes and sets r's counts and
// percentiles from them.
func (r *Result) setLatencies(reads, writes []time.Duration) {
	slices.Sort(reads)
	slices.Sort(writes)
	r.Reads, r.Writes = int64(len(reads)), int64(len(writes))
	r.ReadP50ms, r.ReadP90ms, r.ReadP99ms, r.ReadP999ms = ms(percentile(reads, 50)), ms(percentile(reads, 90)), ms(percentile(reads, 99)), ms(percentile(reads, 99.9))
	r.WriteP50ms, r.WriteP90ms, r.WriteP99ms, r.WriteP999ms = ms(percentile(writes, 50)), ms(percentile(writes, 90)), ms(percentile(writes, 99)), ms(percentile(writes, 99.9))
}

// percentile returns the p-th percentile of sorted samples by the
// nearest-rank method (exact: every sample is kept), 0 when empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func sum[T time.Duration | float64](v []T) T {
	var s T
	for _, x := range v {
		s += x
	}
	return s
}

// preload writes every key of the key space once, so reads find values of
// the workload's size.
func preload(ctx context.Context, cli Client, w Workload, keys keySpace) error {
	value := make([]byte, w.ValueSize)
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range min(16, w.Keys) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= w.Keys || ctx.Err() != nil {
					return
				}
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := cli.Write(wctx, keys.key(i), value)
				cancel()
				if err != nil {
					firstErr.CompareAndSwap(nil, fmt.Errorf("bench: preload %s: %w", keys.key(i), err))
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return ctx.Err()
}

// samplePool samples, every 100 ms until ctx ends, which members the
// client's router keeps out of its read pool; the returned func waits for
// the end and gives each member's share of the samples out (nil without a
// router or a sample).
func samplePool(ctx context.Context, cli Client) func() []float64 {
	var out []int
	samples := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			members := cli.Stats().Members
			if len(members) == 0 {
				continue
			}
			if out == nil {
				out = make([]int, len(members))
			}
			for i, m := range members {
				if i < len(out) && m.Ejected {
					out[i]++
				}
			}
			samples++
		}
	}()
	return func() []float64 {
		<-done
		if samples == 0 {
			return nil
		}
		shares := make([]float64, len(out))
		for i, n := range out {
			shares[i] = float64(n) / float64(samples)
		}
		return shares
	}
}
