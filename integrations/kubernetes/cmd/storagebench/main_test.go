package main

import (
	"testing"
	"time"

	"github.com/oproute/oproute/tools/bench"
)

// TestStorageBench runs the benchmark briefly (one trial of each mix, stock
// and hybrid) on a test-bed cluster: every create and get goes through the
// etcd3 store without an error, and by the members' own counts hybrid's
// writes all reach the leader while stock spreads them.
func TestStorageBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	w := bench.DefaultWorkload()
	w.Duration, w.Warmup, w.Keys = 2*time.Second, 500*time.Millisecond, 200
	r, err := bench.NewRunner(bench.Options{Backend: storageBackend{}, Workload: w, Trials: 1,
		Policies: []string{bench.Stock, "hybrid"}, Set: map[string]bool{"duration": true}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	comps, err := r.Run(t.Context(), bench.ScenarioKubernetes)
	if err != nil {
		t.Fatal(err)
	}
	if len(comps) != 2 {
		t.Fatalf("%d comparisons, want the two mixes", len(comps))
	}
	atLeader := bench.MemberWriteShare(0) // the test bed's leader
	for _, c := range comps {
		for _, policy := range c.Policies {
			res := c.Trials[policy][0]
			// A rare write refused by the members themselves with
			// "etcdserver: request timed out" within milliseconds, for stock
			// and hybrid alike (2 of 11 runs with one core kept busy, one
			// error each; 3 in 2,365 operations in a run from empty caches):
			// tolerated up to one in two hundred operations, where a store
			// path that fails its operations fails far more.
			if ops := res.Writes + res.Reads; res.Errors*200 > ops || res.Writes == 0 || res.Reads == 0 {
				t.Errorf("%s %s: %d errors, %d writes, %d reads", c.Variant, policy, res.Errors, res.Writes, res.Reads)
			} else if res.Errors > 0 {
				t.Logf("%s %s: %d errors in %d operations", c.Variant, policy, res.Errors, ops)
			}
		}
		if share := atLeader.Get(c.Trials["hybrid"][0]); share < 99 {
			t.Errorf("%s: hybrid sent %.1f%% of the writes to the leader, want ≥ 99%%", c.Variant, share)
		}
		if share := atLeader.Get(c.Trials[bench.Stock][0]); share > 60 {
			t.Errorf("%s: stock sent %.1f%% of the writes to the leader: not spread", c.Variant, share)
		}
	}
}
