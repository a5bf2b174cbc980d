package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// ScenarioCosts is the costs scenario's name: not one of Scenarios(),
// since its figures are what one operation costs the members' CPU, by
// class and component, not a comparison of policies.
const ScenarioCosts = "costs"

// CostClass is one kind of operation, each placed on one member.
type CostClass struct {
	Name string `json:"name"`
	// Write is a write of ValueSize bytes; else a linearizable read of a
	// value of ValueSize bytes.
	Write bool `json:"write"`
	// Follower places the operations on one follower (a write is then
	// forwarded to the leader); else on the leader.
	Follower  bool `json:"follower"`
	ValueSize int  `json:"value_size"`
}

// DefaultCostClasses are the costs scenario's rows: writes of 128 bytes
// at the leader and through a follower, linearizable reads of 128 bytes
// at the leader and at a follower, and of 16 KiB at a follower (the
// difference is the cost of serving a KiB).
func DefaultCostClasses() []CostClass {
	return []CostClass{
		{Name: "write at leader", Write: true, ValueSize: 128},
		{Name: "write via follower", Write: true, Follower: true, ValueSize: 128},
		{Name: "read at leader", ValueSize: 128},
		{Name: "read at follower", Follower: true, ValueSize: 128},
		{Name: "16 KiB read at follower", Follower: true, ValueSize: 16 << 10},
	}
}

// CostOptions configures RunCosts; zero fields take the defaults.
type CostOptions struct {
	Classes []CostClass // default DefaultCostClasses
	Workers int         // closed-loop workers per class, default 8
	Window  time.Duration
	Trials  int // default 3, the classes interleaved
	Keys    int // keys per value size, default 100
}

func (o *CostOptions) defaults() {
	if o.Classes == nil {
		o.Classes = DefaultCostClasses()
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.Window <= 0 {
		o.Window = 5 * time.Second
	}
	if o.Trials <= 0 {
		o.Trials = 3
	}
	if o.Keys <= 0 {
		o.Keys = 100
	}
}

// costWarmup runs before each class's window, unmeasured: the placement
// changes between classes, and the window should not see the change.
const costWarmup = time.Second

// CostSample is one class measured in one trial. CPU figures are µs per
// operation with each process's idle rate (heartbeats, probes) taken
// out; NaN where nothing was measured.
type CostSample struct {
	Class  string  `json:"class"`
	Trial  int     `json:"trial"`
	Ops    int     `json:"ops"`
	Errors int     `json:"errors"`
	OpsPS  float64 `json:"ops_per_s"`
	// Leader is the leader's CPU, its proxies included wherever they run;
	// Placed the follower's the operations went to (NaN for a class
	// placed on the leader); Others every other member's, summed.
	Leader Measured `json:"leader_us"`
	Placed Measured `json:"placed_us"`
	Others Measured `json:"others_us"`
	// Proxies is the part of those that the members' proxies used, summed
	// over members, where they run in processes of their own (NaN where
	// each runs inside its member's process).
	Proxies Measured `json:"proxies_us"`
	// Client is the client process's CPU (routebench's, the router's
	// probes included).
	Client float64 `json:"client_us"`
	// ClientBytes and PeerBytes are what the proxies forwarded per
	// operation, client↔member and member↔member.
	ClientBytes float64 `json:"client_bytes"`
	PeerBytes   float64 `json:"peer_bytes"`
}

// Measured is a figure that may not have been measured: NaN, which JSON
// writes as null.
type Measured float64

// MarshalJSON writes NaN as null.
func (m Measured) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(m)) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(m))
}

// UnmarshalJSON reads null as NaN.
func (m *Measured) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*m = Measured(math.NaN())
		return nil
	}
	return json.Unmarshal(b, (*float64)(m))
}

