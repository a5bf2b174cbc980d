package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// Scenario names.
const (
	ScenarioQuick      = "quick"
	ScenarioHealthy    = "healthy"
	ScenarioOverhead   = "overhead"
	ScenarioDegraded   = "degraded"
	ScenarioFiveNode   = "five-node"
	ScenarioLoadSweep  = "load-sweep"
	ScenarioReadSize   = "read-size"
	ScenarioFailover   = "failover"
	ScenarioZKHealthy  = "zk-healthy"
	ScenarioZKDegraded = "zk-degraded"
	ScenarioTail       = "tail"
	ScenarioZKTail     = "zk-tail"
	ScenarioUneven     = "uneven"
	ScenarioKubernetes = "kubernetes"
	ScenarioAll        = "all"
	// ScenarioDominance and ScenarioZKDominance are the grid that decides
	// the default policy; they are long and not part of ScenarioAll.
	ScenarioDominance   = "dominance"
	ScenarioZKDominance = "zk-dominance"
	// ScenarioSoak measures the read pool's false ejections on a healthy
	// cluster at load, hybrid's rule against least_cost's; long, and not
	// part of ScenarioAll.
	ScenarioSoak = "soak"
)

// Soak is the soak scenario's load and length: 32 closed-loop workers,
// 80/20, three trials of 10 minutes per policy (half an hour each).
const (
	SoakWorkers  = 32
	SoakDuration = 10 * time.Minute
)

// KubernetesWorkers is the kubernetes scenario's concurrency: the paper's
// for Table VII (64 concurrent clients of kube-apiserver).
const KubernetesWorkers = 64

// Scenarios lists the scenario names in the order "all" runs them.
func Scenarios() []string {
	return []string{ScenarioHealthy, ScenarioOverhead, ScenarioDegraded, ScenarioFiveNode, ScenarioLoadSweep, ScenarioReadSize, ScenarioFailover, ScenarioZKHealthy, ScenarioZKDegraded, ScenarioTail, ScenarioZKTail, ScenarioUneven, ScenarioKubernetes}
}

// ErrUnknownScenario is returned for a name not in Scenarios().
var ErrUnknownScenario = errors.New("bench: unknown scenario")

// ErrNeedsTestbed is returned when a scenario needs fault injection or the
// test bed's knowledge and the cluster is external.
var ErrNeedsTestbed = errors.New("bench: needs the test bed (not available with --endpoints)")

type variant struct {
	label  string
	fields []string // workload fields it sets, by flag name
	apply  func(*Workload)
}

type scenarioDef struct {
	name, section, desc string
	nodes               int // 0: the runner's default (3)
	fixedNodes          bool
	policies            []string
	baseline            string
	variants            []variant
	metrics             func(nodes int) []Metric
	// faults marks scenarios that need the test bed.
	faults bool
	// prepare and cleanup bracket the scenario's trials.
	prepare, cleanup func(ctx context.Context, cl Cluster) error
	// failover marks the leader-kill scenario.
	failover bool
	notes    []string
	// backend, when set, is the backend the scenario runs on whatever
	// --backend says ("zk" for the ZooKeeper tables).
	backend string
	// trials, when set, replaces the default trial count (not --trials):
	// a comparison that must resolve 2 % needs more pairs.
	trials int
	// duration, when set, replaces the default measured time per trial
	// (not --duration).
	duration time.Duration
	// memberCPUs, when set, runs the scenario on a cluster of its own
	// whose members have these CPU budgets (etcd; --member-cpu replaces
	// them), stopped when the scenario ends.
	memberCPUs []float64
	// dominance marks the grid that decides the default policy: its
	// tables end with the dominance summary (DominanceMarkdown), and
	// cmd/routebench runs it on every layout and CPU mode (SpansGrid).
	dominance bool
}

func mix(ratio float64) variant {
	return variant{fmt.Sprintf("%.0f/%.0f", 100*ratio, 100*(1-ratio)), []string{"read-ratio"}, func(w *Workload) { w.ReadRatio = ratio }}
}

func standardMetrics(leader int) func(int) []Metric {
	return func(int) []Metric {
		return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, MemberWriteShare(leader), ClientCPU, ServerCPU, CrossZoneBytesPerOp, ClientCrossZoneBytesPerOp, PeerCrossZoneBytesPerOp}
	}
}

