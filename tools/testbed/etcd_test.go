package testbed_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func startCluster(t *testing.T, topo testbed.Topology) *testbed.EtcdCluster {
	return testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: topo})
}

func client(t *testing.T, ep string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// serializableGet is a Get on the member cli reaches, with no consensus
// round.
func serializableGet(cli *clientv3.Client) func() error {
	return func() error {
		_, err := cli.Get(context.Background(), "k", clientv3.WithSerializable())
		return err
	}
}

// medianGet measures serializable Gets on one member.
func medianGet(t *testing.T, cli *clientv3.Client, n int) time.Duration {
	t.Helper()
	return testutil.MedianTime(t, n, serializableGet(cli))
}

func TestClusterShapesLinksAndCountsPerMember(t *testing.T) {
	testutil.HoldCores(t) // it times round trips against the shaped delays
	c := startCluster(t, testbed.DefaultTopology(3))
	ctx := context.Background()
	if l, err := c.Leader(ctx); err != nil || l != 0 {
		t.Fatalf("leader = %d, %v; want m0 (the topology's leader)", l, err)
	}
	near := client(t, c.Member(1).Endpoint()) // zone a: 0.25 ms each way
	far := client(t, c.Member(2).Endpoint())  // zone b: 1 ms each way
	medianGet(t, near, 10)
	medianGet(t, far, 10)
	// The two alternate, three times 20 Gets each, and each is judged by
	// its lower fifth: with a core kept busy, queueing for the CPU once
	// put the near median at 2.0 ms against the far one's 2.9 (nominal
	// 0.5 and 2.0); the fastest Gets are the ones that did not queue.
	var nearTimes, farTimes []time.Duration
	for range 3 {
		nearTimes = append(nearTimes, testutil.Times(t, 20, serializableGet(near))...)
		farTimes = append(farTimes, testutil.Times(t, 20, serializableGet(far))...)
	}
	dn, df := testutil.Quantile(nearTimes, 0.2), testutil.Quantile(farTimes, 0.2)
	t.Logf("serializable Get, lower fifth: same zone %v, cross zone %v (medians %v, %v)", dn, df, testutil.Quantile(nearTimes, 0.5), testutil.Quantile(farTimes, 0.5))
	if dn < 500*time.Microsecond || df < 2*time.Millisecond || df-dn < time.Millisecond {
		t.Fatalf("same zone %v, cross zone %v: topology not applied", dn, df)
	}

	// Degrade m1: +8 ms each way on its client link.
	c.Degrade(1, 8*time.Millisecond, 0)
	if d := medianGet(t, near, 10); d < 16*time.Millisecond {
		t.Fatalf("degraded member answered in %v, want ≥ 16ms", d)
	}
	c.Degrade(1, 0, 0)

	// Server-side counts are per member: Puts sent to m2 show on m2 only.
	before := make([]map[string]uint64, 3)
	for i := range before {
		var err error
		if before[i], err = c.GRPCCounts(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		if _, err := far.Put(ctx, fmt.Sprint("k", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		after, err := c.GRPCCounts(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		got := after["etcdserverpb.KV/Put"] - before[i]["etcdserverpb.KV/Put"]
		want := uint64(0)
		if i == 2 {
			want = 20
		}
		if got != want {
			t.Errorf("m%d served %d Puts, want %d", i, got, want)
		}
	}
}

func TestMoveLeaderKillRestart(t *testing.T) {
	c := startCluster(t, testbed.FlatTopology(3))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.MoveLeader(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if l, _ := c.Leader(ctx); l != 2 {
		t.Fatalf("leader %d after MoveLeader(2)", l)
	}
	pid := c.Member(2).PID()
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	// The member's process is gone (killed and reaped): nothing answers at
	// its PID any more.
	testutil.Poll(t, 5*time.Second, "the killed member's process gone", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
	l, err := c.WaitLeader(ctx)
	if err != nil || l == 2 {
		t.Fatalf("after killing the leader: leader %d, %v", l, err)
	}
	if err := c.Restart(ctx, 2); err != nil {
		t.Fatal(err)
	}
	cli := client(t, c.Member(2).Endpoint())
	if _, err := cli.Put(ctx, "after-restart", "v"); err != nil {
		t.Fatalf("restarted member does not serve: %v", err)
	}
}

func TestPauseAndBlackhole(t *testing.T) {
	c := startCluster(t, testbed.FlatTopology(3))
	ctx := context.Background()
	cli := client(t, c.Member(1).Endpoint())
	for _, fault := range []struct {
		name    string
		on, off func() error
	}{
		{"pause", func() error { return c.Pause(1) }, func() error { return c.Resume(1) }},
		{"blackhole", func() error { c.Blackhole(1, true); return nil }, func() error { c.Blackhole(1, false); return nil }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			if err := fault.on(); err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := cli.Get(short, "k", clientv3.WithSerializable())
			cancel()
			if err == nil {
				t.Fatal("a faulted member answered")
			}
			if err := fault.off(); err != nil {
				t.Fatal(err)
			}
			long, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := cli.Get(long, "k", clientv3.WithSerializable()); err != nil {
				t.Fatalf("member did not come back: %v", err)
			}
		})
	}
}
