package zk_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// opSetAuth is ZooKeeper's opcode for adding credentials.
const opSetAuth = 100

// authCutter dials as the default dialer does; once armed, the next write
// of credentials (a packet whose request header says opSetAuth) fails, as
// when a reset lands between a reconnect's handshake and go-zookeeper's
// resending of the session's credentials.
type authCutter struct {
	dialed
	armed atomic.Bool
	cuts  atomic.Int64
}

func (d *authCutter) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := d.dialed.dial(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &authCutConn{Conn: c, d: d}, nil
}

// dialed dials as the default dialer does and keeps the connections, by
// address, so that a test can cut them (kick): the sessions reconnect.
type dialed struct {
	mu    sync.Mutex
	conns map[string][]net.Conn
}

func (d *dialed) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conns == nil {
		d.conns = map[string][]net.Conn{}
	}
	d.conns[addr] = append(d.conns[addr], c)
	return c, nil
}

// kick closes the connections dialed so far to addrs, to every address
// when none is given.
func (d *dialed) kick(addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for addr, cs := range d.conns {
		if len(addrs) > 0 && !slices.Contains(addrs, addr) {
			continue
		}
		for _, c := range cs {
			c.Close()
		}
		delete(d.conns, addr)
	}
}

// closeWithin calls conn.Close and fails t if it does not return within d.
// It reports whether Close returned (if not, it must not be called again).
func closeWithin(t *testing.T, conn *ozk.Conn, d time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { conn.Close(); close(done) }()
	select {
	case <-done:
		t.Logf("Close returned in %v", time.Since(start))
		return true
	case <-time.After(d):
		t.Errorf("Close did not return within %v", d)
		return false
	}
}

type authCutConn struct {
	net.Conn
	d *authCutter
}

func (c *authCutConn) Write(b []byte) (int, error) {
	// length (4 bytes), xid (4), opcode (4)
	if len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == opSetAuth && c.d.armed.CompareAndSwap(true, false) {
		c.d.cuts.Add(1)
		c.Conn.Close()
		return 0, errors.New("connection reset by peer (injected)")
	}
	return c.Conn.Write(b)
}

