package zk_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// A lost probe of the leader (here every third dial to it fails, as a lost
// SYN would) must not clear the leader: followers never name it, so the
// router used to send writes round robin for a probe round each time.
func TestLostLeaderProbeKeepsWritesAtLeader(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leaderAddr := c.Endpoints()[leader]
	var dials, lost atomic.Int64
	dialer := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		if addr == leaderAddr && dials.Add(1)%3 == 0 {
			lost.Add(1)
			return nil, errors.New("lost SYN")
		}
		return net.DialTimeout(network, addr, timeout)
	}
	conn, _ := connect(t, c, ozk.WithDialer(dialer))
	if _, err := conn.CreateContext(ctx, "/lost", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	updates0, _ := requests(t, c)
	before := conn.Stats()
	deadline := time.Now().Add(3 * time.Second)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		if _, err := conn.SetContext(ctx, "/lost", []byte{byte(n)}, -1); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
	}
	updates1, _ := requests(t, c)
	st := conn.Stats()
	t.Logf("%d writes, %d probe dials to the leader lost; updates per server %v", n, lost.Load(), sub(updates1, updates0))
	if lost.Load() < 3 {
		t.Fatalf("only %d lost dials: the test did not exercise anything", lost.Load())
	}
	for i := range c.Size() {
		if i != leader && updates1[i] != updates0[i] {
			t.Errorf("z%d (a follower) received %d writes", i, updates1[i]-updates0[i])
		}
	}
	if st.Fallbacks != before.Fallbacks || st.LeaderChanges != before.LeaderChanges {
		t.Errorf("fallbacks %d → %d, leader changes %d → %d: lost probes moved the leader", before.Fallbacks, st.Fallbacks, before.LeaderChanges, st.LeaderChanges)
	}
}

func sub(a, b []uint64) []uint64 {
	d := make([]uint64, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return d
}

// A follower cut off from its peers keeps answering srvr as a follower
// until syncLimit × tickTime (10 s here) passes, while the others commit
// without it: once its zxid is MaxLag behind the leader's, it leaves the
// read pool, before it stops serving.
func TestLaggingFollowerLeavesThePool(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lagging := (leader + 1) % c.Size()
	const maxLag = 100
	conn, _ := connect(t, c, ozk.WithRouterConfig(func(cfg *router.Config) { cfg.MaxLag = maxLag }))
	if _, err := conn.CreateContext(ctx, "/lag", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	c.Partition(lagging, true)
	defer c.Partition(lagging, false)
	cut := time.Now()
	for n := range 2 * maxLag {
		if _, err := conn.SetContext(ctx, "/lag", []byte{byte(n)}, -1); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
	}
	wrote := time.Since(cut)
	conformance.Poll(t, 2*time.Second, "the lagging follower leaves the pool", func() bool {
		return conn.Stats().Members[lagging].OutReason != ""
	})
	m := conn.Stats().Members[lagging]
	st, _ := c.Srvr(ctx, lagging)
	t.Logf("z%d out %v after the partition (writes took %v): %q; its srvr: %s", lagging, time.Since(cut), wrote, m.OutReason, st.Mode)
	if m.OutReason != "apply_lag" {
		t.Errorf("z%d out for %q, want apply_lag", lagging, m.OutReason)
	}
}