// layout is where a scenario's roles sit on the topology in effect.
type layout struct {
	leader int // the member the test bed moves leadership to
	// sameZoneFollower is the follower in the client's zone (the one the
	// degraded and tail scenarios slow), or the leader's successor if no
	// follower shares the client's zone.
	sameZoneFollower int
}

// layoutOf reads the roles off topo (nil: the default topology).
func layoutOf(topo *testbed.Topology) layout {
	t := testbed.DefaultTopology(3)
	if topo != nil {
		t = *topo
	}
	l := layout{leader: max(t.Leader, 0), sameZoneFollower: -1}
	for i, z := range t.Zones {
		if i != l.leader && z == t.ClientZone {
			l.sameZoneFollower = i
			break
		}
	}
	if l.sameZoneFollower < 0 {
		l.sameZoneFollower = (l.leader + 1) % len(t.Zones)
	}
	return l
}

// degrade returns a scenario step that sets member i's extra delay.
func degrade(i int, delay, jitter time.Duration) func(context.Context, Cluster) error {
	return func(_ context.Context, cl Cluster) error {
		cl.Faults().Degrade(i, delay, jitter)
		return nil
	}
}

func scenarioDefs(l layout) map[string]scenarioDef {
	degradedMember := l.sameZoneFollower
	defs := []scenarioDef{
		{
			name: ScenarioQuick, section: "IV-C", desc: "healthy 3-node cluster, 80/20: round_robin vs hybrid (and boltzmann)",
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid, router.Boltzmann}, baseline: Stock,
			variants: []variant{mix(0.8)}, metrics: standardMetrics(l.leader),
		},
		{
			name: ScenarioHealthy, section: "IV-C, Table II", desc: "healthy 3-node cluster, 80/20 and 50/50, with the oracle floor and hybrid's variants",
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid, router.Boltzmann, Oracle, HybridP2C, HybridHedge}, baseline: Stock,
			variants: []variant{mix(0.8), mix(0.5)},
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, MemberWriteShare(l.leader), ExtraReads, ClientCPU, ServerCPU, CrossZoneBytesPerOp, ClientCrossZoneBytesPerOp, PeerCrossZoneBytesPerOp}
			},
		},
		{
			name: ScenarioOverhead, trials: 6, desc: "the drop-in's cost: stock clientv3 vs round_robin (the same rotation) below saturation, paced",
			policies: []string{Stock, router.RoundRobin, Pinned, router.Hybrid}, baseline: Stock,
			variants: []variant{paced(400, 1), paced(400, 3)},
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, ClientCPUPerOp, ServerCPUPerOp, ClientCPU, ServerCPU, CrossZoneBytesPerOp}
			},
			notes: []string{"Paced at a fixed rate well below saturation (about 40 % of what 8 closed-loop workers reach), so latencies are service times, not CPU queueing; stock clientv3 has one connection per member whatever the variant says."},
		},
		{
			name: ScenarioDegraded, section: "IV-G, Table III", desc: fmt.Sprintf("+8 ms ± 2 ms on every link of the same-zone follower m%d", degradedMember),
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid, router.Boltzmann}, baseline: Stock,
			variants: []variant{mix(0.8)}, faults: true,
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, MemberReadShare(degradedMember), MemberWriteShare(l.leader), ClientCPU, ServerCPU, CrossZoneBytesPerOp}
			},
			prepare: degrade(degradedMember, 8*time.Millisecond, 2*time.Millisecond),
			cleanup: degrade(degradedMember, 0, 0),
		},
		{
			name: ScenarioFiveNode, section: "IV-H, Table IV", desc: "5 members in 3 zones, 80/20",
			nodes: 5, fixedNodes: true,
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid}, baseline: Stock,
			variants: []variant{mix(0.8)}, metrics: standardMetrics(l.leader),
		},
		{
			name: ScenarioLoadSweep, section: "IV-I, Figure 6", desc: "5 members, 80/20, 128/256/512 workers",
			nodes: 5, fixedNodes: true,
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid}, baseline: Stock,
			variants: []variant{workers(128), workers(256), workers(512)}, metrics: standardMetrics(l.leader),
			notes: []string{"Two cores host the client, the proxies and five members: these worker counts saturate them, so the sweep shows behaviour under overload."},
		},
		{
			name: ScenarioReadSize, section: "IV-E, Figure 4", desc: "100% reads: leader_only vs distributed (hybrid) over value and range sizes",
			policies: []string{Stock, Pinned, router.LeaderOnly, router.Hybrid}, baseline: Stock,
			variants: append(valueSizes(256, 1024, 4096, 16384, 65536), ranges(10, 100, 500)...),
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, Throughput, Errors, MemberReadShare(0), ClientCPU, ServerCPU, CrossZoneBytesPerOp, ClientCrossZoneBytesPerOp, PeerCrossZoneBytesPerOp}
			},
		},
		{
			name: ScenarioFailover, section: "IV-F", desc: "the leader is killed (SIGKILL) a third into the run",
			policies: []string{Stock, Pinned, router.RoundRobin, router.Hybrid, StaticLeader}, baseline: Stock,
			variants: []variant{mix(0.8)}, faults: true, failover: true,
			metrics: func(int) []Metric {
				return []Metric{
					ExtraMetric("Election (s, kill → new leader)", "election_s", 2),
					ExtraMetric("Recovery (s, new leader → writes succeed)", "recovery_s", 2),
					ExtraMetric("Longest write gap (s)", "write_gap_s", 2),
					ExtraMetric("Write errors after the kill", "inflight_errors", 0),
					WriteP50, WriteP99, Throughput, Errors,
				}
			},
		},
		{
			name: ScenarioZKHealthy, section: "IV-J, Table V", desc: "ZooKeeper 3-node ensemble, 80/20: round_robin, boltzmann, hybrid",
			backend:  "zk",
			policies: []string{router.RoundRobin, router.Boltzmann, router.Hybrid}, baseline: router.RoundRobin,
			variants: []variant{mix(0.8)}, metrics: standardMetrics(l.leader),
			notes: []string{"A linearizable read is sync() then the read, two client round trips on the same session; server-side read counts include the syncs."},
		},
		{
			name: ScenarioZKDegraded, section: "IV-J, Table VI", desc: "ZooKeeper: sticky session on the same-zone follower z1, which gets +8 ms ± 2 ms on every link, vs hybrid",
			backend:  "zk",
			policies: []string{router.Sticky, router.Hybrid}, baseline: router.Sticky,
			variants: []variant{mix(0.8)}, faults: true,
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, MemberReadShare(degradedMember), MemberWriteShare(l.leader), ClientCPU, ServerCPU, CrossZoneBytesPerOp}
			},
			prepare: degrade(degradedMember, 8*time.Millisecond, 2*time.Millisecond),
			cleanup: degrade(degradedMember, 0, 0),
			notes:   []string{"sticky is the stock ZooKeeper client's shape: one session on one server (pinned to the same-zone follower, as in the paper), writes forwarded from there."},
		},
		{
			name: ScenarioSoak, desc: fmt.Sprintf("false ejections on a healthy cluster at load: %d workers, 80/20, hybrid vs least_cost, 3 trials of %v each (about an hour)", SoakWorkers, SoakDuration),
			policies: []string{router.Hybrid, router.LeastCost}, baseline: router.Hybrid,
			variants: []variant{{fmt.Sprintf("%d workers, 80/20", SoakWorkers), []string{"workers", "read-ratio"}, func(w *Workload) { w.Workers, w.ReadRatio = SoakWorkers, 0.8 }}},
			duration: SoakDuration,
			metrics: func(int) []Metric {
				return []Metric{EjectionsPerMemberHour, OutOfPoolPct, VerdictsPerMemberHour, ReadP50, ReadP99, WriteP50, Throughput, Errors, ClientCPU, ServerCPU}
			},
			notes: []string{fmt.Sprintf("Each trial measures %v after its warm-up (--duration replaces it). Every member is healthy: each ejection is a false one. Out of pool is sampled every 100 ms over the measured window; verdicts are least_cost's baseline judge's (it ejects on them). Run it on both layouts (--topology three-zones) and backends (--backend zk).", SoakDuration)},
		},
		tailScenario(ScenarioTail, "", degradedMember),
		tailScenario(ScenarioZKTail, "zk", degradedMember),
		{
			name: ScenarioUneven, desc: "members of unequal capacity (CPU quotas 0.6 / 0.2 / 0.6 cores): hybrid vs hybrid+p2c",
			backend: "etcd", memberCPUs: []float64{0.6, 0.2, 0.6},
			policies: []string{router.Hybrid, HybridP2C, router.Boltzmann, router.RoundRobin}, baseline: router.Hybrid,
			variants: []variant{mix(0.8)},
			metrics: func(int) []Metric {
				return []Metric{ReadP50, ReadP99, WriteP50, WriteP99, Throughput, Errors, MemberReadShare(degradedMember), ClientCPU, ServerCPU, CrossZoneBytesPerOp}
			},
			notes: []string{"Each member is confined to its quota through a cgroup; m1, the same-zone follower, has a third of the others' capacity."},
		},
		{
			name: ScenarioKubernetes, section: "IV-K, Table VII", desc: fmt.Sprintf("Table VII's mixes at %d workers: stock vs pinned vs hybrid on the KV API (integrations/kubernetes/cmd/storagebench runs them through k8s.io/apiserver's etcd3 store)", KubernetesWorkers),
			backend:  "etcd",
			policies: []string{Stock, Pinned, router.Hybrid}, baseline: Stock,
			variants: []variant{kubeMix(0.8), kubeMix(0.2)},
			metrics: func(int) []Metric {
				return []Metric{WriteP50, WriteP99, ReadP50, ReadP99, Throughput, Errors, MemberWriteShare(l.leader), ClientCPU, ServerCPU, CrossZoneBytesPerOp}
			},
			notes: []string{fmt.Sprintf("%d closed-loop workers on two shared cores: far past saturation, so latencies are mostly queueing.", KubernetesWorkers)},
		},
		{
			name: ScenarioDominance, desc: "the grid that decides the default: 8 policies, least_cost among them, at 8/32/128 workers × 80/20, 50/50, 100 % reads, 100-key ranges; one command runs it on both layouts × both CPU modes (about 4.2 h)",
			policies: []string{Stock, Pinned, router.RoundRobin, router.LeaderOnly, router.Boltzmann, router.Hybrid, HybridP2C, router.LeastCost}, baseline: Stock,
			variants: dominanceGrid(dominanceWorkers, dominanceMixes), metrics: dominanceMetrics, dominance: true,
			notes: []string{"A cell of the dominance grid; the summary after the grid's tables compares least_cost and hybrid with the best of the others."},
		},
		{
			name: ScenarioZKDominance, desc: "ZooKeeper's part of the dominance grid: 7 policies at 8/32 workers, 80/20 (about 40 min over the grid)",
			backend:  "zk",
			policies: []string{router.RoundRobin, router.Sticky, router.LeaderOnly, router.Boltzmann, router.Hybrid, HybridP2C, router.LeastCost}, baseline: router.RoundRobin,
			variants: dominanceGrid([]int{8, 32}, dominanceMixes[:1]), metrics: dominanceMetrics, dominance: true,
			notes: []string{"A cell of the dominance grid; the summary after the grid's tables compares least_cost and hybrid with the best of the others. A linearizable read is sync() then the read."},
		},
	}
	out := map[string]scenarioDef{}
	for _, d := range defs {
		out[d.name] = d
	}
	return out
}

