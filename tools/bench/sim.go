package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/sim"
	"github.com/oproute/oproute/tools/testbed"
)

// SimCosts are the simulated members' costs routebench --sim uses: not
// measured yet (a read 100 µs of CPU where it is served, the leader's part
// of a follower's read 50 µs, a write 200 µs, an append 100 µs, forwarding
// a write 50 µs; sizes and messages cost nothing), so that its figures say
// what the model does with the router, not what etcd or ZooKeeper do.
func SimCosts() sim.Costs {
	return sim.Costs{LeaderRead: 100 * time.Microsecond, ReadIndex: 50 * time.Microsecond, FollowerRead: 100 * time.Microsecond,
		Write: 200 * time.Microsecond, Append: 100 * time.Microsecond, Forward: 50 * time.Microsecond}
}

// ErrSimulated: the scenario or the call needs a real cluster.
var ErrSimulated = errors.New("bench: not on a simulated cluster")

// SimBackend is store ("etcd" or "zk") simulated in virtual time
// (package sim) on costs: routebench --sim. etcd confirms its leadership
// for every read index, a ZooKeeper sync does not. Its clusters take the
// test bed's topologies; its trials run the scenario's workload on the
// real router, each policy's and trial's the same for the seed.
// The scenarios of the other store (the zk-* ones under etcd) take the
// same costs.
func SimBackend(costs sim.Costs, store string) (Backend, error) {
	return SimBackendOf(map[string]sim.Costs{"etcd": costs, "zk": costs}, store)
}

// SimBackendOf is SimBackend with each store's own costs (fitted to its
// costs run, say): a scenario runs on those of the store it simulates,
// SimCosts for a store without any.
func SimBackendOf(costs map[string]sim.Costs, store string) (Backend, error) {
	if _, ok := builtinBackends[store]; !ok {
		return nil, fmt.Errorf("bench: unknown store %q to simulate (want etcd or zk)", store)
	}
	for s := range costs {
		if _, ok := builtinBackends[s]; !ok {
			return nil, fmt.Errorf("bench: costs for an unknown store %q", s)
		}
	}
	return simBackend{costs: costs, store: store}, nil
}

type simBackend struct {
	costs map[string]sim.Costs // by store
	store string
	// cores, when set, is each member's CPU capacity (a scenario's
	// budgets, in cores); else one core each.
	cores []float64
}

func (simBackend) Name() string { return "sim" }

// on is b simulating store.
func (b simBackend) on(store string) simBackend {
	b.store = store
	return b
}

// storeCosts are the costs of the store b simulates.
func (b simBackend) storeCosts() sim.Costs {
	if c, ok := b.costs[b.store]; ok {
		return c
	}
	return SimCosts()
}

// storeOf is the store be runs, or simulates.
func storeOf(be Backend) string {
	if sb, ok := be.(simBackend); ok {
		return sb.store
	}
	return be.Name()
}

func isSimulated(cl Cluster) bool {
	_, ok := cl.(*simCluster)
	return ok
}

func (b simBackend) Start(_ context.Context, topo testbed.Topology) (Cluster, error) {
	return &simCluster{backend: b, topo: topo}, nil
}

func (simBackend) Attach(context.Context, AttachOptions) (Cluster, error) {
	return nil, fmt.Errorf("%w: attaching to endpoints", ErrSimulated)
}

// simCluster is a simulated cluster: it has no connections, servers or
// fault knobs; its trials run in Simulate.
type simCluster struct {
	backend simBackend
	topo    testbed.Topology
}

func (c *simCluster) Size() int { return len(c.topo.Zones) }

func (c *simCluster) Endpoints() []string {
	var eps []string
	for i := range c.topo.Zones {
		eps = append(eps, fmt.Sprint("m", i))
	}
	return eps
}

func (c *simCluster) leader() int { return max(c.topo.Leader, 0) }

func (c *simCluster) Leader(context.Context) (int, error) { return c.leader(), nil }

func (c *simCluster) Connect(context.Context, string, int) (Client, error) {
	return nil, fmt.Errorf("%w: a client connection", ErrSimulated)
}

func (c *simCluster) Served(context.Context) ([]Served, error) { return nil, nil }
func (c *simCluster) ServerCPU() []time.Duration               { return nil }
func (c *simCluster) Traffic() (testbed.TrafficCounts, error) {
	return testbed.TrafficCounts{}, ErrNeedsTestbed
}
func (c *simCluster) Faults() Faults { return nil }
func (c *simCluster) Close() error   { return nil }

