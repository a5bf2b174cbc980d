package zk

import (
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// session is one go-zookeeper session whose server the router chooses: its
// HostProvider offers the member it belongs on first, its dialer remembers
// which member it reached, and kick moves it by closing the TCP
// connection, after which go-zookeeper reconnects through the provider and
// resumes the same session (ephemerals and watches kept).
type session struct {
	c    *Conn
	name string
	// home is the member a member session belongs on; -1 for the primary
	// session, which follows the router's Home (the leader, or the sticky
	// member).
	home int

	zk     *zk.Conn
	events <-chan zk.Event // go-zookeeper's; closed when its goroutines end

	cur    atomic.Int32 // member the TCP connection was dialed to, -1 while none
	connMu sync.Mutex
	conn   net.Conn

	// Provider state; go-zookeeper calls Next and Connected from one goroutine.
	last      int // the server it was last established on, -1 before the first
	start     int // a random server to begin with while the target is unknown, -1 until drawn
	attempt   int
	lostAt    time.Time     // when the session last had no connection
	backoff   time.Duration // wait after a full pass over the servers
	lastRetry time.Time

	gate   gate
	moving atomic.Bool

	// authSem (a one-slot lock that a context can abandon) serialises
	// adding credentials; authed is how many of the Conn's credentials the
	// session has added (written under authSem, read without it).
	authSem chan struct{}
	authed  atomic.Int32

	// calls counts the goroutines that run a call to go-zookeeper on behalf
	// of a caller that may have given up (do, addAuth): Close waits for
	// them. Only its join, leave and shut are used.
	calls gate

	// watching is set before the session's first call that may leave a
	// watch with go-zookeeper, and stays set: see replyHold.
	watching atomic.Bool
	// progress is when go-zookeeper's loop last began a dial or
	// established the session (UnixNano): a loop that does neither is
	// stuck (see watchSessions).
	progress atomic.Int64
	// established is set once the session has been established: before
	// that ZooKeeper holds nothing of it that could expire.
	established atomic.Bool
}

func (c *Conn) newSession(name string, home int, onEvent zk.EventCallback) (*session, error) {
	s := &session{c: c, name: name, home: home, last: -1, start: -1, authSem: make(chan struct{}, 1)}
	s.cur.Store(-1)
	conn, events, err := zk.Connect(c.servers().addrs, c.sessionTimeout,
		zk.WithHostProvider(s),
		zk.WithDialer(s.dial),
		zk.WithLogger(&c.log),
		zk.WithLogInfo(false),
		zk.WithEventCallback(onEvent))
	if err != nil {
		return nil, err
	}
	s.zk, s.events = conn, events
	return s, nil
}

// lockAuth takes the session's credential lock, or fails when ctx ends.
func (s *session) lockAuth(ctx context.Context) error {
	select {
	case s.authSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) unlockAuth() { <-s.authSem }

// ensureAuth adds to the session, before its first request and before any
// request after Conn.AddAuth, the credentials it does not have yet;
// go-zookeeper resends those it has added on every reconnect. A failure
// (ZooKeeper's answer, or a connection cut by a move) is the calling
// request's error, and the credential is tried again on the next.
func (s *session) ensureAuth(ctx context.Context) error {
	if s.c.credCount.Load() == s.authed.Load() {
		return nil
	}
	if err := s.lockAuth(ctx); err != nil {
		return err
	}
	defer s.unlockAuth()
	return s.addPendingAuth(ctx)
}

// addPendingAuth adds the credentials the session lacks. Caller holds the
// credential lock.
func (s *session) addPendingAuth(ctx context.Context) error {
	s.c.credsMu.Lock()
	pending := slices.Clone(s.c.creds[s.authed.Load():])
	s.c.credsMu.Unlock()
	for _, a := range pending {
		if err := s.addAuth(ctx, a); err != nil {
			return err
		}
		s.authed.Add(1)
	}
	return nil
}

// addAuth adds one credential, bounded by ctx (go-zookeeper's AddAuth
// takes none: on cancellation it goes on in the background, and the
// credential is added again later, which ZooKeeper takes as a no-op).
func (s *session) addAuth(ctx context.Context, a authCred) error {
	ch := make(chan error, 1)
	s.calls.join() // so that Close waits for it
	go func() {
		defer s.calls.leave()
		ch <- s.zk.AddAuth(a.scheme, a.auth)
	}()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// target is the member the session belongs on, -1 when unknown.
func (s *session) target() int {
	if s.home >= 0 {
		return s.home
	}
	if idx, ok := s.c.r.Backend().Home(); ok {
		return idx
	}
	return -1
}

// Init implements zk.HostProvider; the servers are the Conn's.
func (s *session) Init([]string) error { return nil }

// Len implements zk.HostProvider.
func (s *session) Len() int { return len(s.c.servers().active()) }

// Next implements zk.HostProvider: the target first if the session may
// settle there (settled), then the other members that serve, then the rest. After a full pass without a session it
// waits a little (10 ms, doubling to 250 ms, each wait jittered ±20 %) and goes on: go-zookeeper's own
// retry wait (a second, asked for with retryStart) would delay the return
// of writes after an election by up to that second. retryStart, which also
// makes go-zookeeper fail the queued requests with zk.ErrNoServer, comes
// only once the session has had no server for a session timeout.
func (s *session) Next() (string, bool) {
	srv := s.c.servers()
	active := srv.active()
	n := len(active)
	if n == 0 {
		// No server left (every one retired): ask for go-zookeeper's retry
		// wait rather than spin; the dial of "" fails.
		return "", true
	}
	t := s.target()
	switch {
	case t >= 0:
	case s.last >= 0:
		t = s.last // where it was established last
	default:
		// Before the first probes and the first session: a server drawn
		// at random once, as go-zookeeper shuffles its list once, so that
		// a fleet started together does not all dial the first one.
		if s.start < 0 || !slices.Contains(active, s.start) {
			s.start = active[rand.IntN(n)]
		}
		t = s.start
	}
	// The target if the session may settle there, then the servers that
	// serve, then the rest. A target that is out of reach (frozen, cut off)
	// would hold the handshake until its deadline.
	order := dialOrder(active, max(slices.Index(active, t), 0), func(i int) bool {
		return (i == t && s.settled(t)) || s.c.r.Backend().Serves(i)
	})
	a := s.attempt
	s.attempt++
	now := time.Now()
	if a == 0 {
		s.lostAt, s.backoff = now, 10*time.Millisecond
	}
	if s.c.closed.Load() || (s.home < 0 && s.c.expired.Load()) {
		// Closing, or the primary expired (its dialer refuses): ask for
		// go-zookeeper's retry start, which returns at once once Close has
		// been called and otherwise waits a second, so that no connect
		// loop spins through failing dials.
		return srv.addrs[order[a%n]], true
	}
	retry := false
	if a > 0 && a%n == 0 {
		select {
		case <-time.After(jitter(s.backoff)):
		case <-s.c.done:
		}
		s.backoff = min(2*s.backoff, 250*time.Millisecond)
		if now.Sub(s.lostAt) > s.c.sessionTimeout && now.Sub(s.lastRetry) > s.c.sessionTimeout {
			retry, s.lastRetry = true, now
		}
	}
	return srv.addrs[order[a%n]], retry
}

// dialOrder returns active rotated to start, the members preferred first,
// each group in ring order. preferred is asked once per member: the health
// it reads changes under the caller, and asking twice could place a member
// in both groups or in neither.
func dialOrder(active []int, start int, preferred func(int) bool) []int {
	n := len(active)
	order := make([]int, 0, n)
	rest := make([]int, 0, n)
	for k := range n {
		if i := active[(start+k)%n]; preferred(i) {
			order = append(order, i)
		} else {
			rest = append(rest, i)
		}
	}
	return append(order, rest...)
}

// Connected implements zk.HostProvider. A session established on another
// server than its last one has moved.
func (s *session) Connected() {
	s.progress.Store(time.Now().UnixNano())
	s.established.Store(true)
	s.attempt = 0
	cur := int(s.cur.Load())
	if cur < 0 {
		return // kicked meanwhile: the next Connected tells
	}
	if prev := s.last; prev >= 0 && prev != cur {
		s.c.sessionMoved(s, prev, cur)
	}
	s.last = cur
}

func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	s.progress.Store(time.Now().UnixNano())
	if s.c.expired.Load() && s.home < 0 {
		// The primary session expired: never let go-zookeeper open a new
		// one in its place (its ephemerals are gone; callers must know).
		return nil, zk.ErrSessionExpired
	}
	conn, err := s.c.o.dialer(network, addr, timeout)
	if err != nil {
		s.cur.Store(-1)
		return nil, err
	}
	s.connMu.Lock()
	s.conn = conn
	s.connMu.Unlock()
	idx, known := s.c.servers().byAddr[addr]
	s.cur.Store(int32(idx))
	if !known {
		idx = -1 // a server no longer in the list: no member to report
	}
	// A silent server strands a session's watches (the rest fail calls,
	// which the router sees); the router exists before any session.
	return newCappedConn(conn, max(s.c.sessionTimeout, 2*time.Second), s.watching.Load(), s.watching.Load, func() { s.c.r.Backend().Unanswered(idx) }), nil
}

// close ends the session (its server left the Conn) after the calls in
// flight, for at most the drain timeout.
func (s *session) close() {
	s.gate.shut(s.c.ctx, 2*time.Second)
	s.end(time.Now().Add(closeWait))
}

// closeWait bounds how long ending a session waits for go-zookeeper: its
// Close waits up to a second for the server's answer, and its goroutines
// end once the connection they hold does.
const closeWait = 3 * time.Second

// end closes the go-zookeeper session, refuses later calls, and waits until
// deadline at the latest for go-zookeeper's goroutines, which close the
// event channel when they end (having answered every request in flight
// ErrClosing), and then for the goroutines that ran those requests for
// callers that gave up. It reports whether everything ended in time.
func (s *session) end(deadline time.Time) bool {
	s.zk.Close()
	s.gate.close()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case _, ok := <-s.events:
			if ok {
				continue
			}
			s.calls.shut(context.Background(), time.Until(deadline))
			return s.calls.idle()
		case <-t.C:
			return false
		}
	}
}