// Stalls of the tail scenarios: freezes of 100–300 ms with 0.3–0.9 s
// between them, about 1.2 a second, a quarter of the time frozen.
const (
	stallMin, stallMax = 100 * time.Millisecond, 300 * time.Millisecond
	gapMin, gapMax     = 300 * time.Millisecond, 900 * time.Millisecond
)

// tailScenario is the same-zone follower stalling intermittently (SIGSTOP,
// an etcd member's proxies frozen with it unless they run apart), fast
// between stalls, as a JVM in GC pauses
// or a member compacting: on backend ("": --backend).
func tailScenario(name, backend string, degradedMember int) scenarioDef {
	st := &staller{member: degradedMember}
	desc := fmt.Sprintf("the same-zone follower m%d freezes (SIGSTOP) for 100–300 ms every 0.3–0.9 s: hybrid, hybrid+hedge, round_robin", degradedMember)
	if backend == "zk" {
		desc = "ZooKeeper: " + desc
	}
	return scenarioDef{
		name: name, desc: desc, backend: backend, trials: 5,
		policies: []string{router.Hybrid, HybridHedge, router.RoundRobin}, baseline: router.Hybrid,
		variants: []variant{mix(0.8)}, faults: true,
		metrics: func(int) []Metric {
			return []Metric{ReadP50, ReadP99, ReadP999, WriteP50, WriteP99, Throughput, Errors, ExtraReads, MemberReadShare(degradedMember), ClientCPU, ServerCPU, CrossZoneBytesPerOp}
		},
		prepare: st.start, cleanup: st.stop,
		notes: []string{"The stalls run through every trial, warm-up included; 5 trials per policy, so that P99.9 rests on ~60 000 reads."},
	}
}

