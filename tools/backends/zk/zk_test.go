package zk_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

const sessionTimeout = 6 * time.Second

func connect(t *testing.T, c *testbed.ZKCluster, opts ...ozk.Option) (*ozk.Conn, <-chan zk.Event) {
	t.Helper()
	conn, events, err := ozk.Connect(c.Endpoints(), sessionTimeout, append([]ozk.Option{ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(sessionTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn, events
}

// direct is a plain go-zookeeper client on server i's own port (no proxy).
func direct(t *testing.T, c *testbed.ZKCluster, i int) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect([]string{c.DirectEndpoints()[i]}, sessionTimeout, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// requests returns every server's mntr request counts.
func requests(t *testing.T, c *testbed.ZKCluster) (updates, reads []uint64) {
	t.Helper()
	for i := range c.Size() {
		n, err := c.Requests(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		updates, reads = append(updates, n.Updates), append(reads, n.Reads)
	}
	return updates, reads
}

func TestAPIAndErrors(t *testing.T) {
	c := testbed.SharedZKT(t)
	conn, _ := connect(t, c)
	if _, err := conn.Create("/a", []byte("1"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create("/a", nil, 0, acl); err != zk.ErrNodeExists {
		t.Fatalf("second Create: %v, want zk.ErrNodeExists itself", err)
	}
	if _, err := conn.Set("/a", []byte("2"), 7); err != zk.ErrBadVersion {
		t.Fatalf("Set at a wrong version: %v, want zk.ErrBadVersion", err)
	}
	if _, _, err := conn.Get("/missing"); err != zk.ErrNoNode {
		t.Fatalf("Get missing: %v, want zk.ErrNoNode", err)
	}
	if ok, _, err := conn.Exists("/a"); !ok || err != nil {
		t.Fatalf("Exists: %v %v", ok, err)
	}
	if _, err := conn.Create("/a/b", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	if ch, _, err := conn.Children("/a"); err != nil || len(ch) != 1 || ch[0] != "b" {
		t.Fatalf("Children: %v %v", ch, err)
	}
	if err := conn.Delete("/a", -1); err != zk.ErrNotEmpty {
		t.Fatalf("Delete with children: %v, want zk.ErrNotEmpty", err)
	}
	res, err := conn.Multi(&zk.CheckVersionRequest{Path: "/a", Version: 99}, &zk.SetDataRequest{Path: "/a", Data: []byte("x"), Version: -1})
	if err == nil || len(res) != 2 || res[0].Error != zk.ErrBadVersion || !errors.Is(res[1].Error, ozk.ErrMultiRolledBack) {
		t.Fatalf("failed Multi: %+v %v", res, err)
	}
	if _, err := conn.Multi(&zk.SetDataRequest{Path: "/a", Data: []byte("m"), Version: -1}, &zk.DeleteRequest{Path: "/a/b", Version: -1}); err != nil {
		t.Fatal(err)
	}
	if d, _, err := conn.Get("/a"); err != nil || string(d) != "m" {
		t.Fatalf("after Multi: %q %v", d, err)
	}
	p, err := conn.CreateProtectedEphemeralSequential("/a/lock-", nil, acl)
	if err != nil {
		t.Fatal(err)
	}
	if _, st, err := conn.Exists(p); err != nil || st.EphemeralOwner != conn.SessionID() {
		t.Fatalf("protected ephemeral %s: owner %x, session %x, %v", p, st.EphemeralOwner, conn.SessionID(), err)
	}

	// Server side: writes reached the leader only, reads all three.
	w0, r0 := requests(t, c)
	for i := range 150 {
		if _, err := conn.Set("/a", []byte{byte(i)}, -1); err != nil {
			t.Fatal(err)
		}
		if d, _, err := conn.Get("/a"); err != nil || d[0] != byte(i) {
			t.Fatalf("read-your-write %d: %v %v", i, d, err)
		}
	}
	w1, r1 := requests(t, c)
	t.Logf("server side: writes %v → %v, reads %v → %v", w0, w1, r0, r1)
	if w1[0]-w0[0] < 150 || w1[1]-w0[1] > 1 || w1[2]-w0[2] > 1 {
		t.Errorf("writes did not all go to the leader z0: %v → %v", w0, w1)
	}
	for i := range r1 {
		if r1[i]-r0[i] < 40 { // 150 reads, 2 requests each (sync, get), over 3
			t.Errorf("z%d served %d read requests, want its share of 300", i, r1[i]-r0[i])
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := conn.SetContext(ctx, "/a", nil, -1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Set: %v", err)
	}
	conn.Close()
	if _, _, err := conn.Get("/a"); !errors.Is(err, ozk.ErrClosed) || !errors.Is(err, zk.ErrClosing) {
		t.Fatalf("Get after Close: %v", err)
	}
	for _, bad := range [][]string{nil, {""}, {"a:1", "a:1"}, {"h:notaport:x"}} {
		if _, _, err := ozk.Connect(bad, time.Second); err == nil {
			t.Errorf("Connect(%q) succeeded", bad)
		}
	}
	if _, _, err := ozk.Connect(c.Endpoints(), 0); !errors.Is(err, router.ErrInvalidConfig) {
		t.Errorf("zero session timeout: %v", err)
	}
}

// Expiry of the primary session is an event, and the Conn then refuses
// every call rather than carrying on with a new session.
func TestSessionExpiryReported(t *testing.T) {
	c := testbed.SharedZKT(t)
	expiredSeen := make(chan struct{}, 1)
	conn, events := connect(t, c, ozk.WithEventCallback(func(ev zk.Event) {
		if ev.State == zk.StateExpired {
			select {
			case expiredSeen <- struct{}{}:
			default:
			}
		}
	}))
	if _, err := conn.Create("/mine", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	admin := direct(t, c, 0)
	c.BlackholeClients(true)
	// The servers expire the session after its timeout without pings.
	testutil.Poll(t, 3*sessionTimeout, "the server expires the session", func() bool {
		ok, _, err := admin.Exists("/mine")
		return err == nil && !ok
	})
	c.BlackholeClients(false)
	select {
	case <-expiredSeen:
	case <-time.After(2 * sessionTimeout):
		t.Fatal("no StateExpired event")
	}
	sawOnChannel := false
	for len(events) > 0 {
		if ev := <-events; ev.State == zk.StateExpired {
			sawOnChannel = true
		}
	}
	if !sawOnChannel {
		t.Error("StateExpired not on the event channel")
	}
	if conn.State() != zk.StateExpired {
		t.Errorf("State() = %v", conn.State())
	}
	if _, err := conn.Create("/mine", nil, zk.FlagEphemeral, acl); err != zk.ErrSessionExpired {
		t.Fatalf("Create after expiry: %v, want zk.ErrSessionExpired", err)
	}
	if _, _, err := conn.Get("/"); err != zk.ErrSessionExpired {
		t.Fatalf("Get after expiry: %v, want zk.ErrSessionExpired", err)
	}
}

// sticky is go-zookeeper's own behaviour: one session on one server.
func TestStickyOneServer(t *testing.T) {
	c := testbed.SharedZKT(t)
	conn, _ := connect(t, c, ozk.WithPolicy(router.Sticky))
	if _, err := conn.Create("/s", nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	w0, r0 := requests(t, c)
	for i := range 100 {
		if _, err := conn.Set("/s", []byte{byte(i)}, -1); err != nil {
			t.Fatal(err)
		}
		if _, _, err := conn.Get("/s"); err != nil {
			t.Fatal(err)
		}
	}
	w1, r1 := requests(t, c)
	used := 0
	for i := range w1 {
		if w1[i] > w0[i] || r1[i] > r0[i] {
			used++
		}
	}
	sessions := testhooks.ZKSessionServers(conn)
	t.Logf("server side: writes %v → %v, reads %v → %v; sessions per server %v", w0, w1, r0, r1, sessions)
	if used != 1 {
		t.Errorf("sticky used %d servers, want 1", used)
	}
	total := 0
	for _, n := range sessions {
		total += n
	}
	if total != 1 {
		t.Errorf("sticky holds %d sessions, want 1", total)
	}
}

// A frozen follower (SIGSTOP: TCP open, nothing answers) must not stall
// reads for long: probes time out, its sessions move, reads in flight there
// are retried elsewhere.
func TestFrozenServerDoesNotStall(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	conn, _ := connect(t, c)
	if _, err := conn.Create("/f", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	for range 30 { // sessions on every server
		if _, _, err := conn.Get("/f"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Pause(1); err != nil {
		t.Fatal(err)
	}
	defer c.Resume(1)
	// At least 4 s of reads, and on until the router finds z1 unreachable
	// (two failed probes: about 1 s; later on a busy machine), within 30 s.
	var worst time.Duration
	paused := time.Now()
	more := testutil.Until(4*time.Second, 30*time.Second, func() bool { return !conn.Stats().Members[1].Reachable })
	for n := 0; more(); n++ {
		start := time.Now()
		if _, _, err := conn.Get("/f"); err != nil {
			t.Fatalf("read %d with z1 frozen: %v", n, err)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("slowest read with a frozen follower: %v; reads for %v", worst, time.Since(paused).Round(time.Millisecond))
	if worst > 3*time.Second {
		t.Errorf("a read took %v with a frozen follower, want < 3 s", worst)
	}
	if conn.Stats().Members[1].Reachable {
		t.Error("frozen follower still reachable to the router after 30 s")
	}
}

// A frozen leader (SIGSTOP) stops writes until ZooKeeper replaces it
// (syncLimit × tickTime, 10 s here): the Conn must then write through the
// new leader on the same session, not wait out go-zookeeper's timeouts.
func TestFrozenLeader(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	conn, _ := connect(t, c)
	if _, err := conn.Create("/fl", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	sid := conn.SessionID()
	if err := c.Pause(0); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer c.Resume(0)
	var newLeader time.Duration
	ok := time.Duration(0)
	for time.Since(paused) < 40*time.Second {
		if newLeader == 0 {
			for i := 1; i < 3; i++ {
				if st, err := c.Srvr(context.Background(), i); err == nil && st.Mode == "leader" {
					newLeader = time.Since(paused)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := conn.SetContext(ctx, "/fl", []byte("x"), -1)
		cancel()
		if err == nil {
			ok = time.Since(paused)
			break
		}
	}
	t.Logf("leader frozen: new leader after %v, first write after %v", newLeader, ok)
	if ok == 0 {
		t.Fatal("no write succeeded within 40 s of freezing the leader")
	}
	if newLeader > 0 && ok-newLeader > 3*time.Second {
		t.Errorf("first write %v after the new leader existed, want ≤ 3 s", ok-newLeader)
	}
	if conn.SessionID() != sid {
		t.Errorf("session changed: %x → %x", sid, conn.SessionID())
	}
}

// Round robin spreads one goroutine's writes over three sessions; each is
// applied before the next starts, so version-checked writes never conflict,
// and linearizable reads through any server see the latest. Stale reads
// skip the sync: one request per read at the server, not two.
func TestOrderAcrossSessionsAndStaleReads(t *testing.T) {
	c := testbed.SharedZKT(t)
	conn, _ := connect(t, c, ozk.WithPolicy(router.RoundRobin))
	if _, err := conn.Create("/o", []byte("0"), 0, acl); err != nil {
		t.Fatal(err)
	}
	version := int32(0)
	for i := 1; i <= 60; i++ {
		st, err := conn.Set("/o", []byte(strconv.Itoa(i)), version)
		if err != nil {
			t.Fatalf("write %d at version %d: %v", i, version, err)
		}
		version = st.Version
		d, _, err := conn.Get("/o")
		if err != nil || string(d) != strconv.Itoa(i) {
			t.Fatalf("read after write %d: %q %v", i, d, err)
		}
	}
	if used := testhooks.ZKSessionServers(conn); used[0] == 0 || used[1] == 0 || used[2] == 0 {
		t.Errorf("round robin did not use every server: sessions %v", used)
	}

	stale, _ := connect(t, c, ozk.WithStaleReads())
	if _, _, err := stale.Get("/o"); err != nil { // sessions in place
		t.Fatal(err)
	}
	for range 10 {
		stale.Get("/o")
	}
	_, r0 := requests(t, c)
	began := time.Now()
	const reads = 90
	for range reads {
		if _, _, err := stale.Get("/o"); err != nil {
			t.Fatal(err)
		}
	}
	_, r1 := requests(t, c)
	elapsed := time.Since(began)
	total := uint64(0)
	for i := range r1 {
		total += r1[i] - r0[i]
	}
	// mntr counts the sessions' pings as reads: go-zookeeper pings each
	// session every 2 s whatever its traffic, and six are open here (two
	// Conns, a session per server each), so about three a second of the
	// window. A sync per read would add another 90.
	pings := uint64(3*elapsed.Seconds()) + 3
	if total < reads || total > reads+pings {
		t.Errorf("%d stale reads made %d read requests at the servers in %v, want %d (no syncs) and up to %d pings", reads, total, elapsed.Round(time.Millisecond), reads, pings)
	}
	if st := stale.Stats(); st.Members[0].Ops[router.StaleRead] == 0 || st.Members[0].Ops[router.LinearizableRead] != 0 {
		t.Errorf("stale reads not classed as such: %+v", st.Members[0].Ops)
	}
}

// A session timeout below the servers' minimum (2 ticks, 4 s here) is
// raised by the server; the Conn's deadlines must follow the negotiated
// timeout, not the one asked for, or an idle session would drop between
// pings.
func TestSessionTimeoutRaisedByServer(t *testing.T) {
	c := testbed.SharedZKT(t)
	var disconnects atomic.Int64
	conn, _, err := ozk.Connect(c.Endpoints(), time.Second, ozk.WithConnectTimeout(time.Second), ozk.WithLogger(quiet{}), ozk.WithEventCallback(func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
			disconnects.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Create("/idle", nil, zk.FlagEphemeral, acl); err != nil {
		t.Fatal(err)
	}
	session := conn.SessionID()
	idle := time.NewTimer(5 * time.Second) // an idle period to span several pings, not a synchronisation
	<-idle.C
	// Deadlines at the asked 1 s would drop the idle session about once a
	// second; one disconnect is a move of the session after two slow
	// leader probes on a loaded machine, which the session outlives.
	if n := disconnects.Load(); n > 1 {
		t.Fatalf("idle session disconnected %d times", n)
	}
	if id := conn.SessionID(); id != session {
		t.Fatalf("the session changed while idle: %#x, then %#x", session, id)
	}
	if ok, _, err := conn.Exists("/idle"); err != nil || !ok {
		t.Fatalf("ephemeral after idling: %v %v", ok, err)
	}
}

// TestIdleEnsembleAfterElectionKeepsFollowers: after a leader change and
// before any write, ZooKeeper's followers report the zxid of the last
// transaction they processed — still in the old epoch — while the new
// leader reports the new one. That is no evidence that a follower is
// behind: every server stays in the read pool and serves reads.
func TestIdleEnsembleAfterElectionKeepsFollowers(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, _ := connect(t, c) // its sessions exist before the election
	for range 30 {
		if _, _, err := conn.GetContext(ctx, "/"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.MoveLeader(ctx, 1); err != nil { // an election, no write since
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "router learns the new leader", func() bool { return conn.Stats().Leader == c.Endpoints()[1] })
	testutil.Poll(t, 10*time.Second, "every server reachable", func() bool {
		for _, m := range conn.Stats().Members {
			if !m.Reachable {
				return false
			}
		}
		return true
	})
	before := conn.Stats()
	for i := range 3 {
		st, _ := c.Srvr(ctx, i)
		t.Logf("z%d: %s, zxid %#x", i, st.Mode, st.Zxid)
	}
	for range 300 {
		if _, _, err := conn.GetContext(ctx, "/"); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range conn.Stats().Members {
		if n := m.Reads() - before.Members[i].Reads(); m.Ejected || n < 60 {
			t.Errorf("%s: ejected %v (%s), %d of 300 reads: followers of an idle ensemble left the pool", m.Member.ID, m.Ejected, m.OutReason, n)
		}
	}
}
