package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
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

// IdleCores is one trial's idle CPU, in cores.
type IdleCores struct {
	Leader   Measured `json:"leader"`
	Follower Measured `json:"follower"` // the one follower classes are placed on
	// Proxies is every member's proxies', summed, where they run in
	// processes of their own (NaN where they run inside the members).
	Proxies Measured `json:"proxies"`
	Client  Measured `json:"client"`
}

// CostReport is the costs scenario's result.
type CostReport struct {
	Backend string `json:"backend"`
	CPUMode string `json:"cpu_mode"`
	Workers int    `json:"workers"`
	Window  string `json:"window"`
	// Classes are the classes measured, by the Class of their samples.
	Classes []CostClass  `json:"classes"`
	Idle    []IdleCores  `json:"idle"` // one per trial
	Samples []CostSample `json:"samples"`
}

// costSnapshot is one end of a window.
type costSnapshot struct {
	at               time.Time
	members, proxies []time.Duration
	client           time.Duration
	traffic          testbed.TrafficCounts
}

// readCPU reads every process's CPU time at once, and the time.
func (s *costSnapshot) readCPU(bed bedCPU) {
	s.members, s.proxies = bed.CPUTimes()
	s.client = testutil.ProcessCPU()
	s.at = time.Now()
}

// openWindow reads the proxies' traffic (a control round trip to each),
// then the CPU times: the window opens with the CPU read, and operations
// that end after it count.
func openWindow(cl Cluster, bed bedCPU) (s costSnapshot, err error) {
	if s.traffic, err = cl.Traffic(); err != nil {
		return s, err
	}
	s.readCPU(bed)
	return s, nil
}

// closeWindow reads the CPU times first, then the traffic.
func closeWindow(cl Cluster, bed bedCPU) (s costSnapshot, err error) {
	s.readCPU(bed)
	s.traffic, err = cl.Traffic()
	return s, err
}

// rates are what each process used, in cores, and what the proxies
// forwarded, in bytes a second, over a window.
type rates struct {
	members, proxies       []float64
	client                 float64
	clientBytes, peerBytes float64
}

func ratesOver(before, after costSnapshot) rates {
	secs := after.at.Sub(before.at).Seconds()
	per := func(a, b []time.Duration) []float64 {
		out := make([]float64, len(b))
		for i := range min(len(a), len(b)) {
			out[i] = (b[i] - a[i]).Seconds() / secs
		}
		return out
	}
	t := after.traffic.Since(before.traffic)
	return rates{members: per(before.members, after.members), proxies: per(before.proxies, after.proxies),
		client: (after.client - before.client).Seconds() / secs, clientBytes: float64(t.ClientTotal) / secs, peerBytes: float64(t.PeerTotal) / secs}
}

// costAttempts bounds how often a class is measured again because the
// leader moved during its window.
const costAttempts = 3

