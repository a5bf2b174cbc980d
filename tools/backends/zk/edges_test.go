package zk_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// A lost probe of the leader (here every third dial to it fails, as a lost
// SYN would) must not clear the leader: followers never name it, so the
// router used to send writes round robin for a probe round each time.
func TestLostLeaderProbeKeepsWritesAtLeader(t *testing.T) {
	c, ctx, leader := startWithLeader(t)
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
	// At least 3 s of writes, and on until 3 probe dials to the leader
	// were lost (about 4 in 3 s; fewer when starved), within 30 s.
	more := testutil.Until(3*time.Second, 30*time.Second, func() bool { return lost.Load() >= 3 })
	n := 0
	for ; more(); n++ {
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
	c, ctx, leader := startWithLeader(t)
	lagging := (leader + 1) % c.Size()
	const maxLag = 100
	// Probed every round: a settled Conn probes only the leader and the
	// members its calls went to, and this one's writes all go to the
	// leader, so a lag that begins after it settled (2 s of calm) would go
	// unseen until a call went there, on a slow machine every time.
	conn, _ := connect(t, c, ozk.WithRouterConfig(func(cfg *router.Config) {
		cfg.MaxLag = maxLag
		cfg.StableProbeInterval = router.DefaultProbeInterval
	}))
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
	testutil.Poll(t, 2*time.Second, "the lagging follower leaves the pool", func() bool {
		return conn.Stats().Members[lagging].OutReason != ""
	})
	m := conn.Stats().Members[lagging]
	st, _ := c.Srvr(ctx, lagging)
	t.Logf("z%d out %v after the partition (writes took %v): %q; its srvr: %s", lagging, time.Since(cut), wrote, m.OutReason, st.Mode)
	if m.OutReason != "apply_lag" {
		t.Errorf("z%d out for %q, want apply_lag", lagging, m.OutReason)
	}
}

// The natural reaction to an event — close the Conn (and start a new one)
// — must not deadlock: go-zookeeper runs its callback on the loop that its
// Close waits for.
func TestCloseFromEventCallback(t *testing.T) {
	c, _, leader := startWithLeader(t)
	var conn *ozk.Conn
	ready, closed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithLogger(quiet{}), ozk.WithEventCallback(func(ev zk.Event) {
		if ev.State == zk.StateDisconnected {
			<-ready
			once.Do(func() {
				conn.Close()
				close(closed)
			})
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	c.ResetClients(leader, true) // the primary session loses its connection
	defer c.ResetClients(leader, false)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close called from the event callback did not return within 10 s")
	}
	if _, _, err := conn.Get("/"); !errors.Is(err, ozk.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
}

// Connect must fail, not return a Conn without a session, when no server
// gives it one in time: here the one server left answers srvr but serves
// no session (no quorum).
func TestConnectWithoutSessionFails(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	for _, i := range []int{1, 2} {
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(2*time.Second))
	took := time.Since(start)
	if err == nil {
		conn.Close()
		t.Fatalf("Connect without quorum returned a Conn (state %v) after %v", conn.State(), took)
	}
	if !errors.Is(err, ozk.ErrUnreachable) {
		t.Errorf("Connect: %v, want ErrUnreachable", err)
	}
	if took > 4*time.Second {
		t.Errorf("Connect took %v with a 2 s connect timeout", took)
	}
	t.Logf("Connect failed after %v: %v", took, err)
}

// Connect returns at once, as zk.Connect does, while no server lets a
// client in (every client connection reset, as before the ensemble is up
// or behind a firewall): side by side with stock, both return at once with
// no error; a call with a deadline made meanwhile fails with its deadline.
// Once the servers take clients, each client's write succeeds, ours reports
// its session on its channel as stock's does, and its router finds the
// leader.
func TestConnectReturnsAtOnceAndConnectsLater(t *testing.T) {
	c, ctx, leader := startWithLeader(t)
	for i := range c.Size() {
		c.ResetClients(i, true)
	}
	start := time.Now()
	stock, _, err := zk.Connect(c.Endpoints(), sessionTimeout, zk.WithLogger(quiet{}))
	stockTook := time.Since(start)
	if err != nil {
		t.Fatalf("stock zk.Connect: %v", err)
	}
	defer stock.Close()
	start = time.Now()
	conn, events, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithLogger(quiet{}))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Connect with every client connection reset: %v (stock returned a Conn after %v)", err, stockTook)
	}
	defer conn.Close()
	var sawSession atomic.Bool
	go func() { // read from the start: a long wait fills the channel with connection attempts
		for ev := range events {
			if ev.State == zk.StateHasSession {
				sawSession.Store(true)
			}
		}
	}()
	if took > time.Second {
		t.Errorf("Connect took %v with no server letting clients in; stock %v", took, stockTook)
	}
	early, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _, err = conn.GetContext(early, "/")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a read with a 300 ms deadline before any server lets clients in: %v, want its deadline", err)
	}

	for i := range c.Size() {
		c.ResetClients(i, false)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := conn.CreateContext(wctx, "/at-once", []byte("x"), 0, acl); err != nil {
		t.Fatalf("write once the servers take clients: %v", err)
	}
	stockDone := make(chan error, 1)
	go func() {
		_, err := stock.Create("/at-once-stock", []byte("x"), 0, acl)
		stockDone <- err
	}()
	select {
	case err := <-stockDone:
		if err != nil {
			t.Errorf("stock write once the servers take clients: %v", err)
		}
	case <-wctx.Done():
		t.Error("stock write: no answer within 20 s")
	}
	testutil.Poll(t, 10*time.Second, "a StateHasSession event on the Conn's channel", sawSession.Load)
	testutil.Poll(t, 10*time.Second, "the router finds the leader", func() bool { return conn.Stats().Leader == c.Endpoints()[leader] })
	t.Logf("Connect returned after %v (stock %v)", took, stockTook)
}

// Credentials are on every session before its first request: sessions of
// a fresh Conn, opened after AddAuth, read a digest-protected node through
// every server, many times (half of the Conns with stale reads, whose
// first request on a session is the read itself), while client links are reset now and then
// (moves that can cut a setAuth). A bad scheme's error reaches the caller.
func TestAddAuthOnEverySession(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	aclNode(t, c, "/secret")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // reset one server's client links now and then
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			i := n % c.Size()
			c.ResetClients(i, true)
			select {
			case <-stop:
			case <-time.After(20 * time.Millisecond):
			}
			c.ResetClients(i, false)
		}
	})
	stopResets := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopResets()
	eps := c.Endpoints()
	noAuth, ok, other := 0, 0, map[string]int{}
	for n := range 20 {
		opts := []ozk.Option{ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(sessionTimeout)}
		if n%2 == 1 { // a stale read's first request is the read (no sync)
			opts = append(opts, ozk.WithStaleReads())
		}
		conn, _, err := ozk.Connect(eps, sessionTimeout, opts...)
		if err != nil {
			other[err.Error()]++
			continue
		}
		if err := conn.AddAuthContext(ctx, "digest", []byte("app:secret")); err != nil {
			other["AddAuth: "+err.Error()]++
		}
		for i := range eps {
			octx, cancel := context.WithTimeout(ozk.WithMember(ctx, eps[i]), 3*time.Second)
			_, _, err := conn.GetContext(octx, "/secret")
			cancel()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, zk.ErrNoAuth):
				noAuth++
			default:
				other[fmt.Sprintf("%.50v", err)]++
			}
		}
		conn.Close()
	}
	t.Logf("reads through every server on 20 fresh Conns: %d ok, %d refused (no auth), others %v", ok, noAuth, other)
	if noAuth > 0 {
		t.Errorf("%d reads went out on a session without the credentials", noAuth)
	}
	if ok < 40 {
		t.Errorf("only %d of 60 reads succeeded", ok)
	}

	// Without resets: a Get cut by one fails with zk.ErrConnectionClosed
	// (as go-zookeeper's does), which says nothing of a failed AddAuth.
	stopResets()
	conn, _ := connect(t, c)
	if err := conn.AddAuthContext(ctx, "no-such-scheme", []byte("x")); !errors.Is(err, zk.ErrAuthFailed) {
		t.Errorf("AddAuth with an unknown scheme: %v, want zk.ErrAuthFailed", err)
	}
	if _, _, err := conn.GetContext(ctx, "/"); err != nil {
		t.Errorf("Get after a failed AddAuth: %v", err)
	}
}