// CostReport is the costs scenario's result.
type CostReport struct {
	Backend string `json:"backend"`
	CPUMode string `json:"cpu_mode"`
	Workers int    `json:"workers"`
	Window  string `json:"window"`
	// Classes are the classes measured, by the Class of their samples.
	Classes []CostClass `json:"classes"`
	// IdleCores is each trial's idle CPU in cores: the leader, one
	// follower, and the proxies apart (summed; NaN when inside).
	IdleCores [][3]Measured `json:"idle_cores"`
	Samples   []CostSample  `json:"samples"`
}

// proxyCPUer is a test-bed cluster whose proxies' CPU can be told from
// its members' (ProxyCPU: zero where they run inside the members).
type proxyCPUer interface{ ProxyCPU() []time.Duration }

// costSnapshot is what a window is measured between.
type costSnapshot struct {
	at      time.Time
	members []time.Duration
	proxies []time.Duration
	client  time.Duration
	traffic testbed.TrafficCounts
}

func takeCostSnapshot(cl Cluster) (costSnapshot, error) {
	s := costSnapshot{members: cl.ServerCPU()}
	if p, ok := cl.(proxyCPUer); ok {
		s.proxies = p.ProxyCPU()
	}
	var err error
	if s.client, err = testbed.ProcessCPU(os.Getpid()); err != nil {
		return s, err
	}
	if s.traffic, err = cl.Traffic(); err != nil {
		return s, err
	}
	s.at = time.Now()
	return s, nil
}

// RunCosts measures what each operation class costs the members' CPU, on
// the runner's 3-member test-bed cluster: per trial an idle window, then
// every class in turn, each placed with router.WithMember on the leader
// or on the lowest-indexed follower.
func (r *Runner) RunCosts(ctx context.Context, o CostOptions) (CostReport, error) {
	o.defaults()
	be := r.opts.Backend
	rep := CostReport{Backend: be.Name(), CPUMode: CPUMode(be, 3, r.opts.ClientCPU), Workers: o.Workers, Window: o.Window.String(), Classes: o.Classes}
	if len(r.opts.Endpoints) > 0 {
		return rep, ErrNeedsTestbed
	}
	if r.opts.Progress != nil {
		r.opts.Progress.Plan(o.Trials*(1+len(o.Classes)), time.Duration(o.Trials)*(o.Window+time.Duration(len(o.Classes))*(o.Window+costWarmup)))
	}
	cl, err := r.cluster(ctx, be, 3)
	if err != nil {
		return rep, err
	}
	if err := r.settle(ctx, cl); err != nil {
		return rep, err
	}
	leader, err := cl.Leader(ctx)
	if err != nil {
		return rep, err
	}
	follower := 0
	if leader == 0 {
		follower = 1
	}
	cli, err := cl.Connect(ctx, router.RoundRobin, 1)
	if err != nil {
		return rep, err
	}
	defer cli.Close()
	sizes := map[int]bool{}
	for _, c := range o.Classes {
		sizes[c.ValueSize] = true
	}
	for size := range sizes {
		value := make([]byte, size)
		for k := range o.Keys {
			if err := cli.Write(router.WithLeader(ctx), costKey(size, k), value); err != nil {
				return rep, fmt.Errorf("bench: costs: prepare: %w", err)
			}
		}
	}
	eps := cl.Endpoints()
	for trial := range o.Trials {
		r.costStep(fmt.Sprintf("costs: idle, trial %d", trial+1), o.Window)
		before, err := takeCostSnapshot(cl)
		if err != nil {
			return rep, err
		}
		if err := sleepCtx(ctx, o.Window); err != nil {
			return rep, err
		}
		after, err := takeCostSnapshot(cl)
		r.costDone()
		if err != nil {
			return rep, err
		}
		idle := idleRates(before, after)
		rep.IdleCores = append(rep.IdleCores, [3]Measured{Measured(idle.members[leader]), Measured(idle.members[follower]), Measured(sumOrNaN(idle.proxies))})
		for _, c := range o.Classes {
			at := leader
			if c.Follower {
				at = follower
			}
			r.costStep(fmt.Sprintf("costs: %s, trial %d", c.Name, trial+1), costWarmup+o.Window)
			s, err := measureClass(ctx, cl, cli, c, eps[at], o, idle)
			r.costDone()
			if err != nil {
				return rep, fmt.Errorf("bench: costs: %s: %w", c.Name, err)
			}
			s.Class, s.Trial = c.Name, trial+1
			s.attribute(leader, follower, c.Follower)
			rep.Samples = append(rep.Samples, s.CostSample)
		}
	}
	return rep, nil
}

