package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/oproute/oproute/tools/sim"
)

// ErrCostsMissing: a costs report lacks a class that fitting needs.
var ErrCostsMissing = errors.New("bench: the costs report lacks a class")

// CostFit is simulator costs fitted to a costs report, with how the model
// on them meets each measured figure.
type CostFit struct {
	Costs sim.Costs
	// MessageFrom says where Costs.Message came from.
	MessageFrom string
	// Checks are every measured figure beside the model's, the ones the
	// fit did not use as well as the ones it did.
	Checks []CostCheck
}

// CostCheck is one measured figure (the median over trials, µs per
// operation) beside the model's on the fitted costs.
type CostCheck struct {
	Class, Role       string
	Measured, Modeled float64
}

// costRole is one member's role in a class's measurement.
type costRole int

const (
	roleLeader costRole = iota
	rolePlaced
	roleOthers
)

func (r costRole) String() string { return [...]string{"leader", "follower placed on", "others"}[r] }

// costCell is where a figure comes from: a class (by its shape) and a role.
type costCell struct {
	write, follower bool
	large           bool // the largest read
	role            costRole
}

// SimCostsFrom fits the simulator's per-step costs to what the costs
// scenario measured on a 3-member cluster of store ("etcd" confirms its
// leadership on every read, "zk" does not): each cost from the figure in
// which it is the one unknown left, in turn (sim.Cluster.OperationCPU
// gives every figure's terms). Message comes from the followers' CPU for
// etcd's leadership confirmations, else from the proxies' CPU per message
// (ZooKeeper's proxies always run apart), else 0; MessagePerKiB is left at
// 0 (what a message's size costs lands in PerKiB); CV at 0. A cost that
// comes out negative is 0. Every figure measured is then checked against
// the model on the fitted costs (Checks).
func SimCostsFrom(rep CostReport, store string) (CostFit, error) {
	var fit CostFit
	small, large := -1, -1
	for _, c := range rep.Classes {
		if !c.Write && c.Follower {
			if small < 0 || c.ValueSize < small {
				small = c.ValueSize
			}
			large = max(large, c.ValueSize)
		}
	}
	if small < 0 || large <= small {
		return fit, fmt.Errorf("%w: reads of two sizes at a follower", ErrCostsMissing)
	}
	measured := map[costCell]float64{}
	proxies := map[costCell]float64{}
	for _, c := range rep.Classes {
		if !c.Write && c.Follower && c.ValueSize != small && c.ValueSize != large || c.Write && c.ValueSize != small {
			continue // a size the fit does not use
		}
		var roles [3][]float64
		var px []float64
		for _, s := range rep.Samples {
			if s.Class != c.Name {
				continue
			}
			for r, v := range [3]Measured{s.Leader, s.Placed, s.Others} {
				if !math.IsNaN(float64(v)) {
					roles[r] = append(roles[r], float64(v))
				}
			}
			if !math.IsNaN(float64(s.Proxies)) {
				px = append(px, float64(s.Proxies))
			}
		}
		for r, v := range roles {
			if len(v) > 0 {
				slices.Sort(v)
				measured[costCell{c.Write, c.Follower, c.ValueSize == large && !c.Write, costRole(r)}] = medianSorted(v)
			}
		}
		if len(px) > 0 {
			slices.Sort(px)
			proxies[costCell{c.Write, c.Follower, c.ValueSize == large && !c.Write, roleLeader}] = medianSorted(px)
		}
	}
	read := func(follower, large bool, role costRole) costCell { return costCell{false, follower, large, role} }
	write := func(follower bool, role costRole) costCell { return costCell{true, follower, false, role} }
	need := []costCell{read(false, false, roleLeader), read(false, false, roleOthers), read(true, false, roleLeader), read(true, false, rolePlaced),
		read(true, true, rolePlaced), write(false, roleLeader), write(false, roleOthers), write(true, rolePlaced)}
	for _, c := range need {
		if _, ok := measured[c]; !ok {
			return fit, fmt.Errorf("%w: %s of a %s", ErrCostsMissing, c.role, c.describe(small, large))
		}
	}

	cl := sim.Cluster{Members: []sim.Member{{ID: "m0"}, {ID: "m1"}, {ID: "m2"}}, Leader: 0, ConfirmReads: store == "etcd"}
	size := func(c costCell) int {
		if c.large {
			return large
		}
		return small
	}
	// modeled is figure c under costs.
	modeled := func(costs sim.Costs, c costCell) float64 {
		cl := cl
		cl.Costs = costs
		at := 0
		if c.follower {
			at = 1
		}
		w := sim.Workload{ValueSize: size(c), RangeSize: 1}
		cpu, err := cl.OperationCPU(c.write, at, w)
		if err != nil {
			panic(err) // a fixed, valid cluster
		}
		switch c.role {
		case roleLeader:
			return us(cpu[0])
		case rolePlaced:
			return us(cpu[1])
		}
		if c.follower {
			return us(cpu[2])
		}
		return us(cpu[1] + cpu[2])
	}
	// solve sets *field so that figure c's model meets its measure, the
	// other costs as they are: the figure is linear in each cost.
	costs := sim.Costs{}
	solve := func(field *time.Duration, c costCell) {
		*field = 0
		base := modeled(costs, c)
		*field = time.Microsecond
		per := modeled(costs, c) - base
		*field = 0
		if per > 0 {
			*field = time.Duration(max(0, (measured[c]-base)/per) * float64(time.Microsecond))
		}
	}
	switch {
	case cl.ConfirmReads:
		solve(&costs.Message, read(false, false, roleOthers))
		fit.MessageFrom = "the followers' CPU for the leader's confirmations of its reads"
	case len(proxies) > 0:
		c := read(false, false, roleLeader)
		if px, ok := proxies[c]; ok {
			// The proxies' CPU for a read at the leader, per message the
			// model has a member take for it.
			probe := sim.Costs{Message: time.Microsecond}
			n := 0.0
			for _, r := range []costRole{roleLeader, roleOthers} {
				cc := c
				cc.role = r
				n += modeled(probe, cc)
			}
			if n > 0 {
				costs.Message = time.Duration(px / n * float64(time.Microsecond))
				fit.MessageFrom = "the proxies' CPU per message of a read at the leader"
			}
		}
	}
	if fit.MessageFrom == "" {
		fit.MessageFrom = "nowhere: 0 (no confirmations, no proxies apart)"
	}
	// PerKiB from the two sizes of a read at a follower.
	big, little := read(true, true, rolePlaced), read(true, false, rolePlaced)
	perKiB := (measured[big] - measured[little]) / (float64(large-small) / 1024)
	costs.PerKiB = time.Duration(max(0, perKiB) * float64(time.Microsecond))
	solve(&costs.LeaderRead, read(false, false, roleLeader))
	solve(&costs.FollowerRead, read(true, false, rolePlaced))
	solve(&costs.ReadIndex, read(true, false, roleLeader))
	solve(&costs.Write, write(false, roleLeader))
	solve(&costs.Append, write(false, roleOthers))
	solve(&costs.Forward, write(true, rolePlaced))
	fit.Costs = costs
	var cells []costCell
	for c := range measured {
		cells = append(cells, c)
	}
	slices.SortFunc(cells, func(a, b costCell) int { return strings.Compare(a.sortKey(), b.sortKey()) })
	for _, c := range cells {
		fit.Checks = append(fit.Checks, CostCheck{Class: c.describe(small, large), Role: c.role.String(), Measured: measured[c], Modeled: modeled(costs, c)})
	}
	return fit, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (c costCell) describe(small, large int) string {
	size := small
	if c.large {
		size = large
	}
	what, where := "read", "the leader"
	if c.write {
		what = "write"
	}
	if c.follower {
		where = "a follower"
	}
	return fmt.Sprintf("%d-byte %s at %s", size, what, where)
}

func (c costCell) sortKey() string {
	return fmt.Sprintf("%v%v%v%d", c.write, c.follower, c.large, c.role)
}

// CostFitMarkdown renders a fit: the costs, then each figure measured
// beside the model's.
func CostFitMarkdown(fit CostFit) string {
	var b strings.Builder
	c := fit.Costs
	fmt.Fprintf(&b, "Fitted costs: leader read %v, read index %v, follower read %v, write %v, append %v, forward %v, per KiB %v, message %v (from %s).\n\n",
		c.LeaderRead, c.ReadIndex, c.FollowerRead, c.Write, c.Append, c.Forward, c.PerKiB, c.Message, fit.MessageFrom)
	b.WriteString("| Class | Member | Measured (µs/op) | Model (µs/op) | Model / measured |\n|---|---|---|---|---|\n")
	for _, k := range fit.Checks {
		ratio := "–"
		if k.Measured > 0 {
			ratio = fmt.Sprintf("%.2f", k.Modeled/k.Measured)
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %s |\n", k.Class, k.Role, k.Measured, k.Modeled, ratio)
	}
	return b.String()
}