// A write that misses its caller's short deadline is the caller's doing,
// not the leader's: it must not clear the leader (which sent writes round
// robin and forced re-probes when deadlines counted as failures).
func TestCallerDeadlineIsNoLeaderFailure(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var dials atomic.Int64 // probes dial each round; sessions stay put
	conn, _ := connect(t, c, ozk.WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		dials.Add(1)
		return net.DialTimeout(network, addr, timeout)
	}))
	if _, err := conn.CreateContext(ctx, "/deadline", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	before, dials0, start := conn.Stats(), dials.Load(), time.Now()
	missed := 0
	for n := range 400 {
		// A deadline about a write's own latency: many miss it.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Millisecond)
		if _, err := conn.SetContext(wctx, "/deadline", []byte{byte(n)}, -1); errors.Is(err, context.DeadlineExceeded) {
			missed++
		}
		cancel()
	}
	st := conn.Stats()
	roundsPerSecond := float64(dials.Load()-dials0) / float64(c.Size()) / time.Since(start).Seconds()
	t.Logf("%d of 400 writes missed a 2 ms deadline; fallbacks %d, leader changes %d, %.1f probe rounds/s",
		missed, st.Fallbacks-before.Fallbacks, st.LeaderChanges-before.LeaderChanges, roundsPerSecond)
	if missed < 20 {
		testutil.Skip(t, fmt.Sprintf("only %d writes missed the deadline: nothing exercised", missed))
	}
	if st.Fallbacks != before.Fallbacks {
		t.Errorf("%d writes fell back (leader cleared by callers' deadlines)", st.Fallbacks-before.Fallbacks)
	}
	if roundsPerSecond > 8 {
		t.Errorf("%.1f probe rounds a second: callers' deadlines forced re-probes", roundsPerSecond)
	}
}