func (r *Runner) costStep(label string, d time.Duration) {
	if r.opts.Progress != nil {
		r.opts.Progress.Start(label, d)
	}
}

func (r *Runner) costDone() {
	if r.opts.Progress != nil {
		r.opts.Progress.Finish()
	}
}

func costKey(size, k int) string { return fmt.Sprintf("costs/%d/%03d", size, k) }

// rates are CPU cores per process over a window.
type rates struct{ members, proxies []float64 }

func idleRates(before, after costSnapshot) rates {
	secs := after.at.Sub(before.at).Seconds()
	per := func(a, b []time.Duration) []float64 {
		if len(a) != len(b) {
			return nil
		}
		out := make([]float64, len(a))
		for i := range a {
			out[i] = (b[i] - a[i]).Seconds() / secs
		}
		return out
	}
	return rates{per(before.members, after.members), per(before.proxies, after.proxies)}
}

func sumOrNaN(v []float64) float64 {
	if len(v) == 0 || !slices.ContainsFunc(v, func(x float64) bool { return x != 0 }) {
		return math.NaN()
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// classSample is a CostSample with each member's µs per operation, before
// they are attributed to roles.
type classSample struct {
	CostSample
	members []float64
}

func (s *classSample) attribute(leader, follower int, placed bool) {
	nan := Measured(math.NaN())
	s.Leader, s.Placed, s.Others = nan, nan, 0
	for i, us := range s.members {
		switch {
		case i == leader:
			s.Leader = Measured(us)
		case i == follower && placed:
			s.Placed = Measured(us)
		default:
			s.Others += Measured(us)
		}
	}
}

// measureClass runs class c's operations on the member at endpoint ep
// with o.Workers closed-loop workers, a warm-up and then a window, and
// returns its CPU per operation with the idle rates taken out.
func measureClass(ctx context.Context, cl Cluster, cli Client, c CostClass, ep string, o CostOptions, idle rates) (classSample, error) {
	value := make([]byte, c.ValueSize)
	var ops, errs atomic.Int64
	var measuring atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range o.Workers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				octx, cancel := context.WithTimeout(router.WithMember(ctx, ep), 5*time.Second)
				k := costKey(c.ValueSize, (w*31+n)%o.Keys)
				var err error
				if c.Write {
					err = cli.Write(octx, k, value)
				} else {
					err = cli.Read(octx, k, "")
				}
				cancel()
				if !measuring.Load() {
					continue
				}
				if err != nil {
					errs.Add(1)
				} else {
					ops.Add(1)
				}
			}
		})
	}
	var s classSample
	finish := func() {
		close(stop)
		wg.Wait()
	}
	if err := sleepCtx(ctx, costWarmup); err != nil {
		finish()
		return s, err
	}
	before, err := takeCostSnapshot(cl)
	if err != nil {
		finish()
		return s, err
	}
	measuring.Store(true)
	serr := sleepCtx(ctx, o.Window)
	measuring.Store(false)
	after, err := takeCostSnapshot(cl)
	finish()
	if serr != nil {
		return s, serr
	}
	if err != nil {
		return s, err
	}
	s.Ops, s.Errors = int(ops.Load()), int(errs.Load())
	if s.Ops == 0 {
		return s, fmt.Errorf("no operation succeeded (%d failed)", s.Errors)
	}
	secs := after.at.Sub(before.at).Seconds()
	n := float64(s.Ops)
	s.OpsPS = n / secs
	perOp := func(a, b time.Duration, idleCores float64) float64 {
		return ((b - a).Seconds() - idleCores*secs) * 1e6 / n
	}
	for i := range after.members {
		s.members = append(s.members, perOp(before.members[i], after.members[i], idle.members[i]))
	}
	s.Proxies = Measured(math.NaN())
	if len(idle.proxies) == len(after.proxies) && slices.ContainsFunc(after.proxies, func(d time.Duration) bool { return d != 0 }) {
		s.Proxies = 0
		for i := range after.proxies {
			s.Proxies += Measured(perOp(before.proxies[i], after.proxies[i], idle.proxies[i]))
		}
	}
	s.Client = (after.client - before.client).Seconds() * 1e6 / n
	t := after.traffic.Since(before.traffic)
	s.ClientBytes, s.PeerBytes = float64(t.ClientTotal)/n, float64(t.PeerTotal)/n
	return s, nil
}

