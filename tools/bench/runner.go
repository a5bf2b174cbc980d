package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// Options configures a Runner.
type Options struct {
	Backend Backend
	// Workload is the base workload; scenarios vary some of its fields
	// unless the user set them (Set).
	Workload Workload
	// Set names the workload flags the user gave explicitly ("read-ratio",
	// "workers", "value-size", "range-size", "trials", "duration"); a
	// scenario's variants never override them.
	Set map[string]bool
	// Trials per policy. Default 3 (failover: 1 unless set).
	Trials int
	// Policies replaces every scenario's policy list when set; the first is
	// the baseline.
	Policies []string
	// Nodes is the cluster size for scenarios without a fixed size. Default 3.
	Nodes int
	// Topology replaces the default topology (its zones set the size).
	Topology *testbed.Topology
	// TopologyName names the topology in records (Result.Topology) and
	// table titles: "three-zones", a file's name. Default is "default"
	// without a Topology and "custom" with one; "" with Endpoints.
	TopologyName string
	// Endpoints attaches to an existing cluster instead of the test bed.
	Endpoints []string
	// Attach is how to reach and place the cluster at Endpoints: TLS,
	// credentials, zones. Its Endpoints and KeyPrefix are the runner's
	// own (Endpoints, KeyPrefix). Only with Endpoints.
	Attach AttachOptions
	// KeyPrefix prefixes the workload's keys (ValidKeyPrefix). Default
	// DefaultKeyPrefix, the only one on the test bed. On an attached
	// cluster the runner refuses a prefix that already holds keys, unless
	// KeepKeys, and deletes every key under it when it is done with the
	// cluster (Close, or the end of the scenarios that need it), whether
	// they ran to the end, failed or were cancelled.
	KeyPrefix string
	// KeepKeys leaves the keys written to an attached cluster.
	KeepKeys bool
	// ServerVersions, if set, is told the servers' versions of each
	// cluster the runner starts or attaches to: the backend's name and
	// one version per member, "" where a member did not say.
	ServerVersions func(backend string, versions []string)
	// ClientCPU confines this process, the clients, to this many cores
	// while the runner lives (testbed.ConfineSelf), so that they cannot
	// take the CPU the members' budgets promise; 0 leaves it unconfined.
	// It needs the Backend's members to have budgets: processes the test
	// bed starts begin in the clients' cgroup.
	ClientCPU float64
	// Measured are cells an earlier run recorded (LoadComparisons of its
	// results.json). A variant found there with every policy's trials,
	// each with the same scenario, variant, workload, backend, cluster
	// size, layout and CPU mode, is taken from it rather than run again,
	// so that a long grid cut short resumes.
	Measured []*Comparison
	// Finished, if set, is told of each variant as it completes or is
	// taken from Measured, so that the caller can keep what a long run
	// has measured before it ends.
	Finished func(*Comparison)
	// Progress is told about every run; nil shows nothing.
	Progress Progress
	// Logf prints remarks; nil discards them.
	Logf func(format string, args ...any)
}

// Progress follows a run of scenarios.
type Progress interface {
	// Plan announces the number of runs and their total length.
	Plan(runs int, total time.Duration)
	// Start says a run begins: what it is and how long it will measure.
	Start(label string, length time.Duration)
	// Finish says the run ended.
	Finish()
}

// Runner runs scenarios, reusing one cluster per size.
type Runner struct {
	opts          Options
	clusters      map[clusterKey]Cluster
	releaseClient func() error // nil unless the client is confined
	cleanupErrs   []error      // of clusters let go of before Close
}

type clusterKey struct {
	backend string // the Backend's value: its options make another cluster
	nodes   int
}

