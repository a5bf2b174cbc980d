package etcd_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/oproute/oproute/internal/testutil"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/testbed"
)

// statusServed is the Status RPCs the members answered, by their /metrics.
func statusServed(t *testing.T, c *testbed.EtcdCluster) uint64 {
	t.Helper()
	var n uint64
	for i := range c.Size() {
		counts, err := c.GRPCCounts(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		n += counts["etcdserverpb.Maintenance/Status"]
	}
	return n
}

func settled(clis ...*etcd.Client) bool {
	for _, cli := range clis {
		if !cli.Stats().Settled {
			return false
		}
	}
	return true
}

// Idle settled clients probe each member once per stable interval: by the
// members' own counts at most 0.5 Status RPCs per client and second (12
// when every round probes).
func TestIdleClientsProbeRarely(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	clis := make([]*etcd.Client, 10)
	for i := range clis {
		clis[i] = newClient(t, c)
	}
	testutil.Poll(t, 15*time.Second, "every client settled", func() bool { return settled(clis...) })
	before, start := statusServed(t, c), time.Now()
	time.Sleep(12 * time.Second) // the measured window: one stable interval and its jitter
	rate := float64(statusServed(t, c)-before) / time.Since(start).Seconds() / float64(len(clis))
	t.Logf("%d idle settled clients: %.3f Status RPCs per client and second, by the members' counts", len(clis), rate)
	if rate > 0.5 {
		t.Fatalf("%.3f Status RPCs per client and second while settled, want at most 0.5", rate)
	}
	if !settled(clis...) {
		t.Fatal("a client left the settled state on an idle healthy cluster")
	}
}

// A settled client learns of a leader move from its next response's term,
// not its next stable probe.
func TestSettledClientFollowsLeaderMoveFromResponses(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := newClient(t, c)
	testutil.Poll(t, 15*time.Second, "the client settled", func() bool { return settled(cli) })
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := (old + 1) % c.Size()
	if err := c.MoveLeader(ctx, to); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "the move done", func() bool { l, err := c.Leader(ctx); return err == nil && l == to })
	moved := time.Now()
	if _, err := cli.Put(ctx, "after-move", "v"); err != nil { // the old leader forwards it
		t.Fatal(err)
	}
	testutil.Poll(t, 2*time.Second, "the client follows the new leader", func() bool { return cli.Stats().Leader == c.Endpoints()[to] })
	t.Logf("the client followed the move %v after it was done (stable probe interval 10 s)", time.Since(moved).Round(time.Millisecond))
}

// A settled client whose only traffic is a session's keep-alives keeps the
// session through a frozen leader (SIGSTOP): keep-alives the leader leaves
// unanswered are evidence, so the client probes, finds the new leader and
// moves the keep-alive stream there before the lease runs out, rather than
// at its next stable probe (10 s, past the 5 s TTL).
func TestSettledSessionOutlivesFrozenLeader(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := newClient(t, c)
	s, err := concurrency.NewSession(cli.Client, concurrency.WithTTL(5), concurrency.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testutil.Poll(t, 15*time.Second, "the client settled", func() bool { return settled(cli) })
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(old); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	defer c.Resume(old)
	// Not checked after the thaw: the old leader may then revoke the
	// leases that expired on its own clock (see docs/limits.md).
	var followed time.Duration // when the client named a new leader
	for time.Since(frozenAt) < 7*time.Second {
		select {
		case <-s.Done():
			t.Fatalf("session lost %v after the leader froze; the client's leader: %q", time.Since(frozenAt).Round(time.Millisecond), cli.Stats().Leader)
		case <-time.After(50 * time.Millisecond):
		}
		if l := cli.Stats().Leader; followed == 0 && l != "" && l != c.Endpoints()[old] {
			followed = time.Since(frozenAt)
		}
	}
	if followed == 0 {
		t.Fatalf("7 s after the leader froze the client's leader is %q", cli.Stats().Leader)
	}
	t.Logf("leader m%d frozen: the client named the new leader after %v; session kept through 7 s", old, followed.Round(time.Millisecond))
}