// staller freezes one member intermittently while it runs.
type staller struct {
	member int
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *staller) start(ctx context.Context, cl Cluster) error {
	f := cl.Faults()
	ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.done = make(chan struct{})
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rnd.Int64N(int64(hi-lo))) }
	go func() {
		defer close(s.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(between(gapMin, gapMax)):
			}
			if f.Pause(s.member) != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(between(stallMin, stallMax)):
			}
			if f.Resume(s.member) != nil {
				return
			}
		}
	}()
	return nil
}

func (s *staller) stop(context.Context, Cluster) error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	<-s.done
	return nil
}

// paced runs the paper's 80/20 mix at rate operations per second in all,
// with conns connections per member.
func paced(rate float64, conns int) variant {
	return variant{fmt.Sprintf("%.0f ops/s, %d conn/member", rate, conns), []string{"rate", "conns", "read-ratio"}, func(w *Workload) {
		w.Rate, w.ConnsPerMember, w.ReadRatio = rate, conns, 0.8
	}}
}

// kubeMix is Table VII's mix at its concurrency.
func kubeMix(ratio float64) variant {
	v := mix(ratio)
	v.label = fmt.Sprintf("%s, %d workers", v.label, KubernetesWorkers)
	v.fields = append(v.fields, "workers")
	inner := v.apply
	v.apply = func(w *Workload) { inner(w); w.Workers = KubernetesWorkers }
	return v
}