// RunCosts measures what each operation class costs the members' CPU, on
// the runner's 3-member test-bed cluster: per trial an idle window (after
// a second's quiet), then every class in turn, each placed with
// router.WithMember on the leader or on the lowest-indexed follower. A
// class whose window saw the leader move is measured again, after the
// cluster settles.
func (r *Runner) RunCosts(ctx context.Context, o CostOptions) (CostReport, error) {
	o.defaults()
	be := r.opts.Backend
	rep := CostReport{Backend: be.Name(), CPUMode: CPUMode(be, 3, r.opts.ClientCPU), Workers: o.Workers, Window: o.Window.String(), Classes: o.Classes}
	if len(r.opts.Endpoints) > 0 {
		return rep, ErrNeedsTestbed
	}
	if r.opts.Progress != nil {
		r.opts.Progress.Plan(o.Trials*(1+len(o.Classes)), time.Duration(o.Trials)*(costWarmup+o.Window+time.Duration(len(o.Classes))*(o.Window+costWarmup)))
	}
	cl, err := r.cluster(ctx, be, 3)
	if err != nil {
		return rep, err
	}
	b, ok := cl.(onBed)
	if !ok || b.bed() == nil {
		return rep, ErrNeedsTestbed
	}
	bed := b.bed()
	if n := cl.Size(); n != 3 {
		return rep, fmt.Errorf("bench: costs: %d members, want 3", n)
	}
	if err := r.settle(ctx, cl); err != nil {
		return rep, err
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
	apart := bed.ProxiesApart()
	nan := Measured(math.NaN())
	for trial := range o.Trials {
		r.costStep(fmt.Sprintf("costs: idle, trial %d", trial+1), costWarmup+o.Window)
		err := sleepCtx(ctx, costWarmup) // the load before it settles
		var before, after costSnapshot
		if err == nil {
			before, err = openWindow(cl, bed)
		}
		if err == nil {
			err = sleepCtx(ctx, o.Window)
		}
		if err == nil {
			after, err = closeWindow(cl, bed)
		}
		r.costDone()
		if err != nil {
			return rep, err
		}
		idle := ratesOver(before, after)
		leader, err := cl.Leader(ctx)
		if err != nil {
			return rep, err
		}
		ic := IdleCores{Leader: Measured(idle.members[leader]), Follower: Measured(idle.members[followerOf(leader)]), Proxies: nan, Client: Measured(idle.client)}
		if apart {
			ic.Proxies = Measured(sum(idle.proxies))
		}
		rep.Idle = append(rep.Idle, ic)
		for _, c := range o.Classes {
			s, err := r.measureClassSettled(ctx, cl, bed, cli, c, eps, o, idle, apart)
			if err != nil {
				return rep, fmt.Errorf("bench: costs: %s: %w", c.Name, err)
			}
			s.Class, s.Trial = c.Name, trial+1
			rep.Samples = append(rep.Samples, s)
		}
	}
	return rep, nil
}

// followerOf is the follower classes are placed on under leader: the
// lowest-indexed one.
func followerOf(leader int) int {
	if leader == 0 {
		return 1
	}
	return 0
}

// measureClassSettled measures class c under a leader that holds through
// its window, settling the cluster and measuring again when it did not.
func (r *Runner) measureClassSettled(ctx context.Context, cl Cluster, bed bedCPU, cli Client, c CostClass, eps []string, o CostOptions, idle rates, apart bool) (CostSample, error) {
	for attempt := 1; ; attempt++ {
		leader, err := cl.Leader(ctx)
		if err != nil {
			return CostSample{}, err
		}
		at := leader
		if c.Follower {
			at = followerOf(leader)
		}
		r.costStep(fmt.Sprintf("costs: %s on m%d", c.Name, at), costWarmup+o.Window)
		s, err := measureClass(ctx, cl, bed, cli, c, eps[at], o, idle, apart)
		r.costDone()
		if err != nil {
			return s.CostSample, err
		}
		if now, err := cl.Leader(ctx); err == nil && now == leader {
			s.attribute(leader, followerOf(leader), c.Follower)
			return s.CostSample, nil
		}
		if attempt == costAttempts {
			return s.CostSample, fmt.Errorf("the leader moved during %d windows", costAttempts)
		}
		if err := r.settle(ctx, cl); err != nil {
			return s.CostSample, err
		}
	}
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
// returns what each operation cost with the idle rates taken out.
func measureClass(ctx context.Context, cl Cluster, bed bedCPU, cli Client, c CostClass, ep string, o CostOptions, idle rates, apart bool) (classSample, error) {
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
	var before, after costSnapshot
	err := sleepCtx(ctx, costWarmup)
	if err == nil {
		before, err = openWindow(cl, bed)
	}
	if err == nil {
		measuring.Store(true)
		err = sleepCtx(ctx, o.Window)
		measuring.Store(false)
	}
	if err == nil {
		after, err = closeWindow(cl, bed)
	}
	close(stop)
	wg.Wait()
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
	load := ratesOver(before, after)
	perOp := func(rate, idleRate, unit float64) float64 { return (rate - idleRate) * secs * unit / n }
	for i := range load.members {
		s.members = append(s.members, perOp(load.members[i], idle.members[i], 1e6))
	}
	s.Proxies = Measured(math.NaN())
	if apart {
		s.Proxies = Measured(perOp(sum(load.proxies), sum(idle.proxies), 1e6))
	}
	s.Client = perOp(load.client, idle.client, 1e6)
	s.ClientBytes, s.PeerBytes = perOp(load.clientBytes, idle.clientBytes, 1), perOp(load.peerBytes, idle.peerBytes, 1)
	return s, nil
}

// CostsMarkdown renders a costs report: per class the median over trials
// and the range.
func CostsMarkdown(rep CostReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CPU per operation on %s, by component: µs of CPU time per operation, median (min–max) over %d trial(s), each process's idle rate (and the proxies' idle traffic) taken out; %d closed-loop workers, %s windows, each class placed with router.WithMember on the leader or on one follower. A member's figure holds its proxies; the proxies' column is their part, summed over members, where they run in processes of their own (ZooKeeper's always, etcd's with --proxies-apart).\n\n",
		rep.Backend, len(rep.Idle), rep.Workers, rep.Window)
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
		col := func(get func(CostSample) float64) string {
			v := make([]float64, len(g))
			for i, s := range g {
				v[i] = get(s)
			}
			return spread(v, "%.0f")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", class,
			col(func(s CostSample) float64 { return s.OpsPS }),
			col(func(s CostSample) float64 { return float64(s.Leader) }),
			col(func(s CostSample) float64 { return float64(s.Placed) }),
			col(func(s CostSample) float64 { return float64(s.Others) }),
			col(func(s CostSample) float64 { return float64(s.Proxies) }),
			col(func(s CostSample) float64 { return s.Client }),
			col(func(s CostSample) float64 { return s.ClientBytes }),
			col(func(s CostSample) float64 { return s.PeerBytes }))
	}
	idle := func(get func(IdleCores) Measured) string {
		v := make([]float64, len(rep.Idle))
		for i, c := range rep.Idle {
			v[i] = float64(get(c))
		}
		return spread(v, "%.3f")
	}
	fmt.Fprintf(&b, "\nIdle, in cores: leader %s, a follower %s, proxies (all members) %s, client %s.\n",
		idle(func(c IdleCores) Measured { return c.Leader }), idle(func(c IdleCores) Measured { return c.Follower }),
		idle(func(c IdleCores) Measured { return c.Proxies }), idle(func(c IdleCores) Measured { return c.Client }))
	b.WriteString("\n" + rep.CPUMode + "\n")
	return b.String()
}

// spread is the median of the values measured (NaN ones left out) and,
// for more than one, their range; "–" for none.
func spread(v []float64, format string) string {
	v = slices.DeleteFunc(slices.Clone(v), math.IsNaN)
	if len(v) == 0 {
		return "–"
	}
	slices.Sort(v)
	if len(v) == 1 {
		return fmt.Sprintf(format, v[0])
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", medianSorted(v), v[0], v[len(v)-1])
}

// medianSorted is the median of sorted values.
func medianSorted(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