// model is the simulated cluster: the topology's zones and delays, ± its
// jitter, and the backend's costs.
func (c *simCluster) model() sim.Cluster {
	t := c.topo
	same, cross := time.Duration(t.SameZone), time.Duration(t.CrossZone)
	jitter := t.Jitter
	cl := sim.Cluster{Leader: c.leader(), Costs: c.backend.storeCosts(), ClientZone: t.ClientZone, ConfirmReads: c.backend.store == "etcd",
		Link: func(a, b string) sim.Link {
			d := cross
			if a == b {
				d = same
			}
			return sim.Link{Delay: d, Jitter: time.Duration(jitter * float64(d))}
		}}
	for i, z := range t.Zones {
		m := sim.Member{ID: fmt.Sprint("m", i), Zone: z}
		if i < len(c.backend.cores) {
			m.Cores = c.backend.cores[i]
		}
		cl.Members = append(cl.Members, m)
	}
	return cl
}

// simPolicy is the router policy that stands for policy in a simulation:
// stock clientv3 spreads every call in turn (round_robin).
func simPolicy(policy string) (string, error) {
	switch {
	case policy == Stock:
		return router.RoundRobin, nil
	case policy == HybridP2C:
		return router.HybridP2C, nil
	case slices.Contains(router.Policies(), policy):
		return policy, nil
	}
	return "", fmt.Errorf("%w: policy %s", ErrSimulated, policy)
}

// Simulate runs one trial of w under policy, its warm-up and measured
// window in virtual time.
func (c *simCluster) Simulate(ctx context.Context, policy string, w Workload, trial int) (Result, error) {
	p, err := simPolicy(policy)
	if err != nil {
		return Result{}, err
	}
	out, err := sim.Run(ctx, router.Config{Policy: p}, c.model(), sim.Workload{
		Workers: w.Workers, ReadRatio: w.ReadRatio, Rate: w.Rate, ValueSize: w.ValueSize, RangeSize: w.RangeSize,
		Duration: w.Warmup + w.Duration, WarmupTime: w.Warmup,
	}, w.Seed+uint64(trial)*0x9e3779b9)
	if err != nil {
		return Result{}, err
	}
	res := Result{Workers: w.Workers, ThroughputOps: out.Throughput(), Errors: int64(out.Errors), Workload: &w}
	res.setLatencies(out.Reads, out.Writes)
	for i := range out.Served {
		res.ReadsByMember = append(res.ReadsByMember, uint64(out.ServedReads[i]))
		res.WritesByMember = append(res.WritesByMember, uint64(out.Served[i]-out.ServedReads[i]))
	}
	for _, m := range out.Stats.Members {
		res.EjectionsByMember = append(res.EjectionsByMember, uint64(m.Ejections))
	}
	return res, nil
}

// simulatedPlan refuses what a simulation cannot run (faults, a leader
// kill, steps of a scenario's own, the overhead comparison, where stock
// runs as round_robin, and the soak's windows) and gives members a
// scenario's own budgets as their capacities.
func simulatedPlan(ps *plannedScenario) error {
	d := ps.def
	if d.faults || d.failover || d.prepare != nil || d.cleanup != nil || d.name == ScenarioOverhead || d.name == ScenarioSoak {
		return fmt.Errorf("%w: it needs the test bed's faults or clients", ErrSimulated)
	}
	if d.memberCPUs != nil {
		sb := ps.backend.(simBackend)
		sb.cores = d.memberCPUs
		ps.backend = sb
	}
	return nil
}

// simulable leaves out of ps the policies a simulation cannot run (a
// pinned client, Oracle, StaticLeader, hedging, EveryRound), with a note;
// the baseline must stay.
func simulable(ps *plannedScenario, logf func(string, ...any)) error {
	var left []string
	ps.policies = slices.DeleteFunc(slices.Clone(ps.policies), func(p string) bool {
		_, err := simPolicy(p)
		if err != nil {
			left = append(left, p)
		}
		return err != nil
	})
	if slices.Contains(left, ps.baseline) {
		return fmt.Errorf("%w: the baseline %s", ErrSimulated, ps.baseline)
	}
	if len(left) > 0 {
		logf("scenario %s: leaving out %s (not modeled)", ps.def.name, strings.Join(left, ", "))
		ps.notes = append(ps.notes, fmt.Sprintf("Simulated: %s left out (not modeled).", strings.Join(left, ", ")))
	}
	if slices.Contains(ps.policies, Stock) {
		ps.notes = append(ps.notes, "Simulated: stock clientv3 runs as round_robin, which is what its balancer does with every call.")
	}
	return nil
}