// kick closes the session's TCP connection: requests in flight fail with
// zk.ErrConnectionClosed and go-zookeeper reconnects through Next.
func (s *session) kick() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.cur.Store(-1)
}

// follow moves the session if its server is out of reach (at once: a frozen
// server would hold requests until go-zookeeper's receive timeout, two
// thirds of the session timeout) or if it belongs elsewhere (after draining,
// so that no request in flight is cut). A member session goes home when its
// server is reachable, even out of the read pool: there it serves only
// calls forced to that server (WithMember).
func (s *session) follow() {
	cur := int(s.cur.Load())
	if cur < 0 {
		return // connecting: Next offers the target first
	}
	if !s.c.r.Reachable(cur) && (s.zk.State() != zk.StateHasSession || !s.c.answersProbes(cur)) {
		// A server that does not answer (frozen, cut off) is left at once.
		// One that answers but says it does not serve (no quorum) closes
		// its client connections itself, so a session still established
		// there is fresher news than the probe, which may predate the
		// server's return to service (a round waits for its slowest
		// probe): cutting it would only fail the calls in flight, as after
		// an election. Such a session moves drained, like any other, if it
		// belongs elsewhere.
		s.kick()
		return
	}
	want := s.target()
	if want < 0 || want == cur || !s.settled(want) || !s.moving.CompareAndSwap(false, true) {
		return
	}
	s.c.bg.Go(func() {
		defer s.moving.Store(false)
		s.moveDrained(s.c.ctx, want)
	})
}

