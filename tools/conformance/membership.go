package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
)

// MembershipCluster is implemented by clusters whose membership can change
// while they run, as an operator changes it.
type MembershipCluster interface {
	// AddMember adds a member in zone and returns its index once it serves.
	AddMember(ctx context.Context, zone string) (int, error)
	// RemoveMember removes member i from the cluster; its index stays.
	RemoveMember(ctx context.Context, i int) error
}

// MembershipHarness is implemented by harnesses whose clusters can change
// membership only when started for it (a ZooKeeper ensemble with dynamic
// reconfiguration): the membership test starts its cluster there.
type MembershipHarness interface {
	NewMembershipCluster(t *testing.T, size int) Cluster
}

// MembershipClient is implemented by clients that can learn the cluster's
// current membership from the cluster itself (etcd: Sync, the member list;
// ZooKeeper: the ensemble's configuration).
type MembershipClient interface {
	// Resync asks the cluster for its members and makes them the router's.
	Resync(ctx context.Context) error
}

// memberFor returns the router's live (not retired) member whose address
// is that of cluster endpoint ep.
func memberFor(cli Client, ep string) (router.MemberStats, bool) {
	addr := ep
	if _, rest, ok := strings.Cut(ep, "://"); ok {
		addr = rest
	}
	for _, m := range cli.Stats().Members {
		if m.Member.Addr == addr && !m.Retired {
			return m, true
		}
	}
	return router.MemberStats{}, false
}

// retired reports whether the router has retired the member at endpoint ep
// (or never knew it).
func retired(cli Client, ep string) bool {
	_, live := memberFor(cli, ep)
	return !live
}

// opsAt returns how many operations the router has sent to the member at
// address addr, retired or not.
func opsAt(cli Client, addr string) uint64 {
	var n uint64
	for _, m := range cli.Stats().Members {
		if m.Member.Addr == addr {
			for _, v := range m.Ops {
				n += v
			}
		}
	}
	return n
}

// testGrowAndShrink grows a 3-member cluster to 4 under a read and write
// load, then removes the leader: the new member serves reads within 2 s
// of its first good probe, the removed one gets nothing once the router
// has dropped it, and no acknowledged write is lost.
func testGrowAndShrink(t *testing.T, h Harness) {
	var c Cluster
	if mh, ok := h.(MembershipHarness); ok {
		c = mh.NewMembershipCluster(t, 3)
	} else {
		c = h.NewCluster(t, 3)
	}
	mc, ok := c.(MembershipCluster)
	if !ok {
		testutil.Skip(t, "the test bed cannot change this backend's membership")
	}
	cli := connect(t, h, c.Endpoints(), suitePolicy())
	rc, ok := cli.(MembershipClient)
	if !ok {
		testutil.Skip(t, "the client cannot learn the membership")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	knownLeader(t, cli, c)
	seedKeys(t, cli, "members")

	// The load: 4 workers, half reads, half writes of fresh keys.
	l := startLoad(t, cli, 4, 0.5, "members")
	testutil.Poll(t, 10*time.Second, "load under way", func() bool { return len(l.ackedWrites()) > 50 })

	// Grow: the new member serves reads within 2 s of its first good probe.
	added, err := mc.AddMember(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	newEP := c.Endpoints()[added]
	addedAt := time.Now()
	if err := rc.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	var probedAt time.Time
	testutil.Poll(t, 10*time.Second, "the new member's first good probe", func() bool {
		m, ok := memberFor(cli, newEP)
		if ok && m.ProbeOK {
			probedAt = time.Now()
		}
		return !probedAt.IsZero()
	})
	m, _ := memberFor(cli, newEP)
	first := m.Reads()
	var servingAt time.Time
	testutil.Poll(t, 5*time.Second, "the new member takes reads", func() bool {
		if m, ok := memberFor(cli, newEP); ok && m.Reads() >= first+10 {
			servingAt = time.Now()
		}
		return !servingAt.IsZero()
	})
	before, err := c.Served(ctx, added)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "the new member counts reads itself", func() bool {
		s, err := c.Served(ctx, added)
		return err == nil && s.Reads >= before.Reads+10
	})
	t.Logf("added member %d: first good probe %v after the add and resync, 10 reads %v after that",
		added, probedAt.Sub(addedAt).Round(time.Millisecond), servingAt.Sub(probedAt).Round(time.Millisecond))
	if d := servingAt.Sub(probedAt); d > 2*time.Second {
		t.Errorf("the new member took reads %v after its first good probe, want ≤ 2 s", d)
	}

	// Shrink: remove the leader.
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldEP := c.Endpoints()[leader]
	oldAddr := oldEP
	if _, rest, ok := strings.Cut(oldEP, "://"); ok {
		oldAddr = rest
	}
	removedAt := time.Now()
	if err := mc.RemoveMember(ctx, leader); err != nil {
		t.Fatal(err)
	}
	// The membership is read from the cluster, which needs a leader: the
	// first resyncs after losing it may fail.
	testutil.Poll(t, 15*time.Second, "the client resynced after the removal", func() bool {
		return rc.Resync(ctx) == nil && retired(cli, oldEP)
	})
	drainedAt := time.Now()
	sent := opsAt(cli, oldAddr)
	newLeader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "the router knows the new leader", func() bool {
		m, ok := memberFor(cli, c.Endpoints()[newLeader])
		return ok && cli.Stats().Leader == m.Member.ID
	})
	knownAt := time.Now()
	// Operations in flight at the removal (a write the removed leader took
	// and will never answer), and those sent while the router did not yet
	// know the new leader (falling back), end by their deadline: the
	// window starts after them, as a leader change's does.
	testutil.Poll(t, opTimeout+time.Second, "the operations in flight before the new leader was known ended", func() bool { return !l.startedBefore(knownAt) })
	w0, e0 := len(l.ackedWrites()), l.errs.Load()
	time.Sleep(2 * time.Second) // a measurement window under load, not synchronisation
	if after := opsAt(cli, oldAddr); after > sent {
		t.Errorf("the removed member was sent %d operations after the router dropped it", after-sent)
	}
	w1, e1 := len(l.ackedWrites()), l.errs.Load()
	t.Logf("removed leader %d: dropped by the router %v after MemberRemove; then over 2 s: %d writes acknowledged, %d operations failed",
		leader, drainedAt.Sub(removedAt).Round(time.Millisecond), w1-w0, e1-e0)
	if w1 == w0 {
		t.Errorf("no write acknowledged after the leader was removed")
	}
	if e1 > e0 {
		t.Errorf("%d operations failed after the removed leader was dropped (latest errors: %q)", e1-e0, l.recentErrors())
	}
	l.stop()
	checkAcked(ctx, t, cli, l)
}