// The dominance grid's worker counts and mixes.
var (
	dominanceWorkers = []int{8, 32, 128}
	dominanceMixes   = []dominanceMix{
		{"80/20", 0.8, 256, 1},
		{"50/50", 0.5, 256, 1},
		{"100/0", 1, 256, 1},
		{"100/0, ranges of 100 keys", 1, 256, 100},
	}
)

// dominanceMix is a mix of the dominance grid: the share of linearizable
// reads, the values' size and the keys a read returns.
type dominanceMix struct {
	label     string
	readRatio float64
	valueSize int
	rangeSize int
}

// dominanceGrid is every worker count at every mix, each variant setting
// all four fields (so that a flag the user sets for any of them runs one
// cell, as given).
func dominanceGrid(workerCounts []int, mixes []dominanceMix) []variant {
	var vs []variant
	for _, n := range workerCounts {
		for _, m := range mixes {
			vs = append(vs, variant{fmt.Sprintf("%d workers, %s", n, m.label), []string{"workers", "read-ratio", "value-size", "range-size"}, func(w *Workload) {
				w.Workers, w.ReadRatio, w.ValueSize, w.RangeSize = n, m.readRatio, m.valueSize, m.rangeSize
			}})
		}
	}
	return vs
}

// dominanceMetrics are the dominance grid's rows; write latencies read –
// in a cell without writes.
func dominanceMetrics(int) []Metric {
	return []Metric{ReadP50, ReadP99, whenWrites(WriteP50), whenWrites(WriteP99), Throughput, Errors, ClientCPU, ServerCPU, CrossZoneBytesPerOp, ClientCrossZoneBytesPerOp, PeerCrossZoneBytesPerOp}
}

// whenWrites is m, undefined (–) for a trial that wrote nothing: a 100 %
// read mix has no write latency, not one of 0 ms.
func whenWrites(m Metric) Metric { return definedWhen(m, func(r Result) bool { return r.Writes > 0 }) }

// definedWhen is m, undefined (NaN) for a trial that has not.
func definedWhen(m Metric, has func(Result) bool) Metric {
	get := m.Get
	m.Get = func(r Result) float64 {
		if !has(r) {
			return math.NaN()
		}
		return get(r)
	}
	return m
}