// settled reports whether the session may move to member want: the
// primary follows the leader only to a server that serves; a member session
// goes home to a reachable one.
func (s *session) settled(want int) bool {
	if s.home >= 0 {
		return s.c.r.Reachable(want)
	}
	return s.c.r.Backend().Serves(want)
}

// reach puts a member session on its own server for a call forced there
// (WithMember) and reports whether it got there within ctx: a call forced
// to a server must not be served by another one. The server may refuse the
// session (ZooKeeper refuses a session that has seen a newer zxid than its
// own), and the session then lands elsewhere.
func (s *session) reach(ctx context.Context) bool {
	giveUp := time.Now().Add(s.c.sessionTimeout)
	for !s.at(s.home) {
		if !s.c.r.Reachable(s.home) || time.Now().After(giveUp) {
			return false
		}
		// A session still connecting is left alone (Next offers home
		// first); one established elsewhere is moved.
		if s.zk.State() == zk.StateHasSession && s.moving.CompareAndSwap(false, true) {
			s.moveDrained(ctx, s.home)
			s.moving.Store(false)
			return s.at(s.home)
		}
		select {
		case <-ctx.Done():
			return false
		case <-s.c.done:
			return false
		case <-time.After(time.Millisecond):
		}
	}
	return true
}

// at reports whether the session is established on member idx.
func (s *session) at(idx int) bool {
	return int(s.cur.Load()) == idx && s.zk.State() == zk.StateHasSession
}

