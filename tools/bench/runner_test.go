package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestFailoverTimes(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	kill, newLeader, end := at(1000), at(2500), at(6000)
	events := []writeEvent{
		{start: at(900), at: at(950), ok: true},    // last success before the kill
		{start: at(990), at: at(1200), ok: false},  // in flight at the kill
		{start: at(1300), at: at(2600), ok: true},  // blocked through the election
		{start: at(2600), at: at(2900), ok: true},  // first write started after the new leader
		{start: at(2950), at: at(3000), ok: false}, // a late error
		{start: at(3000), at: at(3100), ok: true},
	}
	got := failoverTimes(events, kill, newLeader, end)
	want := map[string]float64{"election_s": 1.5, "recovery_s": 0.4, "write_gap_s": 2.9, "inflight_errors": 2}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	noLeader := failoverTimes(events, kill, time.Time{}, end)
	if _, ok := noLeader["election_s"]; ok {
		t.Errorf("without a new leader: %v", noLeader)
	}
	if _, ok := noLeader["recovery_s"]; ok {
		t.Errorf("without a new leader: %v", noLeader)
	}
	if !math.IsNaN(ExtraMetric("", "recovery_s", 2).Get(Result{Extra: noLeader})) {
		t.Error("a missing time should read as NaN (shown as –)")
	}
}

// TestFilesSurviveUndefinedNumbers: a failover that never recovers must
// not break results.json.
func TestFilesSurviveUndefinedNumbers(t *testing.T) {
	c := &Comparison{Scenario: ScenarioFailover, Baseline: "a", Policies: []string{"a", "b"},
		Metrics: []Metric{ExtraMetric("Recovery", "recovery_s", 2)},
		Trials: map[string][]Result{
			"a": {{Policy: "a", Extra: map[string]float64{"recovery_s": 0.01}}},
			"b": {{Policy: "b", Extra: map[string]float64{"recovery_s": math.NaN(), "gap": math.Inf(1)}}},
		}}
	dir := t.TempDir()
	if err := WriteFiles(dir, []*Comparison{c}, "h", nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.Markdown(), "| – |") {
		t.Errorf("undefined value not shown as –:\n%s", c.Markdown())
	}
}

func TestRunnerRejectsNonsense(t *testing.T) {
	for name, opts := range map[string]Options{
		"no backend":     {Workload: DefaultWorkload()},
		"bad workload":   {Backend: Etcd{}, Workload: Workload{}},
		"trials":         {Backend: Etcd{}, Workload: DefaultWorkload(), Trials: -1},
		"nodes":          {Backend: Etcd{}, Workload: DefaultWorkload(), Nodes: 12},
		"unknown policy": {Backend: Etcd{}, Workload: DefaultWorkload(), Policies: []string{"fastest"}},
	} {
		if _, err := NewRunner(opts); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	r, err := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Run(context.Background(), "nope"); !errors.Is(err, ErrUnknownScenario) {
		t.Fatalf("unknown scenario: %v", err)
	}
	ext, _ := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload(), Endpoints: []string{"http://127.0.0.1:1"}})
	defer ext.Close()
	if _, err := ext.Run(context.Background(), ScenarioDegraded); !errors.Is(err, ErrNeedsTestbed) {
		t.Fatalf("degraded on an external cluster: %v", err)
	}
}

