package etcd_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// maxEventLateness is the most an event may arrive after its write was
// acknowledged, while the member that held the watch is frozen: the
// mechanism's 2.4 s (1.5 s of silence, 400 ms for the progress answer, a
// 500 ms probe) and 1.6 s for the stream's move and resumption on a loaded
// machine. Unrouted, the latest event arrives about 18 s late.
const maxEventLateness = 4 * time.Second

// An otherwise idle, settled client holds a watch and a lease keep-alive;
// the member holding the watch is frozen (SIGSTOP: its TCP connections stay
// open, nothing fails) while a plain client writes the watched key through
// the other members once a second. Every event arrives once, in order, at
// most maxEventLateness after its write was acknowledged, and the lease
// stays alive. A frozen follower holds the watch (the keep-alive goes to
// the leader: a 5 s lease must be renewed there throughout); a frozen
// leader holds both, with a 60 s lease whose keep-alives (every 20 s) leave
// the stream silent through the freeze, so the watch alone must show it.
func TestIdleStreamsLeaveFrozenMember(t *testing.T) {
	testutil.MostlyWaits(t)
	for _, tc := range []struct {
		name   string
		leader bool
		ttl    int64
	}{{"follower", false, 5}, {"leader", true, 60}} {
		t.Run(tc.name, func(t *testing.T) { testIdleStreamsLeaveFrozen(t, tc.leader, tc.ttl) })
	}
}

func testIdleStreamsLeaveFrozen(t *testing.T, freezeLeader bool, ttl int64) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frozen := leader
	if !freezeLeader {
		frozen = (leader + 1) % c.Size()
	}
	var others []string
	for i, ep := range c.Endpoints() {
		if i != frozen {
			others = append(others, ep)
		}
	}
	writer, err := clientv3.New(clientv3.Config{Endpoints: others, Logger: zap.NewNop(), DialTimeout: 5 * time.Second, TLS: c.ClientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()

	cli := newClient(t, c)
	lease, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	ka, err := cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()

	const key = "frozen/k"
	var (
		mu       sync.Mutex
		arrivals []arrival
	)
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	defer func() { wcancel(); <-watchDone }()
	wch := cli.Watch(etcd.WithPreferredMember(wctx, c.Endpoints()[frozen]), key)
	go func() {
		defer close(watchDone)
		for resp := range wch {
			now := time.Now()
			mu.Lock()
			for _, ev := range resp.Events {
				arrivals = append(arrivals, arrival{string(ev.Kv.Value), now})
			}
			mu.Unlock()
		}
	}()
	received := func() []arrival {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(arrivals)
	}

	// The watch is live on its member before the freeze, and the client
	// idle and settled.
	acks := map[string]time.Time{}
	// Each value is written once: an attempt that timed out may still
	// commit (forwarded before the freeze, or near the new leader's first
	// entries), so a retry puts only if the key does not hold it already,
	// and the watch never sees a value twice for a retry's sake.
	put := func(v string) {
		for {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			// A compare on a missing key's value fails, so the put is the
			// Else: it runs unless the key holds v.
			_, err := writer.Txn(pctx).If(clientv3.Compare(clientv3.Value(key), "=", v)).Else(clientv3.OpPut(key, v)).Commit()
			pcancel()
			if err == nil {
				acks[v] = time.Now()
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("put %s: %v", v, err)
			}
		}
	}
	put("0")
	testutil.Poll(t, 5*time.Second, "the watch delivers before the freeze", func() bool { return len(received()) == 1 })
	testutil.Poll(t, 15*time.Second, "the client settled", func() bool { return settled(cli) })

	if err := c.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := c.Resume(frozen); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	n := 1
	for next := frozenAt; time.Since(frozenAt) < 12*time.Second; n++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d) // the writer's pace, not synchronisation
		}
		put(strconv.Itoa(n))
		next = next.Add(time.Second)
	}
	// Still during the freeze: the lease kept alive through a member that
	// runs (after the thaw a deposed leader may revoke leases that expired
	// on its own clock; see docs/limits.md).
	left, err := writer.TimeToLive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left.TTL <= 0 {
		t.Errorf("lease expired during the freeze (TTL %d)", left.TTL)
	}
	// Not a failure yet: after the thaw the frozen member delivers what it
	// held back, and the lateness below says how late.
	for deadline := time.Now().Add(2 * maxEventLateness); len(received()) < n && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
	thaw()
	testutil.PollWhy(t, 15*time.Second, "every event delivered after the thaw", func() (bool, string) {
		got := received()
		return len(got) >= n, strconv.Itoa(len(got)) + " of " + strconv.Itoa(n)
	})

	got := received()
	var worst time.Duration
	late := 0
	for i, a := range got {
		if want := strconv.Itoa(i); a.value != want {
			t.Fatalf("event %d carries %q, want %q: lost, repeated or out of order (values %v)", i, a.value, want, values(got))
		}
		d := a.at.Sub(acks[a.value])
		worst = max(worst, d)
		if d > maxEventLateness {
			late++
		}
	}
	if len(got) != n {
		t.Fatalf("%d events, want %d", len(got), n)
	}
	t.Logf("m%d frozen (leader %v): %d events, %d later than %v, the latest %v after its ack",
		frozen, freezeLeader, n-1, late, maxEventLateness, worst.Round(time.Millisecond))
	if late > 0 {
		t.Errorf("%d of %d events arrived more than %v after their write was acknowledged (the latest %v)", late, n-1, maxEventLateness, worst.Round(time.Millisecond))
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the test ran out of time")
	}
}