// NewRunner checks opts and returns a runner. Close it to stop its clusters.
func NewRunner(opts Options) (*Runner, error) {
	if opts.Backend == nil {
		return nil, errors.New("bench: no backend")
	}
	if err := opts.Workload.Validate(); err != nil {
		return nil, err
	}
	if opts.Trials == 0 {
		opts.Trials = 3
	}
	if opts.Trials < 1 || opts.Trials > 100 {
		return nil, fmt.Errorf("%w: %d trials, want 1..100", ErrBadWorkload, opts.Trials)
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 1 || opts.Nodes > 9 {
		return nil, fmt.Errorf("%w: %d nodes, want 1..9", ErrBadWorkload, opts.Nodes)
	}
	for _, p := range opts.Policies {
		if !slices.Contains(append(router.Policies(), Comparators()...), p) {
			return nil, fmt.Errorf("%w: %q", router.ErrUnknownPolicy, p)
		}
	}
	if opts.Set == nil {
		opts.Set = map[string]bool{}
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if err := ValidKeyPrefix(opts.KeyPrefix); err != nil {
		return nil, err
	}
	if len(opts.Endpoints) == 0 && (opts.KeyPrefix != DefaultKeyPrefix || opts.KeepKeys || !opts.Attach.withoutConnection()) {
		return nil, ErrNotAttached
	}
	if opts.TopologyName == "" && len(opts.Endpoints) == 0 {
		opts.TopologyName = "default"
		if opts.Topology != nil {
			opts.TopologyName = "custom"
		}
	}
	r := &Runner{opts: opts, clusters: map[clusterKey]Cluster{}}
	if opts.ClientCPU != 0 {
		if !(opts.ClientCPU > 0 && opts.ClientCPU <= 1024) || len(opts.Endpoints) > 0 || !BudgetsOf(opts.Backend).Confined() {
			return nil, fmt.Errorf("%w: a client budget (%v cores) needs the test bed's members on budgets too", ErrBadWorkload, opts.ClientCPU)
		}
		var err error
		if r.releaseClient, err = testbed.ConfineSelf(opts.ClientCPU); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ErrNotAttached: a key prefix of one's own, KeepKeys, TLS, credentials
// or zones without Endpoints; the test bed's clusters have their own.
var ErrNotAttached = errors.New("bench: a key prefix, kept keys, TLS, credentials and zones are for a cluster of one's own (Endpoints)")

// Close stops the clusters the runner started and lets go of those it
// attached to, deleting the keys it wrote there (Options.KeepKeys).
func (r *Runner) Close() error {
	errs := r.cleanupErrs
	r.cleanupErrs = nil
	for _, c := range r.clusters {
		errs = append(errs, r.cleanUp(c), c.Close())
	}
	if r.releaseClient != nil {
		errs = append(errs, r.releaseClient())
		r.releaseClient = nil
	}
	return errors.Join(errs...)
}

type plannedScenario struct {
	def      scenarioDef
	nodes    int
	policies []string
	baseline string
	variants []variant
	trials   int
	workload Workload
	backend  Backend
	notes    []string // the plan's, added to each comparison's
}

// plan resolves a scenario against the options.
func (r *Runner) plan(name string) (plannedScenario, error) {
	def := scenarioDefs(layoutOf(r.opts.Topology))[name]
	ps := plannedScenario{def: def, nodes: r.opts.Nodes, policies: def.policies, baseline: def.baseline, variants: def.variants, trials: r.opts.Trials, workload: r.opts.Workload, backend: r.opts.Backend}
	sb, simulating := r.opts.Backend.(simBackend)
	if def.backend != "" && def.backend != storeOf(r.opts.Backend) {
		switch {
		case len(r.opts.Endpoints) > 0:
			return ps, fmt.Errorf("scenario %s runs on %s, not on the %s cluster given", name, def.backend, r.opts.Backend.Name())
		case simulating:
			ps.backend = sb.on(def.backend)
		default:
			ps.backend = withBudgets(builtinBackends[def.backend], BudgetsOf(r.opts.Backend))
		}
	}
	if simulating {
		if err := simulatedPlan(&ps); err != nil {
			return ps, fmt.Errorf("scenario %s: %w", name, err)
		}
	}
	if def.fixedNodes {
		ps.nodes = def.nodes
	}
	if def.memberCPUs != nil && len(r.opts.Endpoints) == 0 {
		// The scenario's own budgets, unless the user gave members theirs.
		if e, ok := ps.backend.(Etcd); ok && e.MemberCPU == 0 && e.MemberCPUs == nil {
			ps.backend = Etcd{CPUBudgets: testbed.CPUBudgets{MemberCPUs: def.memberCPUs, ProxiesApart: e.ProxiesApart}}
		}
	}
	if r.opts.Topology != nil {
		ps.nodes = len(r.opts.Topology.Zones)
	}
	if len(r.opts.Endpoints) > 0 {
		ps.nodes = len(r.opts.Endpoints)
		if def.faults {
			return ps, fmt.Errorf("scenario %s: %w", name, ErrNeedsTestbed)
		}
	}
	if storeOf(ps.backend) == "zk" && ps.workload.RangeSize > 1 {
		return ps, fmt.Errorf("scenario %s: %w (--range-size %d)", name, ErrNoRanges, ps.workload.RangeSize)
	}
	if len(r.opts.Policies) > 0 {
		ps.policies, ps.baseline = r.opts.Policies, r.opts.Policies[0]
	}
	if storeOf(ps.backend) != "etcd" && slices.ContainsFunc(ps.policies, stockPolicy) {
		r.opts.Logf("scenario %s: dropping %s and %s, etcd's baselines (ZooKeeper's stock client is sticky)", name, Stock, Pinned)
		ps.policies = slices.DeleteFunc(slices.Clone(ps.policies), stockPolicy)
		if stockPolicy(ps.baseline) && len(ps.policies) > 0 {
			ps.baseline = ps.policies[0]
		}
	}
	if len(r.opts.Endpoints) > 0 && slices.Contains(ps.policies, Oracle) {
		r.opts.Logf("scenario %s: dropping %s, which needs the test bed", name, Oracle)
		ps.policies = slices.DeleteFunc(slices.Clone(ps.policies), func(p string) bool { return p == Oracle })
	}
	if simulating {
		if err := simulable(&ps, r.opts.Logf); err != nil {
			return ps, fmt.Errorf("scenario %s: %w", name, err)
		}
	}
	// Flags the user set win over the scenario's variants.
	var kept []variant
	for _, v := range ps.variants {
		if storeOf(ps.backend) == "zk" {
			w := ps.workload
			v.apply(&w)
			if w.RangeSize > 1 {
				continue // ZooKeeper has no range reads
			}
		}
		overridden := false
		for _, f := range v.fields {
			overridden = overridden || r.opts.Set[f]
		}
		if !overridden {
			kept = append(kept, v)
		}
	}
	if len(kept) == 0 {
		kept = []variant{{label: "as given", apply: func(*Workload) {}}}
	}
	ps.variants = kept
	if def.trials > 0 && !r.opts.Set["trials"] {
		ps.trials = def.trials
	}
	if def.duration > 0 && !r.opts.Set["duration"] {
		ps.workload.Duration = def.duration
	}
	if def.failover {
		if !r.opts.Set["trials"] {
			ps.trials = 1 // representative runs, as in the paper
		}
		if !r.opts.Set["duration"] {
			ps.workload.Duration = 90 * time.Second
		}
	}
	return ps, nil
}

// Run runs the named scenarios (ScenarioAll expands) and returns one
// Comparison per scenario variant.
func (r *Runner) Run(ctx context.Context, names ...string) ([]*Comparison, error) {
	names, err := expand(names)
	if err != nil {
		return nil, err
	}
	var plans []plannedScenario
	runs, total := 0, time.Duration(0)
	for _, n := range names {
		ps, err := r.plan(n)
		if err != nil {
			return nil, err
		}
		plans = append(plans, ps)
		pending := 0
		for _, v := range ps.variants {
			if r.measured(ps, v) == nil {
				pending++
			}
		}
		k := pending * ps.trials * len(ps.policies)
		runs += k
		total += time.Duration(k) * (ps.workload.Warmup + ps.workload.Duration)
	}
	if r.opts.Progress != nil {
		r.opts.Progress.Plan(runs, total)
	}
	var out []*Comparison
	for k, ps := range plans {
		comps, err := r.runScenario(ctx, ps)
		// A cluster no later scenario runs on is stopped now: idle, its
		// heartbeats and proxies would still take CPU from the next.
		needed := false
		for _, later := range plans[k+1:] {
			needed = needed || (ps.def.memberCPUs == nil && later.def.memberCPUs == nil &&
				fmt.Sprintf("%#v", later.backend) == fmt.Sprintf("%#v", ps.backend) && later.nodes == ps.nodes)
		}
		if !needed {
			r.closeCluster(ps.backend, ps.nodes)
		}
		out = append(out, comps...)
		if err != nil {
			return out, fmt.Errorf("scenario %s: %w", ps.def.name, err)
		}
	}
	return out, nil
}

// builtinBackends serve scenarios bound to a backend other than --backend.
var builtinBackends = map[string]Backend{"etcd": Etcd{}, "zk": ZooKeeper{}}

func (r *Runner) cluster(ctx context.Context, be Backend, nodes int) (Cluster, error) {
	key := clusterKey{fmt.Sprintf("%#v", be), nodes}
	if c := r.clusters[key]; c != nil {
		return c, nil
	}
	var c Cluster
	var err error
	if len(r.opts.Endpoints) > 0 {
		c, err = r.attach(ctx, be)
	} else {
		topo := testbed.DefaultTopology(nodes)
		if r.opts.Topology != nil {
			topo = *r.opts.Topology
		}
		if _, ok := be.(simBackend); ok {
			r.opts.Logf("simulating a %d-member cluster in virtual time (zones %v)", nodes, topo.Zones)
		} else {
			r.opts.Logf("starting a %d-member %s cluster on the test bed (zones %v)", nodes, be.Name(), topo.Zones)
		}
		c, err = be.Start(ctx, topo)
	}
	if err != nil {
		return nil, err
	}
	r.clusters[key] = c
	if r.opts.ServerVersions != nil {
		if v, ok := c.(versionTeller); ok {
			vctx, cancel := context.WithTimeout(ctx, versionsTimeout)
			r.opts.ServerVersions(be.Name(), v.serverVersions(vctx))
			cancel()
		}
	}
	return c, nil
}

// attach attaches to the cluster at Options.Endpoints and claims the run's
// key prefix, which must hold no key yet (kept keys or not): deleting what
// is under it after the run must take nothing the run did not write, and
// a kept run must not have written over another's keys.
func (r *Runner) attach(ctx context.Context, be Backend) (Cluster, error) {
	ao := r.opts.Attach
	ao.Endpoints, ao.KeyPrefix = r.opts.Endpoints, r.opts.KeyPrefix
	c, err := be.Attach(ctx, ao)
	if err != nil {
		return c, err
	}
	ks, ok := c.(keyStore)
	if !ok {
		return c, nil
	}
	cctx, cancel := context.WithTimeout(ctx, countTimeout)
	err = ks.claimKeys(cctx, r.opts.KeyPrefix)
	cancel()
	if errors.Is(err, ErrPrefixInUse) {
		err = fmt.Errorf("%w: %q on %v (a run kept with --keep, or another running?); give another prefix", ErrPrefixInUse, r.opts.KeyPrefix, r.opts.Endpoints)
	}
	if err != nil {
		c.Close() // not cleaned up: what is there is not the run's to delete
		return nil, err
	}
	return c, nil
}

// versionTeller is a cluster whose servers tell their versions.
type versionTeller interface {
	// serverVersions is each member's version, "" where it did not say.
	serverVersions(ctx context.Context) []string
}

// versionsTimeout bounds asking a cluster's servers their versions, and
// countTimeout claiming the keys' prefix before a run.
const (
	versionsTimeout = 5 * time.Second
	countTimeout    = 30 * time.Second
)

// cleanupTimeout bounds the deletion of a run's keys: a cluster that no
// longer answers must not hold the run's end (an interrupted one's too).
const cleanupTimeout = time.Minute

// closeCluster stops the cluster of be and nodes if one runs.
func (r *Runner) closeCluster(be Backend, nodes int) {
	key := clusterKey{fmt.Sprintf("%#v", be), nodes}
	if c := r.clusters[key]; c != nil {
		if err := r.cleanUp(c); err != nil {
			r.cleanupErrs = append(r.cleanupErrs, err) // Close tells
		}
		c.Close()
		delete(r.clusters, key)
	}
}

// cleanUp deletes the keys the run wrote when c is an attached cluster
// and they are not to be kept, before c is closed. The deletion has a
// context of its own: the run's may have ended (SIGINT).
func (r *Runner) cleanUp(c Cluster) error {
	ks, ok := c.(keyStore)
	if !ok || len(r.opts.Endpoints) == 0 {
		return nil
	}
	if r.opts.KeepKeys {
		r.opts.Logf("keeping the keys under %q on %v", r.opts.KeyPrefix, c.Endpoints())
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	n, err := ks.deleteKeys(ctx, r.opts.KeyPrefix)
	if err != nil {
		err = fmt.Errorf("bench: deleting the keys under %q on %v (%d deleted): %w", r.opts.KeyPrefix, c.Endpoints(), n, err)
		r.opts.Logf("%v", err)
		return err
	}
	r.opts.Logf("deleted the %d keys under %q on %v", n, r.opts.KeyPrefix, c.Endpoints())
	return nil
}

func (r *Runner) topologyLeader() int {
	if r.opts.Topology != nil {
		return r.opts.Topology.Leader
	}
	return 0
}

// settle moves leadership back to the topology's leader (trials must start
// from the same state) and restarts members a failover killed.
func (r *Runner) settle(ctx context.Context, cl Cluster) error {
	f := cl.Faults()
	if f == nil || r.topologyLeader() < 0 {
		return nil
	}
	return f.MoveLeader(ctx, r.topologyLeader())
}

// measured is the comparison Options.Measured holds for ps's variant v
// with all of ps's policies and trials, or nil. It is rebuilt as this
// run would have built it: the scenario's metrics and notes for this
// layout and size.
func (r *Runner) measured(ps plannedScenario, v variant) *Comparison {
	cpu := ""
	if len(r.opts.Endpoints) == 0 {
		cpu = CPUMode(ps.backend, ps.nodes, r.opts.ClientCPU)
	}
	w := ps.workload
	v.apply(&w)
	for _, c := range r.opts.Measured {
		if c.Scenario != ps.def.name || c.Variant != v.label || c.CPU != cpu || c.Topology != r.opts.TopologyName || len(c.Trials) != len(ps.policies) {
			continue
		}
		complete := true
		for _, p := range ps.policies {
			ts := c.Trials[p]
			complete = complete && len(ts) == ps.trials
			for _, t := range ts {
				// The cluster's size from the client's counts per member, or
				// the members' own where the client keeps none (stock).
				members := len(t.ReadsByMember)
				if t.ReadsByMember == nil {
					members = len(t.ServerReadsByMember)
				}
				complete = complete && t.Backend == ps.backend.Name() && t.Workload != nil && *t.Workload == w && members == ps.nodes
			}
		}
		if !complete {
			continue
		}
		reused := &Comparison{Scenario: c.Scenario, Variant: c.Variant, Section: ps.def.section, Baseline: ps.baseline,
			Policies: ps.policies, Metrics: ps.def.metrics(ps.nodes), Trials: c.Trials, Notes: slices.Clone(ps.def.notes), CPU: c.CPU, Topology: c.Topology}
		reused.noteLeaderChanges(ps.def.failover)
		return reused
	}
	return nil
}

// noteLeaderChanges notes the trials during which the leader moved, in a
// scenario that does not move it on purpose (failover).
func (c *Comparison) noteLeaderChanges(failover bool) {
	changed := 0
	for _, ts := range c.Trials {
		for _, t := range ts {
			if t.LeaderChanged && !failover {
				changed++
			}
		}
	}
	if changed > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("The leader changed during %d trial(s), which are not steady-state.", changed))
	}
}

func (r *Runner) runScenario(ctx context.Context, ps plannedScenario) ([]*Comparison, error) {
	var comps []*Comparison
	var cl Cluster // started for the first variant not measured before
	for _, v := range ps.variants {
		if c := r.measured(ps, v); c != nil {
			comps = append(comps, c)
			r.finished(c)
			continue
		}
		if cl == nil {
			var err error
			if cl, err = r.cluster(ctx, ps.backend, ps.nodes); err != nil {
				return comps, err
			}
			if _, sim := ps.backend.(simBackend); sim != isSimulated(cl) {
				return comps, fmt.Errorf("scenario %s: a %s cluster for backend %s", ps.def.name, cl.Endpoints(), ps.backend.Name())
			}
			if ps.def.prepare != nil {
				if err := ps.def.prepare(ctx, cl); err != nil {
					return comps, err
				}
			}
			if ps.def.cleanup != nil {
				defer ps.def.cleanup(context.WithoutCancel(ctx), cl)
			}
		}
		w := ps.workload
		v.apply(&w)
		if err := w.Validate(); err != nil {
			return comps, err
		}
		comp := &Comparison{Scenario: ps.def.name, Variant: v.label, Section: ps.def.section, Baseline: ps.baseline,
			Policies: ps.policies, Metrics: ps.def.metrics(ps.nodes), Trials: map[string][]Result{}, Notes: slices.Clone(ps.def.notes), Topology: r.opts.TopologyName}
		comp.Notes = append(comp.Notes, ps.notes...)
		if len(r.opts.Endpoints) == 0 {
			comp.CPU = CPUMode(ps.backend, ps.nodes, r.opts.ClientCPU)
		}
		comps = append(comps, comp)
		if err := r.runVariant(ctx, cl, ps, w, comp); err != nil {
			return comps, err
		}
		r.finished(comp)
	}
	return comps, nil
}

func (r *Runner) finished(c *Comparison) {
	if r.opts.Finished != nil {
		r.opts.Finished(c)
	}
}

func (r *Runner) runVariant(ctx context.Context, cl Cluster, ps plannedScenario, w Workload, comp *Comparison) error {
	if !isSimulated(cl) {
		// Preload the key space once per variant with the variant's value size.
		loader, err := cl.Connect(ctx, router.Hybrid, w.ConnsPerMember)
		if err != nil {
			return err
		}
		err = preload(ctx, loader, w, keySpace(r.opts.KeyPrefix))
		loader.Close()
		if err != nil {
			return err
		}
	}
	for trial := range ps.trials {
		// Rotate the order so that no policy always runs first.
		order := slices.Clone(comp.Policies)
		k := trial % len(order)
		order = append(order[k:], order[:k]...)
		for _, policy := range order {
			res, err := r.runOne(ctx, cl, ps, w, comp.Variant, policy, trial)
			if err != nil {
				return fmt.Errorf("%s %s trial %d: %w", comp.Variant, policy, trial+1, err)
			}
			res.CPUMode, res.Topology = comp.CPU, comp.Topology
			comp.Trials[policy] = append(comp.Trials[policy], res)
		}
	}
	comp.noteLeaderChanges(ps.def.failover)
	return nil
}

func (r *Runner) runOne(ctx context.Context, cl Cluster, ps plannedScenario, w Workload, variant, policy string, trial int) (Result, error) {
	if sc, _ := cl.(*simCluster); sc != nil {
		if r.opts.Progress != nil {
			r.opts.Progress.Start(fmt.Sprintf("%s · %s · %s · trial %d/%d (simulated)", ps.def.name, variant, policy, trial+1, ps.trials), w.Warmup+w.Duration)
			defer r.opts.Progress.Finish()
		}
		res, err := sc.Simulate(ctx, policy, w, trial)
		res.Scenario, res.Backend, res.Policy, res.Trial, res.Variant = ps.def.name, ps.backend.Name(), policy, trial+1, variant
		return res, err
	}
	if err := r.settle(ctx, cl); err != nil {
		return Result{}, err
	}
	label := fmt.Sprintf("%s · %s · trial %d/%d", ps.def.name, policy, trial+1, ps.trials)
	if len(ps.variants) > 1 {
		label = fmt.Sprintf("%s · %s · %s · trial %d/%d", ps.def.name, variant, policy, trial+1, ps.trials)
	}
	cli, err := cl.Connect(ctx, policy, w.ConnsPerMember)
	if err != nil {
		return Result{}, err
	}
	defer cli.Close()
	spec := trialSpec{workload: w, trial: trial, keys: keySpace(r.opts.KeyPrefix)}
	var kill, newLeader time.Time
	killed := -1
	if ps.def.failover {
		spec.timeline = true
		spec.during = func(runCtx context.Context, windowStart time.Time) {
			select {
			case <-time.After(time.Until(windowStart.Add(w.Duration / 3))):
			case <-runCtx.Done():
				return
			}
			leader, err := cl.Leader(runCtx)
			if err != nil {
				return
			}
			kill = time.Now()
			if cl.Faults().Kill(leader) != nil {
				return
			}
			killed = leader
			for runCtx.Err() == nil {
				if l, err := cl.Leader(runCtx); err == nil && l != leader {
					newLeader = time.Now()
					return
				}
				time.Sleep(10 * time.Millisecond) // polling the servers' view
			}
		}
	}
	if r.opts.Progress != nil {
		r.opts.Progress.Start(label, w.Warmup+w.Duration)
		defer r.opts.Progress.Finish()
	}
	out, err := runTrial(ctx, cl, cli, spec)
	ended := time.Now()
	if killed >= 0 {
		if rerr := cl.Faults().Restart(context.WithoutCancel(ctx), killed); rerr != nil && err == nil {
			err = rerr
		}
		if !kill.IsZero() {
			// Beside a CountingClient's counts, if any.
			ft := failoverTimes(out.events, kill, newLeader, ended)
			if out.res.Extra == nil {
				out.res.Extra = ft
			} else {
				maps.Copy(out.res.Extra, ft)
			}
		}
	}
	if err != nil {
		return Result{}, err
	}
	res := out.res
	res.Scenario, res.Backend, res.Policy, res.Trial = ps.def.name, ps.backend.Name(), policy, trial+1
	res.Variant = variant
	return res, nil
}