// SpansGrid reports whether scenario is part of the dominance grid, which
// cmd/routebench runs on every layout (the default topology, three zones)
// and CPU mode (budgets, shared cores) unless --topology or --member-cpu
// picks one.
func SpansGrid(scenario string) bool {
	return scenarioDefs(layoutOf(nil))[scenario].dominance
}

func workers(n int) variant {
	return variant{fmt.Sprintf("%d workers", n), []string{"workers"}, func(w *Workload) { w.Workers = n }}
}

func valueSizes(sizes ...int) []variant {
	var vs []variant
	for _, s := range sizes {
		vs = append(vs, variant{"value " + byteSize(s), []string{"value-size", "range-size", "read-ratio"}, func(w *Workload) {
			w.ValueSize, w.RangeSize, w.ReadRatio = s, 1, 1
		}})
	}
	return vs
}

func ranges(keys ...int) []variant {
	var vs []variant
	for _, k := range keys {
		vs = append(vs, variant{fmt.Sprintf("range %d keys (~%s)", k, byteSize(k*256)), []string{"value-size", "range-size", "read-ratio"}, func(w *Workload) {
			w.ValueSize, w.RangeSize, w.ReadRatio = 256, k, 1
		}})
	}
	return vs
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1024:
		if n%1024 == 0 {
			return fmt.Sprintf("%d KiB", n>>10)
		}
		return fmt.Sprintf("%.0f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%d B", n)
}

// failoverTimes derives the failover numbers from a write timeline.
func failoverTimes(events []writeEvent, kill, newLeader time.Time, endOfRun time.Time) map[string]float64 {
	// A time that never came (no new leader, no recovery) stays absent:
	// tables show "–", and JSON cannot hold NaN.
	extra := map[string]float64{}
	if !newLeader.IsZero() {
		extra["election_s"] = newLeader.Sub(kill).Seconds()
		for _, e := range events {
			if e.ok && !e.start.Before(newLeader) {
				extra["recovery_s"] = e.at.Sub(newLeader).Seconds()
				break
			}
		}
	}
	var last time.Time
	gap := 0.0
	errs := 0
	for _, e := range events {
		if e.at.Before(kill) {
			if e.ok {
				last = e.at
			}
			continue
		}
		if !e.ok {
			errs++
			continue
		}
		if !last.IsZero() {
			gap = max(gap, e.at.Sub(last).Seconds())
		}
		last = e.at
	}
	if !last.IsZero() {
		gap = max(gap, endOfRun.Sub(last).Seconds())
	}
	extra["write_gap_s"] = gap
	extra["inflight_errors"] = float64(errs)
	return extra
}

// Describe lists the scenarios for --help.
func Describe() string {
	defs := scenarioDefs(layoutOf(nil))
	var b strings.Builder
	for _, n := range append([]string{ScenarioQuick}, Scenarios()...) {
		d := defs[n]
		fmt.Fprintf(&b, "  %-12s %s (%s)\n", n, d.desc, paperRef(d.section))
	}
	fmt.Fprintf(&b, "  %-12s every scenario above but quick\n", ScenarioAll)
	for _, n := range []string{ScenarioDominance, ScenarioZKDominance, ScenarioSoak} {
		fmt.Fprintf(&b, "  %-12s %s (not in all)\n", n, defs[n].desc)
	}
	fmt.Fprintf(&b, "  %-12s what a fleet of clients costs the cluster (probes, members' CPU) and its failover; alone\n", ScenarioFleet)
	fmt.Fprintf(&b, "  %-12s CPU per operation by class (writes at the leader and through a follower, reads at each, per KiB served) and component (leader, followers, proxies); alone, test bed only\n", ScenarioCosts)
	return b.String()
}

func expand(names []string) ([]string, error) {
	defs := scenarioDefs(layoutOf(nil))
	var out []string
	for _, n := range names {
		if n == ScenarioAll {
			out = append(out, Scenarios()...)
			continue
		}
		if _, ok := defs[n]; !ok {
			return nil, fmt.Errorf("%w: %q (want %s, %s, %s, %s, %s or %s)", ErrUnknownScenario, n, ScenarioQuick, strings.Join(Scenarios(), ", "), ScenarioDominance, ScenarioZKDominance, ScenarioSoak, ScenarioAll)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