// moveDrained holds new requests back, waits for those in flight (at most
// drainTimeout), moves the connection and waits for the session to be
// re-established (at most reconnectTimeout) before letting requests
// through again. ctx and the Conn's Close end it early.
func (s *session) moveDrained(ctx context.Context, want int) {
	const drainTimeout, reconnectTimeout = 2 * time.Second, 2 * time.Second
	s.gate.shut(ctx, drainTimeout)
	defer s.gate.open()
	if s.at(want) || ctx.Err() != nil {
		return // there already, or the Conn is closing: no kick
	}
	s.kick()
	deadline := time.NewTimer(reconnectTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.zk.State() != zk.StateHasSession || int(s.cur.Load()) < 0 {
		select {
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		case <-s.c.done:
			return
		case <-tick.C:
		}
	}
}

// do runs fn on the session, bounded by ctx; at >= 0 is the server the
// call is forced to, which the session must still be on once the gate lets
// the call through (a move may have held it). go-zookeeper has no per-call
// context: on cancellation fn goes on in the background (it ends when the
// server answers or the connection drops) and do returns ctx.Err(). A
// cancelled write's outcome is therefore unknown, as with any timeout.
func do[T any](ctx context.Context, s *session, at int, fn func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	if err := s.gate.enter(ctx); err != nil {
		return zero, err
	}
	if at >= 0 && int(s.cur.Load()) != at {
		s.gate.leave()
		return zero, errNotPlaced
	}
	if err := s.ensureAuth(ctx); err != nil {
		s.gate.leave()
		return zero, err
	}
	if ctx.Done() == nil {
		defer s.gate.leave()
		return fn(s.zk)
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	s.calls.join() // it may outlive its caller: Close waits for it
	go func() {
		defer s.calls.leave()
		defer s.gate.leave()
		v, err := fn(s.zk)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// gate lets requests through a session unless a move holds them back or
// the session has ended. It counts the calls in flight, the goroutines that
// outlive their caller's context included.
type gate struct {
	mu       sync.Mutex
	shutc    chan struct{} // non-nil while shut; closed on open
	closed   bool          // the session ended: enter refuses
	inflight int
	drained  chan struct{} // closed when inflight reaches 0 while shut
}

func (g *gate) enter(ctx context.Context) error {
	g.mu.Lock()
	for g.shutc != nil && !g.closed {
		c := g.shutc
		g.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
	if g.closed {
		g.mu.Unlock()
		return zk.ErrClosing
	}
	g.inflight++
	g.mu.Unlock()
	return nil
}

// idle reports whether nothing is in flight.
func (g *gate) idle() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight == 0
}

// join counts a goroutine in flight whatever the gate's state.
func (g *gate) join() {
	g.mu.Lock()
	g.inflight++
	g.mu.Unlock()
}

// close refuses every later call and lets those held back go (to their
// refusal).
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.open()
}

func (g *gate) leave() {
	g.mu.Lock()
	g.inflight--
	if g.inflight == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
	g.mu.Unlock()
}

// shut holds new requests back and waits up to timeout (or until ctx ends)
// for those in flight.
func (g *gate) shut(ctx context.Context, timeout time.Duration) {
	g.mu.Lock()
	g.shutc = make(chan struct{})
	if g.inflight == 0 {
		g.mu.Unlock()
		return
	}
	d := make(chan struct{})
	g.drained = d
	g.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-d:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (g *gate) open() {
	g.mu.Lock()
	if g.shutc != nil {
		close(g.shutc)
		g.shutc = nil
	}
	g.drained = nil
	g.mu.Unlock()
}