// arrival is a watch event's value and when the watch delivered it.
type arrival struct {
	value string
	at    time.Time
}

func values(as []arrival) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.value
	}
	return out
}

// An idle watch stream is asked for its progress about once per
// WatchQuietAfter (by the members' own count of the messages their watch
// streams received), and the caller sees none of those answers; a progress
// request of the caller's own is still answered.
func TestIdleWatchCheckIsInvisible(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := newClient(t, c)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "quiet/k")
	if _, err := cli.Put(ctx, "quiet/k", "v"); err != nil {
		t.Fatal(err)
	}
	testutil.Receive(t, wch, 5*time.Second, "the watch's first event")
	watchMsgs := func() uint64 {
		var n uint64
		for i := range c.Size() {
			got, err := c.GRPCReceived(ctx, i)
			if err != nil {
				t.Fatal(err)
			}
			n += got["etcdserverpb.Watch/Watch"]
		}
		return n
	}
	// Until the stream has sent 6 messages (9 s at one per
	// WatchQuietAfter; longer when a busy etcd answers late and a missed
	// check doubles the wait), within 30 s: then no more than its quiet
	// spells allow.
	const enough = 6
	before, start := watchMsgs(), time.Now()
	for watchMsgs()-before < enough {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("an idle watch stream sent %d messages in %v, want %d: its idle check is not running", watchMsgs()-before, time.Since(start).Round(time.Millisecond), enough)
		}
		select {
		case resp := <-wch:
			t.Fatalf("an idle watch delivered %+v to its caller", resp)
		case <-time.After(250 * time.Millisecond): // sampling the members' counts
		}
	}
	got, elapsed := watchMsgs()-before, time.Since(start)
	want := elapsed.Seconds() / testhooks.EtcdWatchQuietAfter.Seconds()
	t.Logf("an idle watch stream sent %d messages in %v (one per %v of quiet: %.1f)", got, elapsed.Round(time.Millisecond), testhooks.EtcdWatchQuietAfter, want)
	if float64(got) > want+2 {
		t.Errorf("an idle watch stream sent %d messages in %v, want at most %.1f", got, elapsed.Round(time.Millisecond), want+2)
	}
	if err := cli.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	if resp := testutil.Receive(t, wch, 3*time.Second, "the caller's progress request answered"); !resp.IsProgressNotify() {
		t.Fatalf("after RequestProgress the watch delivered %+v, want a progress notification", resp)
	}
}

// A watch opened at a future revision (as clientv3 resumes watches and
// Kubernetes opens them) on a cluster with no write since: etcd answers
// none of its progress requests, and that is no evidence against the
// member. The client stays settled (a miss there is confirmed by a probe
// first, which the member answers), and the watch still delivers.
func TestFutureRevisionWatchKeepsClientSettled(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := newClient(t, c)
	resp, err := cli.Put(ctx, "future/k", "0")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "future/k", clientv3.WithRev(resp.Header.Revision+1))
	testutil.Poll(t, 15*time.Second, "the client settled", func() bool { return settled(cli) })
	before, start := statusServed(t, c), time.Now()
	share := testutil.UnsettledShare(12*time.Second, 1, func(int) bool { return settled(cli) })
	rate := float64(statusServed(t, c)-before) / time.Since(start).Seconds()
	t.Logf("idle watch at a future revision: unsettled %.1f %% of the window; %.2f Status RPCs a second by the members' counts", 100*share, rate)
	// A bound, not "never": one confirming probe that times out on a busy
	// machine unsettles the client for a round or two (under 10 % of the
	// window). Taking every unanswered progress request for a fault kept
	// it unsettled for most of the window.
	if share > 0.1 {
		t.Errorf("the client was unsettled %.1f %% of the window, want at most 10 %%: a future-revision watch's unanswered progress requests taken for a member's fault", 100*share)
	}
	// Settled probes and a confirming probe per miss make under 1 a
	// second; each unsettled stretch adds every member's probe each
	// 250 ms (12 a second on 3 members) for its share of the window.
	if limit := 1 + testutil.UnsettledProbeRate*share; rate > limit {
		t.Errorf("%.2f Status RPCs a second, want at most %.2f (settled probes, a confirming probe per miss, and the unsettled %.0f %% of the window's probes)", rate, limit, 100*share)
	}
	if _, err := cli.Put(ctx, "future/k", "1"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.Receive(t, wch, 5*time.Second, "the future-revision watch's event"); len(got.Events) != 1 || string(got.Events[0].Kv.Value) != "1" {
		t.Fatalf("the watch delivered %+v, want the put of 1", got)
	}
}
