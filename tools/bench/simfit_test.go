package bench

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/sim"
)

// modelReport is the costs report the model itself would give on costs:
// each class's figures from sim.Cluster.OperationCPU, in two trials, the
// proxies' CPU (with proxies apart) as proxyShare of each message's cost.
func modelReport(t *testing.T, costs sim.Costs, store string, proxyShare float64) CostReport {
	t.Helper()
	cl := sim.Cluster{Members: []sim.Member{{ID: "m0"}, {ID: "m1"}, {ID: "m2"}}, Costs: costs, ConfirmReads: store == "etcd"}
	msgs := cl
	msgs.Costs = sim.Costs{Message: time.Microsecond}
	rep := CostReport{Backend: store, Classes: DefaultCostClasses()}
	nan := Measured(math.NaN())
	for trial := 1; trial <= 2; trial++ {
		for _, c := range rep.Classes {
			at := 0
			if c.Follower {
				at = 1
			}
			w := sim.Workload{ValueSize: c.ValueSize, RangeSize: 1}
			cpu, err := cl.OperationCPU(c.Write, at, w)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := msgs.OperationCPU(c.Write, at, w)
			s := CostSample{Class: c.Name, Trial: trial, Ops: 1000, Leader: Measured(us(cpu[0])), Placed: nan, Others: Measured(us(cpu[1] + cpu[2])), Proxies: nan}
			if c.Follower {
				s.Placed, s.Others = Measured(us(cpu[1])), Measured(us(cpu[2]))
			}
			if proxyShare > 0 {
				s.Proxies = Measured(proxyShare * us(costs.Message) * us(n[0]+n[1]+n[2]))
			}
			rep.Samples = append(rep.Samples, s)
		}
	}
	return rep
}

// TestSimCostsFromRecoversTheModel: fitted to the figures the model gives
// on known costs, the fit finds those costs again (to the µs its figures
// are rounded to), and every figure checks.
func TestSimCostsFromRecoversTheModel(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func() time.Duration { return time.Duration(5+rnd.IntN(300)) * time.Microsecond }
	for i := range 20 {
		want := sim.Costs{LeaderRead: pick(), ReadIndex: pick(), FollowerRead: pick(), Write: pick(), Append: pick(), Forward: pick(), PerKiB: pick() / 10, Message: pick() / 5}
		for _, store := range []string{"etcd", "zk"} {
			fit, err := SimCostsFrom(modelReport(t, want, store, 1), store)
			if err != nil {
				t.Fatal(err)
			}
			got := fit.Costs
			for name, pair := range map[string][2]time.Duration{
				"LeaderRead": {got.LeaderRead, want.LeaderRead}, "ReadIndex": {got.ReadIndex, want.ReadIndex}, "FollowerRead": {got.FollowerRead, want.FollowerRead},
				"Write": {got.Write, want.Write}, "Append": {got.Append, want.Append}, "Forward": {got.Forward, want.Forward},
				"PerKiB": {got.PerKiB, want.PerKiB}, "Message": {got.Message, want.Message},
			} {
				if d := pair[0] - pair[1]; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("set %d, %s: %s fitted %v, want %v (from %s)", i, store, name, pair[0], pair[1], fit.MessageFrom)
				}
			}
			for _, k := range fit.Checks {
				if math.Abs(k.Modeled-k.Measured) > 5 {
					t.Errorf("set %d, %s: %s, %s: model %.1f µs, measured %.1f", i, store, k.Class, k.Role, k.Modeled, k.Measured)
				}
			}
		}
	}
}

// TestSimCostsFromSaysWhatIsMissing: a report without reads of two sizes
// at a follower, or without a class the fit needs, is refused by name.
func TestSimCostsFromSaysWhatIsMissing(t *testing.T) {
	rep := modelReport(t, SimCosts(), "etcd", 0)
	rep.Classes = rep.Classes[:4] // no 16 KiB read
	if _, err := SimCostsFrom(rep, "etcd"); !errors.Is(err, ErrCostsMissing) {
		t.Errorf("one read size: %v, want ErrCostsMissing", err)
	}
	rep = modelReport(t, SimCosts(), "etcd", 0)
	rep.Classes = append(rep.Classes[:1], rep.Classes[2:]...) // no write through a follower
	if _, err := SimCostsFrom(rep, "etcd"); !errors.Is(err, ErrCostsMissing) || !strings.Contains(err.Error(), "write at a follower") {
		t.Errorf("no forwarded write: %v, want ErrCostsMissing naming it", err)
	}
}
