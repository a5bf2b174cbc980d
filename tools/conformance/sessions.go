package conformance

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
)

// testSticky: the sticky policy keeps every operation on one member, as
// ZooKeeper's own client keeps its session on one server (server side).
func testSticky(t *testing.T, h Harness) {
	c := healed(t, h)
	cli := connect(t, h, c.Endpoints(), router.Sticky)
	ctx := context.Background()
	if err := cli.Put(ctx, "sticky/warm", "v"); err != nil {
		t.Fatal(err)
	}
	before := servedAll(t, c)
	run(t, 100, func(ctx context.Context, i int) error { return cli.Put(ctx, fmt.Sprintf("sticky/%d", i), "v") })
	run(t, 100, func(ctx context.Context, i int) error {
		_, _, err := cli.Get(ctx, fmt.Sprintf("sticky/%d", i))
		return err
	})
	d := delta(servedAll(t, c), before)
	t.Logf("server-side counts: %+v", d)
	used := 0
	for _, s := range d {
		if s.Writes+s.Reads > 0 {
			used++
		}
	}
	if used != 1 {
		t.Errorf("sticky spread its operations over %d members, want 1: %+v", used, d)
	}
}

func sessionClient(t *testing.T, cli Client) SessionClient {
	t.Helper()
	sc, ok := cli.(SessionClient)
	if !ok {
		testutil.Skip(t, "backend has no client sessions")
	}
	return sc
}

// testEphemeralSurvives: an ephemeral key outlives a leader change, owned by
// the same session.
func testEphemeralSurvives(t *testing.T, h Harness) {
	skipWithout[SessionClient](t, h, "backend has no client sessions")
	c := fresh(t, h)
	sc := sessionClient(t, connect(t, h, c.Endpoints(), suitePolicy()))
	ctx := context.Background()
	if err := sc.PutEphemeral(ctx, "eph", "mine"); err != nil {
		t.Fatal(err)
	}
	sid := sc.SessionID()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.MoveLeader(mctx, (leader+1)%3); err != nil {
		t.Fatal(err)
	}
	other := sessionClient(t, connect(t, h, c.Endpoints(), suitePolicy()))
	owner, err := other.Owner(ctx, "eph")
	if err != nil || owner != sid {
		t.Fatalf("after the leader change the ephemeral's owner is %#x (%v), want the session %#x", owner, err, sid)
	}
	if sc.SessionID() != sid {
		t.Fatalf("the client's session changed: %#x → %#x", sid, sc.SessionID())
	}
	// Still usable: a write through the new leader.
	if err := sc.(Client).Put(ctx, "eph/after", "v"); err != nil {
		t.Fatalf("write after the leader change: %v", err)
	}
}

// testWatchAfterLoss: a watch set through a member fires for a change made
// after that member died (the session moved and carried the watch along).
func testWatchAfterLoss(t *testing.T, h Harness) {
	skipWithout[SessionClient](t, h, "backend has no client sessions")
	c := healed(t, h) // the killed follower is restarted by the next heal
	cli := connect(t, h, c.Endpoints(), suitePolicy())
	sc := sessionClient(t, cli)
	ctx := context.Background()
	if err := cli.Put(ctx, "watched", "0"); err != nil {
		t.Fatal(err)
	}
	leader, _ := c.Leader(ctx)
	member := (leader + 1) % 3
	fired, err := sc.WatchVia(ctx, member, "watched")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(member); err != nil {
		t.Fatal(err)
	}
	writer := connect(t, h, c.Endpoints(), suitePolicy())
	testutil.Poll(t, 10*time.Second, "a write after the member died", func() bool {
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return writer.Put(wctx, "watched", "1") == nil
	})
	select {
	case <-fired:
	case <-time.After(15 * time.Second):
		t.Fatal("the watch did not fire after its member died")
	}
}

// testExpiry: when the cluster expires the client's session (its client
// links cut past the session timeout), the client reports it once it can
// hear the cluster again, and its ephemerals are gone.
func testExpiry(t *testing.T, h Harness) {
	skipWithout[SessionClient](t, h, "backend has no client sessions")
	c := healed(t, h)
	cut, ok := c.(ClientCutter)
	if !ok {
		testutil.Skip(t, "cluster cannot cut client links")
	}
	sc := sessionClient(t, connect(t, h, c.Endpoints(), suitePolicy()))
	ctx := context.Background()
	if err := sc.PutEphemeral(ctx, "doomed", "v"); err != nil {
		t.Fatal(err)
	}
	admin := sessionClient(t, connect(t, h, cut.DirectEndpoints(), suitePolicy()))
	cut.CutClients(true)
	testutil.Poll(t, 4*sc.SessionTimeout(), "the cluster expires the session", func() bool {
		owner, err := admin.Owner(ctx, "doomed")
		return err == nil && owner == 0
	})
	cut.CutClients(false)
	testutil.Poll(t, 3*sc.SessionTimeout(), "the client reports the expiry", func() bool {
		select {
		case <-sc.Expired():
			return true
		default:
			return false
		}
	})
	if err := sc.PutEphemeral(ctx, "doomed", "again"); err == nil {
		t.Fatal("an expired session created an ephemeral: the client carried on with a new session")
	}
}
