package bench

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/sim"
)

// A scenario without faults runs on a simulated cluster, each policy's
// trials in virtual time, with the same tables; stock clientv3 stays the
// baseline (as round_robin), CPU is not measured (–), a scenario tied to
// ZooKeeper is simulated as ZooKeeper and not started on the test bed, and
// one with faults is refused before anything runs.
func TestSimulatedScenario(t *testing.T) {
	w := DefaultWorkload()
	w.Duration, w.Warmup = 5*time.Second, time.Second
	be, err := SimBackend(SimCosts(), "etcd")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRunner(Options{Backend: be, Workload: w, Trials: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	comps, err := r.Run(t.Context(), ScenarioQuick)
	if err != nil {
		t.Fatal(err)
	}
	if len(comps) == 0 {
		t.Fatal("no comparison")
	}
	for _, c := range comps {
		if c.Baseline != Stock {
			t.Errorf("%s: baseline %s, want %s", c.Scenario, c.Baseline, Stock)
		}
		for _, p := range c.Policies {
			if len(c.Trials[p]) != 2 {
				t.Fatalf("%s: %d trials of %s", c.Scenario, len(c.Trials[p]), p)
			}
			for _, res := range c.Trials[p] {
				if res.ThroughputOps <= 0 || res.ReadP50ms <= 0 || res.WriteP50ms <= 0 || res.Workload == nil {
					t.Fatalf("%s %s: %+v", c.Scenario, p, res)
				}
				if cpu := ServerCPU.Get(res); !math.IsNaN(cpu) {
					t.Fatalf("%s %s: server CPU %v on a simulated cluster, want – (NaN)", c.Scenario, p, cpu)
				}
			}
		}
	}
	zk, err := r.Run(t.Context(), ScenarioZKHealthy)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range zk {
		if !strings.Contains(c.CPU, CPUModeSimulated+" zk") {
			t.Fatalf("%s: %q, want a simulated ZooKeeper", c.Scenario, c.CPU)
		}
	}
	if _, err := r.Run(t.Context(), "degraded"); !errors.Is(err, ErrSimulated) {
		t.Fatalf("a scenario with faults on a simulated cluster: %v, want ErrSimulated", err)
	}
}

// TestSimBackendOfTakesEachStoresCosts: a scenario simulates its store on
// that store's costs, the placeholders where it has none.
func TestSimBackendOfTakesEachStoresCosts(t *testing.T) {
	e, z := SimCosts(), SimCosts()
	e.Write, z.Write = 111*time.Microsecond, 999*time.Microsecond
	for _, tc := range []struct {
		costs map[string]sim.Costs
		want  sim.Costs
	}{{map[string]sim.Costs{"etcd": e, "zk": z}, z}, {map[string]sim.Costs{"etcd": e}, SimCosts()}} {
		be, err := SimBackendOf(tc.costs, "etcd")
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewRunner(Options{Backend: be, Workload: DefaultWorkload()})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := r.plan(ScenarioZKHealthy)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := ps.backend.(simBackend).storeCosts(); got != tc.want {
			t.Errorf("costs %v: zk-healthy simulated on %+v, want %+v", tc.costs, got, tc.want)
		}
	}
	if _, err := SimBackendOf(map[string]sim.Costs{"mongo": e}, "etcd"); err == nil {
		t.Error("costs for an unknown store accepted")
	}
}