// Bad servers fail Connect with their error and leave nothing running,
// event callback or not.
func TestBadServersLeaveNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cb := ozk.WithEventCallback(func(zk.Event) {})
	for _, tc := range []struct {
		servers []string
		want    error
	}{
		{nil, ozk.ErrNoServers},
		{[]string{""}, ozk.ErrInvalidServer},
		{[]string{"127.0.0.1:1", "127.0.0.1:1"}, router.ErrDuplicateMember},
		{[]string{"127.0.0.1:1"}, ozk.ErrUnreachable}, // nothing listens there
	} {
		_, _, err := ozk.Connect(tc.servers, sessionTimeout, cb, ozk.WithConnectTimeout(300*time.Millisecond))
		if !errors.Is(err, tc.want) {
			t.Errorf("Connect(%q): %v, want %v", tc.servers, err, tc.want)
		}
	}
	// Without a connect timeout an unreachable server gives a Conn at
	// once, as zk.Connect does; its calls wait, and Close ends it all.
	start := time.Now()
	conn, _, err := ozk.Connect([]string{"127.0.0.1:1"}, sessionTimeout, cb, ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatalf("Connect to a server that is not there, returning at once: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Connect took %v", took)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, _, err := conn.GetContext(ctx, "/"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a read with a deadline, no server there: %v, want its deadline", err)
	}
	conn.Close()
	// A call without a context fails as go-zookeeper's does once no
	// server has been reached for a session timeout: zk.ErrNoServer.
	conn, _, err = ozk.Connect([]string{"127.0.0.1:1"}, time.Second, cb, ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan error, 1)
	go func() {
		_, _, err := conn.Get("/")
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, zk.ErrNoServer) {
			t.Errorf("a read without a context, no server there: %v, want zk.ErrNoServer", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a read without a context, no server there: no answer within 10 s (a session timeout of 1 s)")
	}
}

// The server list changes at run time: a server added takes reads after
// its first good probe; one removed (the leader, here) gets nothing more —
// checked by its own mntr — and the primary session moves off it; writes
// go on.
func TestSetServers(t *testing.T) {
	c, ctx, leader := startWithLeader(t)
	eps := c.Endpoints()
	added := (leader + 2) % 3
	var first []string
	for i := range eps {
		if i != added {
			first = append(first, eps[i])
		}
	}
	conn, _, err := ozk.Connect(first, sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.CreateContext(ctx, "/ss", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetServers(eps); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "the added server in the read pool", func() bool {
		for _, m := range conn.Stats().Members {
			if m.Member.ID == eps[added] {
				return m.Reachable && m.ProbeOK && !m.Ejected
			}
		}
		return false
	})
	_, reads0 := requests(t, c)
	for range 300 {
		if _, _, err := conn.GetContext(ctx, "/ss"); err != nil {
			t.Fatal(err)
		}
	}
	_, reads1 := requests(t, c)
	// A third when all is quiet; the added server may sit in the far zone,
	// and on a busy machine it can leave the pool for a while: at least a
	// tenth shows that it serves.
	if n := reads1[added] - reads0[added]; n < 60 {
		t.Errorf("the added server served %d read requests of 600, want a third (at least a tenth); router: %+v", n, conn.Stats().Members)
	}

	var rest []string
	for i := range eps {
		if i != leader {
			rest = append(rest, eps[i])
		}
	}
	if err := conn.SetServers(rest); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "the primary session off the removed leader", func() bool {
		return conn.Server() != eps[leader] && conn.State() == zk.StateHasSession
	})
	updates0, reads0 := requests(t, c)
	for n := range 100 {
		if _, _, err := conn.GetContext(ctx, "/ss"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.SetContext(ctx, "/ss", []byte{byte(n)}, -1); err != nil {
			t.Fatalf("write %d after the leader was removed from the list: %v", n, err)
		}
	}
	updates1, reads1 := requests(t, c)
	if reads1[leader] != reads0[leader] || updates1[leader] != updates0[leader] {
		t.Errorf("the removed server still served %d reads and %d writes of its own sessions", reads1[leader]-reads0[leader], updates1[leader]-updates0[leader])
	}
	if err := conn.SetServers(nil); !errors.Is(err, router.ErrNoMembers) {
		t.Errorf("SetServers(nil): %v, want ErrNoMembers", err)
	}
	if err := conn.SetServers([]string{eps[0], eps[0]}); !errors.Is(err, router.ErrDuplicateMember) {
		t.Errorf("duplicate servers: %v, want ErrDuplicateMember", err)
	}
}

// startWithLeader starts an ensemble for t and returns it, a context
// bounded by a minute and ended with t, and the index of its leader.
func startWithLeader(t *testing.T) (*testbed.ZKCluster, context.Context, int) {
	t.Helper()
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c, ctx, leader
}

// TestEnsembleTracking: with WithEnsembleTracking the Conn follows the
// ensemble's own configuration through reconfigs, with no call from the
// application: a server added by reconfig -add serves reads after its
// first good probe (by its own mntr), one removed by reconfig -remove is
// dropped; an ensemble whose configuration names no client ports (static
// clientPort) is told once, and its servers are kept.
func TestEnsembleTracking(t *testing.T) {
	testutil.MostlyWaits(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Run("reconfig", func(t *testing.T) {
		c := testbed.StartZKT(t, testbed.ZKOptions{Reconfig: true})
		events := &recorder{}
		conn, _ := connect(t, c, ozk.WithEnsembleTracking(), ozk.WithEventLogger(slog.New(events)))
		if _, err := conn.CreateContext(ctx, "/et", []byte("x"), 0, acl); err != nil {
			t.Fatal(err)
		}
		added, err := c.AddServer(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		ep := c.Endpoints()[added]
		testutil.Poll(t, 10*time.Second, "the added server probed", func() bool {
			for _, m := range conn.Stats().Members {
				if m.Member.ID == ep && !m.Retired {
					return m.ProbeOK
				}
			}
			return false
		})
		_, reads0 := requests(t, c)
		for range 400 {
			if _, _, err := conn.GetContext(ctx, "/et"); err != nil {
				t.Fatal(err)
			}
		}
		_, reads1 := requests(t, c)
		// A quarter when all is quiet (sync and read, 800 requests); at
		// least a tenth shows it serves, as in TestSetServers.
		if n := reads1[added] - reads0[added]; n < 80 {
			t.Errorf("the added server served %d read requests of 800, want a quarter (at least a tenth); router: %+v", n, conn.Stats().Members)
		}
		follower := (added + 1) % 3 // one of the first three; not necessarily a follower
		if err := c.RemoveServer(ctx, follower); err != nil {
			t.Fatal(err)
		}
		gone := c.Endpoints()[follower]
		testutil.Poll(t, 10*time.Second, "the removed server dropped", func() bool {
			for _, m := range conn.Stats().Members {
				if m.Member.ID == gone && !m.Retired {
					return false
				}
			}
			return true
		})
		for range 100 {
			if _, _, err := conn.GetContext(ctx, "/et"); err != nil {
				t.Fatalf("read after the removal: %v", err)
			}
		}
		if n := events.count(ozk.EventServersChanged); n != 2 {
			t.Errorf("%d %s events, want 2 (one per reconfig)", n, ozk.EventServersChanged)
		}
	})
	t.Run("static", func(t *testing.T) {
		c := testbed.StartZKT(t, testbed.ZKOptions{})
		events := &recorder{}
		conn, _ := connect(t, c, ozk.WithEnsembleTracking(), ozk.WithEventLogger(slog.New(events)))
		err := conn.SyncServers(ctx)
		t.Logf("SyncServers on a static ensemble: %v", err)
		if !errors.Is(err, ozk.ErrNoClientAddress) {
			t.Errorf("SyncServers: %v, want ErrNoClientAddress", err)
		}
		testutil.Poll(t, 5*time.Second, "the tracker's warning", func() bool { return events.count(ozk.EventServersNotFollowed) > 0 })
		if n := len(conn.Stats().Members); n != 3 {
			t.Errorf("%d members, want the 3 given", n)
		}
	})
}
