package bench

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

func TestMeasuredJSON(t *testing.T) {
	in := CostSample{Class: "c", Leader: 12.5, Placed: Measured(math.NaN()), Proxies: 3}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"placed_us":null`) || !strings.Contains(string(b), `"leader_us":12.5`) {
		t.Errorf("JSON %s: want Placed null, Leader 12.5", b)
	}
	var out CostSample
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(float64(out.Placed)) || out.Leader != 12.5 || out.Proxies != 3 {
		t.Errorf("round trip: %+v", out)
	}
}

// TestCostAttribution: each member's figure goes to its role; a class on
// the leader has no follower placed on, and the others are summed.
func TestCostAttribution(t *testing.T) {
	s := classSample{members: []float64{10, 20, 30}}
	s.attribute(1, 0, true)
	if s.Leader != 20 || s.Placed != 10 || s.Others != 30 {
		t.Errorf("on follower 0, leader 1: %+v", s.CostSample)
	}
	s.attribute(1, 0, false)
	if s.Leader != 20 || !math.IsNaN(float64(s.Placed)) || s.Others != 40 {
		t.Errorf("on leader 1: %+v", s.CostSample)
	}
}

func TestCostsMarkdown(t *testing.T) {
	nan := Measured(math.NaN())
	rep := CostReport{Backend: "etcd", CPUMode: "CPU: budgets", Workers: 8, Window: "5s",
		Idle: []IdleCores{{Leader: 0.01, Follower: 0.02, Proxies: nan, Client: 0.1}, {Leader: 0.03, Follower: 0.02, Proxies: nan, Client: 0.1}},
		Samples: []CostSample{
			{Class: "read at leader", Trial: 1, OpsPS: 1000, Leader: 100, Placed: nan, Others: 40, Proxies: nan, Client: 50},
			{Class: "read at leader", Trial: 2, OpsPS: 1200, Leader: 120, Placed: nan, Others: 44, Proxies: nan, Client: 52},
		}}
	md := CostsMarkdown(rep)
	for _, want := range []string{"| read at leader | 1100 (1000–1200) | 110 (100–120) | – | 42 (40–44) | – |", "leader 0.020 (0.010–0.030)", "proxies (all members) –, client 0.100 (0.100–0.100)", "CPU: budgets"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestCostsOnTheBed: the costs scenario on a real etcd cluster with its
// proxies apart measures every class without errors, tells the proxies'
// CPU apart, and sees the bytes each operation carries.
func TestCostsOnTheBed(t *testing.T) {
	testutil.NeedsServers(t)
	r, err := NewRunner(Options{Backend: WithProxiesApart(Etcd{}), Workload: DefaultWorkload()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const workers = 4
	rep, err := r.RunCosts(ctx, CostOptions{Workers: workers, Window: 700 * time.Millisecond, Trials: 1, Keys: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Samples) != len(DefaultCostClasses()) || len(rep.Idle) != 1 || math.IsNaN(float64(rep.Idle[0].Proxies)) {
		t.Fatalf("%d samples, idle %+v; want %d and one idle window with the proxies' part", len(rep.Samples), rep.Idle, len(DefaultCostClasses()))
	}
	for i, s := range rep.Samples {
		c := DefaultCostClasses()[i]
		// The proxies' figure is a difference of 10 ms ticks over a short
		// window: measured, not necessarily positive.
		if s.Class != c.Name || s.Ops == 0 || s.Errors != 0 || math.IsNaN(float64(s.Leader)) || math.IsNaN(float64(s.Proxies)) {
			t.Errorf("%s: %+v; want operations without errors, the leader's and the proxies' CPU measured", c.Name, s)
		}
		if c.Follower == math.IsNaN(float64(s.Placed)) {
			t.Errorf("%s: follower placed on %v", c.Name, s.Placed)
		}
		// The bytes and the operations are counted over edges a few
		// milliseconds apart: a worker's operation in flight at either
		// edge may be counted with its bytes outside the window. So at
		// least the value's bytes for all but 2·workers operations.
		floor := float64(c.ValueSize) * (1 - 2*float64(workers)/float64(max(s.Ops, 1)))
		if !c.Write && s.ClientBytes < floor {
			t.Errorf("%s: %.0f client bytes per read of %d bytes over %d reads (floor %.0f)", c.Name, s.ClientBytes, c.ValueSize, s.Ops, floor)
		}
		if c.Write && s.PeerBytes < floor {
			t.Errorf("%s: %.0f peer bytes per write of %d bytes over %d writes (floor %.0f): not replicated through the proxies?", c.Name, s.PeerBytes, c.ValueSize, s.Ops, floor)
		}
	}
	if md := CostsMarkdown(rep); !strings.Contains(md, "in processes of their own, the members' proxies") {
		t.Errorf("CPU line does not say the proxies run apart:\n%s", md)
	}
}