// TestQuickRunEndToEnd runs a short quick scenario on a real test-bed
// cluster and checks the records and files it produces.
func TestQuickRunEndToEnd(t *testing.T) {
	testutil.NeedsServers(t)
	w := DefaultWorkload()
	w.Duration, w.Warmup, w.Workers, w.Keys = 1500*time.Millisecond, 300*time.Millisecond, 4, 100
	r, err := NewRunner(Options{Backend: Etcd{}, Workload: w, Trials: 2, Policies: []string{router.RoundRobin, router.Hybrid}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	comps, err := r.Run(ctx, ScenarioQuick)
	if err != nil {
		t.Fatal(err)
	}
	if len(comps) != 1 || len(comps[0].Trials[router.Hybrid]) != 2 || len(comps[0].Trials[router.RoundRobin]) != 2 {
		t.Fatalf("comparisons: %+v", comps)
	}
	counted := 0
	for _, res := range Results(comps) {
		if res.Reads == 0 || res.Writes == 0 || res.ThroughputOps <= 0 || res.ReadP50ms <= 0 || res.WriteP99ms < res.WriteP50ms {
			t.Errorf("implausible record: %+v", res)
		}
		if len(res.ReadsByMember) != 3 {
			t.Errorf("router's per-member counts missing: %+v", res)
		}
		// A 1.5 s window: two seconds, the second a half, together
		// holding every operation counted.
		var reads, writes, failed int64
		for _, p := range res.Series {
			reads, writes, failed = reads+p.Reads, writes+p.Writes, failed+p.ReadErrors+p.WriteErrors
		}
		if len(res.Series) != 2 || reads != res.Reads || writes != res.Writes || failed != res.Errors {
			t.Errorf("%s trial %d: series %+v of %d reads, %d writes, %d errors", res.Policy, res.Trial, res.Series, res.Reads, res.Writes, res.Errors)
		}
		if res.CountersLate {
			// A starved machine read the cluster's counters after the
			// window: the runner leaves the members' counts out.
			t.Logf("%s trial %d: the cluster's counters came after the window; server-side counts left out", res.Policy, res.Trial)
			continue
		}
		counted++
		if len(res.ServerWritesByMember) != 3 {
			t.Errorf("per-member counts missing: %+v", res)
		}
		if res.Policy == router.Hybrid && res.ServerWritesByMember[0] < res.ServerWritesByMember[1]+res.ServerWritesByMember[2] {
			t.Errorf("hybrid writes not on the leader (server side): %v", res.ServerWritesByMember)
		}
		// The leader m0 (zone a) replicates to m2 (zone b) whatever the
		// policy: peer bytes cross zones in every trial.
		if tr := res.Traffic; tr == nil || tr.ClientTotal == 0 || tr.PeerCrossZone == 0 || tr.PeerCrossZone > tr.PeerTotal || tr.ClientCrossZone > tr.ClientTotal {
			t.Errorf("%s trial %d: implausible traffic %+v", res.Policy, res.Trial, tr)
		}
	}
	if counted == 0 {
		t.Error("every trial's cluster counters came after its window: nothing server-side was checked")
	}
	dir := t.TempDir()
	if err := WriteFiles(dir, comps, "header", nil); err != nil {
		t.Fatal(err)
	}
	var file struct {
		Results []map[string]any `json:"results"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &file); err != nil || len(file.Results) != 4 {
		t.Fatalf("results.json: %d records, %v", len(file.Results), err)
	}
	records := file.Results
	rec := records[0]
	for _, r := range records {
		if _, late := r["counters_late"]; !late {
			rec = r // a record whose server-side fields were kept
			break
		}
	}
	for _, field := range []string{"scenario", "backend", "policy", "trial", "read_p50_ms", "read_p99_ms", "write_p50_ms", "write_p99_ms", "throughput_ops", "errors", "reads_by_member", "writes_by_member", "traffic", "series"} {
		if _, ok := rec[field]; !ok {
			t.Errorf("results.json lacks %q", field)
		}
	}
	csv, _ := os.ReadFile(filepath.Join(dir, "results.csv"))
	if lines := strings.Count(string(csv), "\n"); lines != 5 {
		t.Errorf("results.csv has %d lines, want header + 4", lines)
	}
	for _, f := range []string{"tables.md", "fig_quick.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestPlanBackends(t *testing.T) {
	r, err := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload()})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := r.plan(ScenarioZKDegraded)
	if err != nil || ps.backend.Name() != "zk" {
		t.Fatalf("zk-degraded with --backend etcd: backend %v, %v; want zk", ps.backend, err)
	}
	if ps, _ = r.plan(ScenarioHealthy); ps.backend.Name() != "etcd" {
		t.Fatalf("healthy ran on %s", ps.backend.Name())
	}

	zr, err := NewRunner(Options{Backend: ZooKeeper{}, Workload: DefaultWorkload()})
	if err != nil {
		t.Fatal(err)
	}
	ps, err = zr.plan(ScenarioReadSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ps.variants {
		if strings.HasPrefix(v.label, "range") {
			t.Errorf("read-size on zk keeps range variant %q", v.label)
		}
	}
	if len(ps.variants) != 5 {
		t.Errorf("read-size on zk: %d variants, want the 5 value sizes", len(ps.variants))
	}
	w := DefaultWorkload()
	w.RangeSize = 10
	zr, _ = NewRunner(Options{Backend: ZooKeeper{}, Workload: w, Set: map[string]bool{"range-size": true}})
	if _, err := zr.plan(ScenarioQuick); !errors.Is(err, ErrNoRanges) {
		t.Fatalf("--range-size 10 on zk: %v, want ErrNoRanges", err)
	}
	// uneven brings its own cluster of unequal members unless
	// --member-cpu says otherwise; zk-tail runs on zk whatever --backend.
	if ps, err = zr.plan(ScenarioUneven); err != nil || !reflect.DeepEqual(ps.backend, Etcd{testbed.CPUBudgets{MemberCPUs: []float64{0.6, 0.2, 0.6}}}) {
		t.Fatalf("uneven with --backend zk: backend %#v, %v", ps.backend, err)
	}
	ur, _ := NewRunner(Options{Backend: Etcd{testbed.CPUBudgets{MemberCPU: 0.4}}, Workload: DefaultWorkload()})
	if ps, _ = ur.plan(ScenarioUneven); !reflect.DeepEqual(ps.backend, Etcd{testbed.CPUBudgets{MemberCPU: 0.4}}) {
		t.Fatalf("uneven with --member-cpu 0.4: backend %#v", ps.backend)
	}
	// Default budgets reach the scenarios bound to the other backend, and
	// uneven keeps its own.
	budgets, _ := DefaultBudgets(2)
	br, _ := NewRunner(Options{Backend: Etcd{budgets}, Workload: DefaultWorkload()})
	if ps, _ = br.plan(ScenarioZKHealthy); !reflect.DeepEqual(ps.backend, ZooKeeper{budgets}) {
		t.Fatalf("zk-healthy from a budgeted etcd runner: backend %#v", ps.backend)
	}
	if ps, _ = br.plan(ScenarioUneven); !reflect.DeepEqual(ps.backend, Etcd{testbed.CPUBudgets{MemberCPUs: []float64{0.6, 0.2, 0.6}}}) {
		t.Fatalf("uneven on default budgets: backend %#v", ps.backend)
	}
	if ps, _ = r.plan(ScenarioZKTail); ps.backend.Name() != "zk" {
		t.Fatalf("zk-tail ran on %s", ps.backend.Name())
	}
	if fmt.Sprintf("%#v", Etcd{}) == fmt.Sprintf("%#v", Etcd{testbed.CPUBudgets{MemberCPUs: []float64{0.6, 0.2, 0.6}}}) {
		t.Fatal("clusters of unequal members share the default cluster's key")
	}
	er, _ := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload(), Endpoints: []string{"127.0.0.1:2379"}})
	if _, err := er.plan(ScenarioZKHealthy); err == nil {
		t.Fatal("zk-healthy against given etcd endpoints planned")
	}
}

// TestReplotRoundTrip: tables redrawn from results.json match the run's.
func TestReplotRoundTrip(t *testing.T) {
	def := scenarioDefs(layoutOf(nil))[ScenarioTail]
	c := &Comparison{Scenario: ScenarioTail, Variant: "80/20", Baseline: router.Hybrid, Policies: []string{router.Hybrid, HybridHedge},
		Metrics: def.metrics(3), Notes: def.notes, Trials: map[string][]Result{}, CPU: "CPU: shared cores."}
	for k := range 2 {
		for i, p := range c.Policies {
			c.Trials[p] = append(c.Trials[p], Result{Scenario: ScenarioTail, Variant: "80/20", Policy: p, Trial: k + 1,
				ReadP50ms: float64(5 + i + k), ReadP999ms: float64(200 - 100*i + k), Reads: 1000, HedgedReads: int64(30 * i),
				ThroughputOps: 1000, ReadsByMember: []uint64{400, 300, 300}, CPUMode: c.CPU,
				Traffic: &Traffic{ClientTotal: 9000, ClientCrossZone: uint64(1000 * (i + 1)), PeerTotal: 4000, PeerCrossZone: 2000}})
		}
	}
	dir := t.TempDir()
	if err := WriteFiles(dir, []*Comparison{c}, "header", nil); err != nil {
		t.Fatal(err)
	}
	got, err := LoadComparisons(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Markdown() != c.Markdown() {
		t.Fatalf("redrawn:\n%s\nwant:\n%s", Markdown(got), c.Markdown())
	}
	if !strings.Contains(got[0].Markdown(), " CPU: shared cores.\n") {
		t.Errorf("the CPU mode is lost in the redrawing:\n%s", got[0].Markdown())
	}
	if !strings.Contains(c.Markdown(), "| Extra reads (%) | 0.00 ± 0.00 | 3.00 ± 0.00 |") {
		t.Errorf("extra reads row missing:\n%s", c.Markdown())
	}
	if !strings.Contains(c.Markdown(), "| Cross-zone (B/op) | 3 ± 0 | 4 ± 0 |") {
		t.Errorf("cross-zone row missing:\n%s", c.Markdown())
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll() // every row as wide as the header
	if err != nil {
		t.Fatal(err)
	}
	if head, last := rows[0], rows[len(rows)-1]; head[len(head)-1] != "peer_cross_zone_bytes" || last[len(last)-1] != "2000" || last[len(last)-3] != "2000" {
		t.Errorf("results.csv traffic columns: %q / %q", head[len(head)-4:], last[len(last)-4:])
	}
}

// TestCPUBudgets: the default leaves the client a quarter of the host (at
// least half a core) and splits the rest among the members; every table
// says which mode it ran in; a client budget without members' budgets is
// refused, as the members would start in the clients' cgroup.
func TestCPUBudgets(t *testing.T) {
	for _, tc := range []struct {
		cpus          int
		client, each3 float64
	}{{2, 0.5, 0.5}, {4, 1, 1}, {16, 4, 4}} {
		b, client := DefaultBudgets(tc.cpus)
		if client != tc.client || b.Of(0, 3) != tc.each3 || b.Of(2, 3) != tc.each3 {
			t.Errorf("DefaultBudgets(%d): client %v, members %v/%v; want %v and %v each", tc.cpus, client, b.Of(0, 3), b.Of(2, 3), tc.client, tc.each3)
		}
	}
	b, _ := DefaultBudgets(2)
	if got := b.Of(4, 5); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("five members on two CPUs: %v cores each, want 0.3", got)
	}
	if m := CPUMode(Etcd{b}, 3, 0.5); !strings.Contains(m, "0.5 / 0.5 / 0.5 cores") || !strings.Contains(m, "the client 0.5") {
		t.Errorf("budgeted mode line %q", m)
	}
	if m := CPUMode(ZooKeeper{}, 3, 0); !strings.Contains(m, "shared cores") {
		t.Errorf("shared mode line %q", m)
	}
	for _, opts := range []Options{
		{Backend: Etcd{}, ClientCPU: 0.5},
		{Backend: Etcd{b}, ClientCPU: -1},
		{Backend: Etcd{b}, ClientCPU: math.NaN()},
		{Backend: Etcd{b}, ClientCPU: 0.5, Endpoints: []string{"127.0.0.1:2379"}},
	} {
		opts.Workload = DefaultWorkload()
		if r, err := NewRunner(opts); !errors.Is(err, ErrBadWorkload) {
			if err == nil {
				r.Close()
			}
			t.Errorf("NewRunner(%#v, client %v): %v, want ErrBadWorkload", opts.Backend, opts.ClientCPU, err)
		}
	}
}

// noStart is a backend whose clusters never start: a run that needs one
// fails.
type noStart struct{ Etcd }

var errNoStart = errors.New("no cluster in this test")

func (noStart) Start(context.Context, testbed.Topology) (Cluster, error) { return nil, errNoStart }

// TestResumeRunsOnlyWhatIsMissing: a cell measured before with every
// policy's trials is taken as it was and starts no cluster (stock's
// trials among them, which count reads by the members' own counts only);
// one short of a trial, from another CPU mode, backend, workload or
// cluster size, or recorded without its workload, runs again.
func TestResumeRunsOnlyWhatIsMissing(t *testing.T) {
	be := noStart{}
	policies := []string{Stock, router.LeaderOnly, router.LeastCost}
	cpu := CPUMode(be, 3, 0)
	r, err := NewRunner(Options{Backend: be, Workload: DefaultWorkload(), Policies: policies, Trials: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ps, err := r.plan(ScenarioDominance)
	if err != nil {
		t.Fatal(err)
	}
	type record struct {
		cpu, backend string
		trials       int
		w            func(*Workload) // changes the variant's workload
		nodes        int
		noWorkload   bool
	}
	measured := func(v variant, rec record) *Comparison {
		w := ps.workload
		v.apply(&w)
		if rec.w != nil {
			rec.w(&w)
		}
		c := &Comparison{Scenario: ScenarioDominance, Variant: v.label, Trials: map[string][]Result{}, Topology: "default", CPU: rec.cpu}
		for _, p := range policies {
			for k := range rec.trials {
				res := Result{Scenario: ScenarioDominance, Variant: v.label, Backend: rec.backend, Policy: p, Trial: k + 1,
					Workload: &w, ReadsByMember: make([]uint64, rec.nodes), ServerReadsByMember: make([]uint64, rec.nodes), LeaderChanged: k == 0}
				if p == Stock { // a stock client counts no reads per member of its own
					res.ReadsByMember = nil
				}
				if rec.noWorkload {
					res.Workload = nil
				}
				c.Trials[p] = append(c.Trials[p], res)
			}
		}
		return c
	}
	good := record{cpu: cpu, backend: "etcd", trials: 2, nodes: 3}
	var all []*Comparison
	for _, v := range ps.variants {
		all = append(all, measured(v, good))
	}
	with := func(f func(*record)) record { rec := good; f(&rec); return rec }
	for _, tc := range []struct {
		name string
		rec  record // of the first variant's cell
	}{
		{"short of a trial", with(func(r *record) { r.trials = 1 })},
		{"another CPU mode", with(func(r *record) { r.cpu = "CPU: budgets …" })},
		{"another backend", with(func(r *record) { r.backend = "zk" })},
		{"another duration", with(func(r *record) { r.w = func(w *Workload) { w.Duration = time.Minute } })},
		{"another key space", with(func(r *record) { r.w = func(w *Workload) { w.Keys = 10 } })},
		{"another cluster size", with(func(r *record) { r.nodes = 5 })},
		{"recorded without its workload", with(func(r *record) { r.noWorkload = true })},
	} {
		r.opts.Measured = append([]*Comparison{measured(ps.variants[0], tc.rec)}, all[1:]...)
		var told []string
		r.opts.Finished = func(c *Comparison) { told = append(told, c.Variant) }
		comps, err := r.Run(t.Context(), ScenarioDominance)
		if !errors.Is(err, errNoStart) || len(comps) != 0 || len(told) != 0 {
			t.Errorf("%s: the first cell did not run: %d cells, told of %v, err %v", tc.name, len(comps), told, err)
		}
	}
	r.opts.Measured = all
	var told []string
	r.opts.Finished = func(c *Comparison) { told = append(told, c.Variant) }
	comps, err := r.Run(t.Context(), ScenarioDominance)
	if err != nil || len(comps) != len(ps.variants) || len(told) != len(ps.variants) {
		t.Fatalf("every cell measured: %d cells, told of %d, err %v; want %d and nil", len(comps), len(told), err, len(ps.variants))
	}
	moved := fmt.Sprintf("leader changed during %d trial(s)", len(policies)) // each policy's first
	for i, c := range comps {
		if c.Variant != ps.variants[i].label || !slices.Equal(c.Policies, policies) || c.Baseline != policies[0] || len(c.Trials[router.LeastCost]) != 2 ||
			len(c.Metrics) == 0 || !slices.ContainsFunc(c.Notes, func(n string) bool { return strings.Contains(n, moved) }) {
			t.Errorf("cell %d taken as %+v", i, c)
		}
	}
}