// A session whose resent credentials fail to go out recovers, and Close
// returns: go-zookeeper would otherwise answer that request twice and block
// for ever on the second answer, holding its request lock (the session never
// redials, its event channel never closes, Close waits on it).
func TestFailedCredentialResendDoesNotWedge(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	aclNode(t, c, "/wedge")
	d := &authCutter{}
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithDialer(d.dial), ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			conn.Close()
		}
	}()
	if err := conn.AddAuthContext(ctx, "digest", []byte("app:secret")); err != nil {
		t.Fatal(err)
	}
	readAll := func(within time.Duration) error {
		var err error
		for _, ep := range c.Endpoints() {
			octx, cancel := context.WithTimeout(ozk.WithMember(ctx, ep), within)
			_, _, err = conn.GetContext(octx, "/wedge")
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := readAll(5 * time.Second); err != nil {
		t.Fatalf("reads before the cut: %v", err)
	}
	for range 3 {
		d.armed.Store(true)
		d.kick()
		start := time.Now()
		var err error
		for time.Since(start) < 15*time.Second {
			if err = readAll(2 * time.Second); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("reads through every server 15 s after a failed credential resend (%d cut): %v", d.cuts.Load(), err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = conn.SetContext(wctx, "/wedge", []byte("w"), -1)
		wcancel()
		if err != nil {
			t.Fatalf("write after a failed credential resend: %v", err)
		}
		t.Logf("recovered %v after the cut", time.Since(start))
	}
	if d.cuts.Load() == 0 {
		t.Fatal("no credential write was cut: the test tested nothing")
	}
	closed = true // returned or stuck: not again
	closeWithin(t, conn, 5*time.Second)
}

// A storm of connection resets: 12 Conns with digest credentials read and
// write ACL-protected znodes through every server while every server's
// client links are reset in 200 rounds 150 ms apart (or as the test bed
// keeps up), and in the second half each new connection is also reset
// right after its handshake's answer. Afterwards every Conn reads
// through every server and writes within 15 s, no call is refused for
// missing credentials, every acknowledged write reads back, every Close
// returns within 5 s, and no goroutine is left.
func TestResetStormWithCredentials(t *testing.T) {
	// The storm is counted in rounds, not time: on a loaded machine a
	// round waits longer for the proxies to apply it, and a storm of fixed
	// length would be a weaker one (134 of 200 rounds in 30 s beside the
	// other test binary). stormCap bounds it.
	const conns, rounds, resetEvery, stormCap = 12, 200, 150 * time.Millisecond, 90 * time.Second
	testutil.HoldCores(t) // 12 sessions reconnecting every round
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := aclNode(t, c, "/storm")
	// The ensemble's goroutines end with t's cleanups, admin's (a plain
	// go-zookeeper client, which the storm makes reconnect) before the
	// check: only the Conns' must be gone when the test returns.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer admin.Close()
	acl := zk.DigestACL(zk.PermAll, "app", "secret")
	eps := c.Endpoints()
	cs := make([]*ozk.Conn, conns)
	for i := range cs {
		conn, _, err := ozk.Connect(eps, sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithLogger(quiet{}))
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = conn
		if err := conn.AddAuthContext(ctx, "digest", []byte("app:secret")); err != nil {
			t.Fatal(err)
		}
	}
	closed := make([]bool, conns)
	defer func() {
		for i, conn := range cs {
			if !closed[i] {
				conn.Close()
			}
		}
	}()

	stormCtx, stopStorm := context.WithTimeout(ctx, stormCap)
	defer stopStorm()
	stormStart := time.Now()
	var wg sync.WaitGroup
	var resets atomic.Int64
	wg.Go(func() {
		// A round starts every resetEvery, start to start, or as soon as
		// the test bed has applied the last; the writers stop with the
		// last round.
		defer stopStorm()
		tick := time.NewTicker(resetEvery)
		defer tick.Stop()
		cutting := false
		for resets.Load() < rounds && stormCtx.Err() == nil {
			if !cutting && resets.Load() >= rounds/2 {
				// The second half: each new connection is also reset right
				// after its handshake's answer, where a session with
				// credentials resends them.
				cutting = true
				for i := range c.Size() {
					c.ResetClientsAfterReply(i, true)
				}
			}
			for i := range c.Size() {
				c.ResetClients(i, true)
			}
			resets.Add(1)
			select {
			case <-stormCtx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			for i := range c.Size() {
				c.ResetClients(i, false)
			}
			select {
			case <-stormCtx.Done():
			case <-tick.C:
			}
		}
		for i := range c.Size() {
			c.ResetClientsAfterReply(i, false)
		}
	})
	var noAuth, writes atomic.Int64
	acked := make([]map[string]string, conns)
	for i, conn := range cs {
		acked[i] = map[string]string{}
		wg.Go(func() {
			for n := 0; stormCtx.Err() == nil; n++ {
				octx, ocancel := context.WithTimeout(ozk.WithMember(stormCtx, eps[n%len(eps)]), time.Second)
				_, _, err := conn.GetContext(octx, "/storm")
				ocancel()
				if errors.Is(err, zk.ErrNoAuth) {
					noAuth.Add(1)
				}
				path, val := fmt.Sprintf("/storm/c%d-%d", i, n), fmt.Sprintf("v%d", n)
				wctx, wcancel := context.WithTimeout(stormCtx, time.Second)
				_, err = conn.CreateContext(wctx, path, []byte(val), 0, acl)
				wcancel()
				switch {
				case err == nil:
					acked[i][path] = val
					writes.Add(1)
				case errors.Is(err, zk.ErrNoAuth):
					noAuth.Add(1)
				}
				select {
				case <-stormCtx.Done():
				case <-time.After(20 * time.Millisecond): // a paced client, not a spin on refusals
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d reset rounds in %v (%v apart asked), %d acknowledged writes during the storm", resets.Load(), time.Since(stormStart).Round(time.Millisecond), resetEvery, writes.Load())
	// The storm must be the one asked for.
	if resets.Load() < rounds {
		t.Errorf("%d of %d reset rounds within %v", resets.Load(), rounds, stormCap)
	}

	recovered := time.Now()
	for i, conn := range cs {
		deadline := recovered.Add(15 * time.Second)
		for {
			err := func() error {
				for _, ep := range eps {
					octx, ocancel := context.WithTimeout(ozk.WithMember(ctx, ep), 2*time.Second)
					_, _, err := conn.GetContext(octx, "/storm")
					ocancel()
					if err != nil {
						return fmt.Errorf("read via %s: %w", ep, err)
					}
				}
				wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
				defer wcancel()
				_, err := conn.SetContext(wctx, "/storm", []byte(fmt.Sprint(i)), -1)
				return err
			}()
			if err == nil {
				break
			}
			if errors.Is(err, zk.ErrNoAuth) {
				noAuth.Add(1)
			}
			if time.Now().After(deadline) {
				t.Fatalf("Conn %d not serving through every server 15 s after the storm: %v", i, err)
			}
		}
	}
	t.Logf("every Conn read through every server and wrote %v after the storm", time.Since(recovered))
	if n := noAuth.Load(); n > 0 {
		t.Errorf("%d calls refused with zk.ErrNoAuth: a session served without its credentials", n)
	}
	lost := 0
	for i := range cs {
		for path, val := range acked[i] {
			// A plain read is served from its server's state: synced first,
			// so that it sees every acknowledged write.
			if _, err := admin.Sync(path); err != nil {
				lost++
				continue
			}
			data, _, err := admin.Get(path)
			if err != nil || string(data) != val {
				lost++
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d acknowledged writes not read back", lost)
	}
	var slowest time.Duration
	for i, conn := range cs {
		done := make(chan struct{})
		start := time.Now()
		go func() { conn.Close(); close(done) }()
		select {
		case <-done:
			closed[i] = true
			slowest = max(slowest, time.Since(start))
		case <-time.After(5 * time.Second):
			closed[i] = true
			t.Fatalf("Close of Conn %d did not return within 5 s", i)
		}
	}
	t.Logf("slowest Close %v", slowest)
}

// aclNode creates path readable and writable only with the digest
// credentials app:secret, and returns the plain go-zookeeper client (to
// server 0, holding them) that created it.
func aclNode(t *testing.T, c *testbed.ZKCluster, path string) *zk.Conn {
	t.Helper()
	admin := direct(t, c, 0)
	if err := admin.AddAuth("digest", []byte("app:secret")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Create(path, []byte("s"), 0, zk.DigestACL(zk.PermAll, "app", "secret")); err != nil {
		t.Fatal(err)
	}
	return admin
}

// connectHanger dials as the default dialer does; once armed for an
// address, the next connection to it blocks its first session write (the
// connect request; probes write four-letter words) until released, deadlines
// or not: a session loop stuck where go-zookeeper cannot get it out.
type connectHanger struct {
	dialed
	addr    atomic.Value // string: the address armed, "" for none
	hung    atomic.Int64
	release chan struct{}
}

// anyServer arms a connectHanger for whichever server is dialed next.
const anyServer = "*"

func newConnectHanger() *connectHanger {
	d := &connectHanger{release: make(chan struct{})}
	d.addr.Store("")
	return d
}

func (d *connectHanger) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := d.dialed.dial(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &hangConn{Conn: c, d: d, addr: addr}, nil
}

type hangConn struct {
	net.Conn
	d      *connectHanger
	addr   string
	writes int // only go-zookeeper's send side writes: no lock
}

func (c *hangConn) Write(b []byte) (int, error) {
	c.writes++
	if c.writes == 1 && len(b) > 4 && (c.d.addr.CompareAndSwap(c.addr, "") || c.d.addr.CompareAndSwap(anyServer, "")) {
		c.d.hung.Add(1)
		<-c.d.release
	}
	return c.Conn.Write(b)
}

// A member session whose loop is stuck reconnecting (here: its connect
// request's write never returns) while its server answers probes is
// replaced after the session timeout, and reads on that server go on.
func TestWedgedMemberSessionIsReplaced(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	follower := (leader + 1) % c.Size()
	ep := c.Endpoints()[follower]
	d := newConnectHanger()
	released := false
	defer func() {
		if !released {
			close(d.release)
		}
	}()
	rec := &recorder{}
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithDialer(d.dial), ozk.WithLogger(quiet{}), ozk.WithEventLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			conn.Close()
		}
	}()
	if _, err := conn.CreateContext(ctx, "/hang-member", []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	read := func(within time.Duration) error {
		rctx, rcancel := context.WithTimeout(ozk.WithMember(ctx, ep), within)
		defer rcancel()
		_, _, err := conn.GetContext(rctx, "/hang-member")
		return err
	}
	if err := read(5 * time.Second); err != nil {
		t.Fatalf("read on z%d before the hang: %v", follower, err)
	}

	d.addr.Store(ep)
	d.kick(ep)
	start := time.Now()
	for d.hung.Load() == 0 && time.Since(start) < 10*time.Second {
		time.Sleep(10 * time.Millisecond) // polling the dialer's count
	}
	if d.hung.Load() == 0 {
		t.Fatal("the member session did not reconnect through the hanging dialer")
	}
	for err = read(time.Second); err != nil && time.Since(start) < sessionTimeout+10*time.Second; err = read(time.Second) {
	}
	if err != nil {
		t.Fatalf("reads on z%d %v after its session hung: %v", follower, time.Since(start), err)
	}
	t.Logf("reads on z%d back %v after its session hung (session timeout %v)", follower, time.Since(start), sessionTimeout)
	if n := rec.count(ozk.EventSessionWedged); n != 1 {
		t.Errorf("%d %s events, want 1", n, ozk.EventSessionWedged)
	}
	if _, err := conn.SetContext(ctx, "/hang-member", []byte("y"), -1); err != nil {
		t.Fatalf("write after the replacement: %v", err)
	}
	close(d.release) // the stuck loop ends: its session was closed
	released = true
	closed = true
	closeWithin(t, conn, 5*time.Second)
}

// A primary session stuck reconnecting cannot be replaced without losing
// the Conn's ephemerals: after twice the session timeout it counts as
// expired, and calls fail with zk.ErrSessionExpired instead of hanging.
func TestWedgedPrimarySessionExpires(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, ep := newConnectHanger(), c.Endpoints()[leader]
	rec := &recorder{}
	conn, events, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithDialer(d.dial), ozk.WithLogger(quiet{}), ozk.WithEventLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		close(d.release) // the stuck loop goes on to its end
		conn.Close()
	}()
	if _, err := conn.CreateContext(ctx, "/hang-primary", []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	d.addr.Store(ep)
	d.kick(ep)
	start := time.Now()
	for {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		_, err = conn.SetContext(wctx, "/hang-primary", []byte("y"), -1)
		wcancel()
		if errors.Is(err, zk.ErrSessionExpired) || time.Since(start) > 2*sessionTimeout+10*time.Second {
			break
		}
	}
	if !errors.Is(err, zk.ErrSessionExpired) {
		t.Fatalf("writes %v after the primary session hung: %v, want zk.ErrSessionExpired", time.Since(start), err)
	}
	t.Logf("the primary counted as expired %v after it hung (session timeout %v)", time.Since(start), sessionTimeout)
	if d.hung.Load() == 0 {
		t.Fatal("the primary did not reconnect through the hanging dialer")
	}
	if n := rec.count(ozk.EventSessionWedged, "session=primary"); n != 1 {
		t.Errorf("%d %s events for the primary, want 1", n, ozk.EventSessionWedged)
	}
	for {
		select {
		case ev := <-events:
			if ev.State != zk.StateExpired {
				continue
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no StateExpired event on the Conn's channel")
		}
		break
	}
}

// A primary whose first handshake is stuck (its connect request's write
// never returns) while the servers answer probes was never established:
// ZooKeeper holds nothing of it to expire, so the watchdog does not count
// it expired, as it would an established one, but tells once that it is
// wedged. Once the write gets through, the Conn serves.
func TestWedgedFirstHandshakeIsToldNotExpired(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second // the primary counts as wedged after twice this
	d := newConnectHanger()
	d.addr.Store(anyServer)
	released := false
	defer func() {
		if !released {
			close(d.release)
		}
	}()
	rec := &recorder{}
	var expired atomic.Int32
	conn, _, err := ozk.Connect(c.Endpoints(), timeout, ozk.WithDialer(d.dial), ozk.WithLogger(quiet{}), ozk.WithEventLogger(slog.New(rec)),
		ozk.WithEventCallback(func(ev zk.Event) {
			if ev.State == zk.StateExpired {
				expired.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.Poll(t, 2*timeout+10*time.Second, "the stuck first handshake told", func() bool {
		return rec.count(ozk.EventSessionWedged, "session=primary", "never_established=true") > 0
	})
	if d.hung.Load() != 1 {
		t.Fatalf("%d handshakes hung, want the primary's first", d.hung.Load())
	}
	if n := expired.Load(); n != 0 {
		t.Fatalf("the primary, never established, counted as expired (%d StateExpired events)", n)
	}
	close(d.release)
	released = true
	cctx, ccancel := context.WithTimeout(ctx, 15*time.Second)
	defer ccancel()
	if _, err := conn.CreateContext(cctx, "/first", []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("a write once the handshake got through: %v", err)
	}
	if n := rec.count(ozk.EventSessionWedged); n != 1 {
		t.Errorf("%d %s events, want the one", n, ozk.EventSessionWedged)
	}
	if n := expired.Load(); n != 0 {
		t.Errorf("%d StateExpired events, want none", n)
	}
}