// CostsMarkdown renders a costs report: per class the median over trials
// and the range.
func CostsMarkdown(rep CostReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CPU per operation on %s, by component: µs of CPU time per operation, median (min–max) over %d trial(s), each process's idle rate taken out; %d closed-loop workers, %s windows, each class placed with router.WithMember on the leader or on one follower. A member's figure holds its proxies; the proxies' column is their part, summed over members, where they run in processes of their own (ZooKeeper's always, etcd's with --proxies-apart).\n\n",
		rep.Backend, len(rep.IdleCores), rep.Workers, rep.Window)
	b.WriteString("| Class | ops/s | Leader (µs/op) | Follower placed on (µs/op) | Others, summed (µs/op) | Of these, proxies (µs/op) | Client (µs/op) | Client bytes/op | Peer bytes/op |\n|---|---|---|---|---|---|---|---|---|\n")
	var order []string
	by := map[string][]CostSample{}
	for _, s := range rep.Samples {
		if _, ok := by[s.Class]; !ok {
			order = append(order, s.Class)
		}
		by[s.Class] = append(by[s.Class], s)
	}
	for _, class := range order {
		g := by[class]
		col := func(get func(CostSample) float64, decimals int) string {
			var v []float64
			for _, s := range g {
				if x := get(s); !math.IsNaN(x) {
					v = append(v, x)
				}
			}
			if len(v) == 0 {
				return "–"
			}
			slices.Sort(v)
			f := fmt.Sprintf("%%.%df", decimals)
			if len(v) == 1 {
				return fmt.Sprintf(f, v[0])
			}
			return fmt.Sprintf(f+" ("+f+"–"+f+")", medianSorted(v), v[0], v[len(v)-1])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", class,
			col(func(s CostSample) float64 { return s.OpsPS }, 0),
			col(func(s CostSample) float64 { return float64(s.Leader) }, 0),
			col(func(s CostSample) float64 { return float64(s.Placed) }, 0),
			col(func(s CostSample) float64 { return float64(s.Others) }, 0),
			col(func(s CostSample) float64 { return float64(s.Proxies) }, 0),
			col(func(s CostSample) float64 { return s.Client }, 0),
			col(func(s CostSample) float64 { return s.ClientBytes }, 0),
			col(func(s CostSample) float64 { return s.PeerBytes }, 0))
	}
	var idle [3][]float64
	for _, t := range rep.IdleCores {
		for i := range idle {
			if !math.IsNaN(float64(t[i])) {
				idle[i] = append(idle[i], float64(t[i]))
			}
		}
	}
	fmt.Fprintf(&b, "\nIdle, in cores: leader %s, a follower %s, proxies (all members) %s.\n", spread(idle[0]), spread(idle[1]), spread(idle[2]))
	b.WriteString("\n" + rep.CPUMode + "\n")
	return b.String()
}

func spread(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return fmt.Sprintf("%.3f (%.3f–%.3f)", medianSorted(v), v[0], v[len(v)-1])
}

// medianSorted is the median of sorted values.
func medianSorted(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
