package bench

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// A CountingClient's counts are read at both ends of the measured window:
// its count of writes differs from the window's own by at most the
// writes in flight at its edges, not by the preload and warm-up before it.
func TestCountingClientCountsTheWindow(t *testing.T) {
	testutil.NeedsServers(t)
	w := DefaultWorkload()
	w.Duration, w.Warmup, w.Workers, w.Keys = 1500*time.Millisecond, 500*time.Millisecond, 4, 100
	r, err := NewRunner(Options{Backend: countingBackend{}, Workload: w, Trials: 1, Policies: []string{router.Hybrid}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	comps, err := r.Run(ctx, ScenarioQuick)
	if err != nil {
		t.Fatal(err)
	}
	results := Results(comps)
	if len(results) == 0 {
		t.Fatal("no results")
	}
	for _, res := range results {
		got, ok := res.Extra["writes"]
		if !ok || res.Writes == 0 || math.Abs(got-float64(res.Writes)) > float64(w.Workers) {
			t.Errorf("the client counted %v writes in the window (present %v), the window %d; want within %d (the workers)", got, ok, res.Writes, w.Workers)
		}
	}
}

type countingBackend struct{ Etcd }

func (b countingBackend) Start(ctx context.Context, topo testbed.Topology) (Cluster, error) {
	c, err := b.Etcd.Start(ctx, topo)
	if err != nil {
		return nil, err
	}
	return countingCluster{c}, nil
}

type countingCluster struct{ Cluster }

func (c countingCluster) Connect(ctx context.Context, policy string, conns int) (Client, error) {
	cli, err := c.Cluster.Connect(ctx, policy, conns)
	if err != nil {
		return nil, err
	}
	return &countingClient{Client: cli}, nil
}

type countingClient struct {
	Client
	writes atomic.Int64
}

func (c *countingClient) Write(ctx context.Context, key string, value []byte) error {
	err := c.Client.Write(ctx, key, value)
	c.writes.Add(1)
	return err
}

func (c *countingClient) Counters(context.Context) map[string]float64 {
	return map[string]float64{"writes": float64(c.writes.Load())}
}
