package zk

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oproute/oproute/internal/members"
	"github.com/oproute/oproute/router"
)

// Sentinel errors, besides go-zookeeper's own (returned unwrapped, so that
// both err == zk.ErrNoNode and errors.Is keep working) and the router's.
var (
	// ErrNoServers: the server list is empty. It wraps router.ErrNoMembers.
	ErrNoServers = fmt.Errorf("oproute/zk: no servers: %w", router.ErrNoMembers)
	// ErrInvalidServer: a server is not host[:port].
	ErrInvalidServer = errors.New("oproute/zk: invalid server")
	// ErrUnreachable: no server answered within the connect timeout. It
	// wraps router.ErrUnreachable.
	ErrUnreachable = fmt.Errorf("oproute/zk: %w", router.ErrUnreachable)
	// ErrClosed: the Conn is closed. It wraps router.ErrClosed and
	// zk.ErrClosing, which go-zookeeper returns in the same case.
	ErrClosed = fmt.Errorf("oproute/zk: %w (%w)", router.ErrClosed, zk.ErrClosing)
	// ErrMultiRolledBack is a Multi op's error when the op was not applied
	// because another op of the transaction failed (ZooKeeper's code -2,
	// which go-zookeeper reports as "unknown error: -2").
	ErrMultiRolledBack = errors.New("oproute/zk: op rolled back: another op of the multi failed")
)

// errNotPlaced: a call forced to a server (WithMember) found no session of
// the Conn's there; it was not sent.
var errNotPlaced = fmt.Errorf("%w: the call is forced to a server its session cannot be placed on", ErrUnreachable)

type options struct {
	members.Options
	stale          bool
	trackEnsemble  bool
	quorum         bool
	connectTimeout time.Duration
	dialer         zk.Dialer
	events         *slog.Logger
	customDialer   bool   // WithDialer: probes shared with nobody
	dialerKey      string // names a dialer probes may be shared over
	err            error  // a nonsense option, reported by Connect
	logger         zk.Logger
	onEvent        zk.EventCallback
}

// Option configures Connect.
type Option func(*options)

// WithPolicy picks the routing policy by name (router.Policies(), or
// hybrid with an option on: router.HybridHedge, router.HybridP2C). Default
// is router.Hybrid. router.Sticky behaves as go-zookeeper's own client: one
// session on one server for everything.
func WithPolicy(name string) Option { return func(o *options) { o.Policy = name } }

// WithStaleReads makes Get, Exists and Children (and their watch variants)
// plain ZooKeeper reads, served by whichever server the router picks from
// its local state with no Sync: faster, and possibly behind the leader (no
// read-your-writes across servers). The default is linearizable reads.
func WithStaleReads() Option { return func(o *options) { o.stale = true } }

// WithQuorumReads makes linearizable reads strict: before the read, the
// session sends a quorum operation instead of Sync — a Multi holding only a
// version check of "/" at any version, which changes no data but is
// proposed and committed through the leader like any write — so the read
// is ordered after a commit of the current leader's quorum. ZooKeeper's Sync
// is answered by the leader from its own state: a leader deposed while it
// was frozen (SIGSTOP, a long GC pause) still believes it leads for a moment
// after it resumes, and a Sync answered by it can be followed by a read of
// state its successor has already overwritten (ZOOKEEPER-1675). A strict
// read costs a write: a quorum round trip and, on servers that sync their
// log (ZooKeeper's default), a disk flush; every strict read adds a
// transaction to the log. It cannot be combined with WithStaleReads.
func WithQuorumReads() Option { return func(o *options) { o.quorum = true } }

// WithConnectTimeout bounds how long Connect waits for a server to answer
// (and for the leader to be known). Default: the session timeout.
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithDialer sets the dialer for sessions and probes (go-zookeeper's
// zk.WithDialer). The Conn's probes are then its own, not shared with the
// process's other Conns (see the package doc, Resources).
func WithDialer(d zk.Dialer) Option {
	return func(o *options) { o.dialer, o.customDialer, o.dialerKey = d, true, "" }
}

// WithTLS connects sessions and probes over TLS with cfg, to servers'
// secureClientPort (which needs ZooKeeper's Netty connection factory). The
// server name checked is each server's host unless cfg.ServerName is set.
// Conns given the same *tls.Config share their probes.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			o.err = fmt.Errorf("%w: WithTLS(nil)", router.ErrInvalidConfig)
			return
		}
		o.dialer, o.customDialer, o.dialerKey = tlsDialer(cfg), false, fmt.Sprintf("tls %p", cfg)
	}
}

func tlsDialer(cfg *tls.Config) zk.Dialer {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c := cfg
		if host, _, err := net.SplitHostPort(addr); err == nil && cfg.ServerName == "" {
			c = cfg.Clone()
			c.ServerName = host
		}
		return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, network, addr, c)
	}
}

// WithEventLogger sends the Conn's events — the router's (leader changed
// or lost, a server unreachable or back, out of the read pool or back, with
// the evidence) and its sessions' (moved, expired) — to l, one line per
// change. Default: slog.Default().
func WithEventLogger(l *slog.Logger) Option { return func(o *options) { o.events = l } }

// Session events, besides the router's (router.Event*).
const (
	EventSessionMoved   = "zk_session_moved"   // a session was established on another server (attrs from, to)
	EventSessionExpired = "zk_session_expired" // ZooKeeper expired a session (the primary's: its ephemerals are gone)
	// A session had no server for longer than its timeout (the primary:
	// twice that) while servers answered: replaced (a member session) or
	// treated as expired (the primary); attrs session, without_server.
	EventSessionWedged = "zk_session_wedged"
)

// WithLogger sets go-zookeeper's logger. Default: the standard logger.
func WithLogger(l zk.Logger) Option { return func(o *options) { o.logger = l } }

// WithEventCallback is called with every event of the primary session
// (zk.WithEventCallback), including the one that reports its expiry. Unlike
// the channel Connect returns, it never drops an event. It must not block.
func WithEventCallback(cb zk.EventCallback) Option { return func(o *options) { o.onEvent = cb } }

// WithZones places the client and the servers (keyed as given to Connect)
// in zones; stale reads prefer servers in the client's zone.
func WithZones(clientZone string, serverZones map[string]string) Option {
	return func(o *options) { o.ClientZone, o.Zones = clientZone, serverZones }
}

// WithHedgedReads hedges reads (Get, Exists, Children, GetACL; never
// writes, watch-setting reads, Sync, or reads under WithQuorumReads, whose
// hedge would be a second proposal) under the hybrid policy: a read with
// no answer after about the pool's recent 99th-percentile read latency is
// sent on a second healthy server's session as well (sync and read), and
// the first answer wins (see router.HedgeConfig for the delay and the
// budget). With h.Enabled every read is hedged unless its call opts out;
// without, only calls that opt in (WithHedging).
func WithHedgedReads(h router.HedgeConfig) Option { return func(o *options) { o.Hedge = &h } }

// WithHedging makes the reads under ctx hedged (on) or not (off), whatever
// the Conn's default; the Conn needs WithHedgedReads.
func WithHedging(ctx context.Context, on bool) context.Context { return router.WithHedging(ctx, on) }

// WithLoadAwareReads makes the hybrid policy choose each read's server in
// the read pool by power of two choices over read latency × reads in
// flight, instead of round robin (router.Config.LoadAware).
func WithLoadAwareReads() Option { return func(o *options) { o.LoadAware = true } }

// WithRouterConfig adjusts the router's configuration (intervals, ejection
// thresholds, seed…) before it starts. Members and Prober are the Conn's.
func WithRouterConfig(tune func(*router.Config)) Option { return func(o *options) { o.Tune = tune } }

// WithLeader makes the call go to the leader, whatever the policy.
func WithLeader(ctx context.Context) context.Context { return router.WithLeader(ctx) }

// WithPreferredMember makes the call go to the given server (as given to
// Connect) while it is in the read pool, and as the policy says otherwise.
func WithPreferredMember(ctx context.Context, server string) context.Context {
	return router.WithPreferredMember(ctx, server)
}

// WithMember makes the call go to the given server (as given to Connect).
func WithMember(ctx context.Context, server string) context.Context {
	return router.WithMember(ctx, server)
}

// Conn is a ZooKeeper client with go-zookeeper's call shapes whose
// operations are routed by what they ask of ZAB. See the package doc.
type Conn struct {
	r *router.Router
	// srv is the server list, replaced as a whole by SetServers (indexes
	// never move: servers are added or retired, as in the router).
	srv            atomic.Pointer[serverList]
	srvMu          sync.Mutex // serialises SetServers
	cfgMu          sync.Mutex // serialises applying the ensemble's configuration
	cfgVersion     uint64     // the newest configuration applied (its zxid)
	sessionTimeout time.Duration
	o              options

	primary *session
	memMu   sync.Mutex
	mem     []*session // per member, created on first use

	authMu    sync.Mutex // serialises AddAuth
	credsMu   sync.Mutex
	creds     []authCred
	credCount atomic.Int32 // len(creds)

	// The WithEventCallback callback runs on a goroutine of its own, fed
	// from cbQueue in order: go-zookeeper runs its callback on the event
	// loop that its Close waits for, so a callback that called Close (on
	// StateExpired, to start again) deadlocked.
	cbMu    sync.Mutex
	cbQueue []zk.Event
	cbWake  chan struct{} // capacity 1
	cbStop  chan struct{} // closed by Close once no event can come
	cbDone  chan struct{} // closed when the callback goroutine ends
	cbGID   atomic.Uint64 // the callback goroutine's id

	events   chan zk.Event
	eventsMu sync.Mutex // guards sending on events against its close
	expired  atomic.Bool
	started  atomic.Bool // primary is set; the router's hook may run
	closed   atomic.Bool
	done     chan struct{}
	ctx      context.Context // ends at Close: bounds background moves
	cancel   context.CancelFunc
	bg       sync.WaitGroup // background moves, waited for by Close

	onEvent  func(router.Event)
	moves    atomic.Uint64    // sessions established on another server than their last
	expiries [2]atomic.Uint64 // sessions expired: primary, member

	probeMaxAge time.Duration
}

type authCred struct {
	scheme string
	auth   []byte
}

// DefaultMinEjectGap is the router's MinEjectGap for ZooKeeper, twice
// etcd's: a linearizable read here is two client round trips (sync, then
// the read: go-zookeeper cannot pipeline them with an ordering guarantee)
// plus the sync's hop to the leader, so a server one zone away reads about
// 6 ms slower than the others on the default test bed with nothing wrong.
const DefaultMinEjectGap = 10 * time.Millisecond

// eventBuffer is the capacity of the channel Connect returns; events beyond
// it are dropped, as go-zookeeper drops them (WithEventCallback does not),
// except StateExpired, for which the oldest event makes room.
const eventBuffer = 64

// Connect starts a client of the ensemble servers (host:port, the port
// defaults to 2181), in the shape of zk.Connect. Unlike zk.Connect it waits
// until the router has probed the servers (at most the connect timeout),
// so that the first write goes to the leader; it fails with ErrUnreachable
// if no server answers. The channel carries the primary session's events,
// as zk.Connect's does.
func Connect(servers []string, sessionTimeout time.Duration, opts ...Option) (*Conn, <-chan zk.Event, error) {
	o := options{logger: log.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.err != nil {
		return nil, nil, o.err
	}
	if len(servers) == 0 {
		return nil, nil, ErrNoServers
	}
	if sessionTimeout <= 0 {
		return nil, nil, fmt.Errorf("%w: session timeout %v", router.ErrInvalidConfig, sessionTimeout)
	}
	if o.stale && o.quorum {
		return nil, nil, fmt.Errorf("%w: WithStaleReads and WithQuorumReads together", router.ErrInvalidConfig)
	}
	if o.connectTimeout < 0 {
		return nil, nil, fmt.Errorf("%w: connect timeout %v", router.ErrInvalidConfig, o.connectTimeout)
	}
	if o.connectTimeout == 0 {
		o.connectTimeout = sessionTimeout
	}
	if o.dialer == nil {
		o.dialer = net.DialTimeout
	}
	ms, byAddr, err := members.Build(servers, hostPort, o.Zones)
	if err != nil {
		return nil, nil, err
	}
	c := &Conn{sessionTimeout: sessionTimeout, o: o,
		events: make(chan zk.Event, eventBuffer), done: make(chan struct{})}
	srv := &serverList{members: ms, byAddr: byAddr, retired: make([]bool, len(ms))}
	for _, m := range ms {
		srv.addrs = append(srv.addrs, m.Addr)
	}
	c.srv.Store(srv)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mem = make([]*session, len(ms))
	rcfg := o.Config(router.Config{Policy: router.Hybrid, MinEjectGap: DefaultMinEjectGap})
	c.onEvent = rcfg.OnEvent
	if c.onEvent == nil {
		c.onEvent = router.SlogEvents(cmp.Or(o.events, slog.Default()))
		rcfg.OnEvent = c.onEvent
	}
	c.cbWake, c.cbStop, c.cbDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	if o.onEvent != nil {
		go c.dispatchCallbacks()
	} else {
		close(c.cbDone)
	}
	c.probeMaxAge = cmp.Or(rcfg.ProbeInterval, router.DefaultProbeInterval) / 2
	for _, a := range srv.addrs {
		srv.probes = append(srv.probes, acquireProbe(c.probeKey(a)))
	}
	rcfg.Members, rcfg.Prober, rcfg.OnRefresh = ms, router.ProberFunc(c.probe), c.rebalance
	r, err := router.New(rcfg)
	if err != nil {
		c.stopCallbacks()
		return nil, nil, fmt.Errorf("oproute/zk: %w", err)
	}
	c.r = r
	deadline := time.Now().Add(o.connectTimeout)
	if err := r.WaitProbed(o.connectTimeout); err != nil {
		r.Close()
		c.stopCallbacks()
		return nil, nil, fmt.Errorf("%w within %v: %v", ErrUnreachable, o.connectTimeout, srv.addrs)
	}
	if c.primary, err = c.newSession("primary", -1, c.onPrimaryEvent); err != nil {
		r.Close()
		c.stopCallbacks()
		return nil, nil, fmt.Errorf("oproute/zk: %w", err)
	}
	c.started.Store(true)
	// As etcd's DialTimeout does: the first call finds a session in place,
	// or Connect fails.
	for c.primary.zk.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			c.Close()
			return nil, nil, fmt.Errorf("%w: no session within %v: %v", ErrUnreachable, o.connectTimeout, srv.addrs)
		}
		time.Sleep(time.Millisecond)
	}
	c.bg.Go(c.watchSessions)
	if o.trackEnsemble {
		c.bg.Go(c.trackEnsemble)
	}
	return c, c.events, nil
}

// hostPort validates a server and adds ZooKeeper's default port.
func hostPort(srv string) (string, error) {
	if srv == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidServer)
	}
	if _, _, err := net.SplitHostPort(srv); err != nil {
		if _, _, err2 := net.SplitHostPort(srv + ":2181"); err2 != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrInvalidServer, srv, err)
		}
		return srv + ":2181", nil
	}
	return srv, nil
}

// rebalance runs after every probe round: sessions leave servers that no
// longer answer and follow their target (the primary the leader, member
// sessions their member).
func (c *Conn) rebalance() {
	if c.closed.Load() || !c.started.Load() {
		return
	}
	if !c.expired.Load() {
		c.primary.follow()
	}
	srv := c.servers()
	c.memMu.Lock()
	var gone []*session
	for i, s := range c.mem {
		if s != nil && i < len(srv.retired) && srv.retired[i] {
			gone = append(gone, s) // its server left the Conn
			c.mem[i] = nil
		}
	}
	mem := slices.Clone(c.mem)
	c.memMu.Unlock()
	for _, s := range gone {
		c.bg.Go(s.close)
	}
	for _, s := range mem {
		if s != nil {
			s.follow()
		}
	}
}

// SetServers changes the Conn's servers to servers (as given to Connect),
// for a server list that changed at run time. A server already known keeps
// its sessions and its health; a new one takes calls after its first good
// probe; a server left out gets no new calls: the calls in flight there
// finish, its session is closed and the primary session moves off it. It
// fails, changing nothing, on an empty list, a bad server or a duplicate.
func (c *Conn) SetServers(servers []string) error {
	if err := c.check(context.Background()); err != nil {
		return err
	}
	ms, _, err := members.Build(servers, hostPort, c.o.Zones)
	if err != nil {
		return err
	}
	c.srvMu.Lock()
	defer c.srvMu.Unlock()
	if err := c.r.SetMembers(ms); err != nil {
		return mapRouterErr(err)
	}
	// The router's members, by index, are the Conn's servers.
	old, st := c.servers(), c.r.Stats()
	srv := &serverList{byAddr: map[string]int{}}
	for i, m := range st.Members {
		addr := m.Member.Addr
		srv.members = append(srv.members, m.Member)
		srv.addrs = append(srv.addrs, addr)
		srv.retired = append(srv.retired, m.Retired)
		srv.byAddr[addr] = i
		known := i < len(old.probes) && old.probes[i] != nil
		var e *probeEntry
		switch {
		case m.Retired && known:
			releaseProbe(c.probeKey(addr))
		case m.Retired:
		case known:
			e = old.probes[i]
		default:
			e = acquireProbe(c.probeKey(addr))
		}
		srv.probes = append(srv.probes, e)
	}
	for i, m := range st.Members { // an address retired and added again: the live index
		if !m.Retired {
			srv.byAddr[m.Member.Addr] = i
		}
	}
	c.srv.Store(srv)
	c.memMu.Lock()
	for len(c.mem) < len(srv.addrs) {
		c.mem = append(c.mem, nil)
	}
	c.memMu.Unlock()
	c.r.Refresh()
	return nil
}

func (c *Conn) onPrimaryEvent(ev zk.Event) {
	if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
		c.r.Unsettle() // the connection to the leader (or the sticky server) broke
	}
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired && !c.closed.Load() {
		// go-zookeeper would now open a new session in its place, silently
		// dropping our ephemerals. Refuse: the dialer fails from here on,
		// and every call returns zk.ErrSessionExpired, as the Java client's
		// handle does; the application makes a new Conn.
		if c.expired.Swap(true) {
			return // told already (a wedged primary counted as expired)
		}
		c.sessionExpired("primary")
	}
	// The channel first: an event the callback has seen is on the channel.
	c.sendEvent(ev)
	if c.o.onEvent != nil {
		c.cbMu.Lock()
		c.cbQueue = append(c.cbQueue, ev)
		c.cbMu.Unlock()
		select {
		case c.cbWake <- struct{}{}:
		default:
		}
	}
}

// stopCallbacks ends what Connect started besides the router, when Connect
// fails before a session exists.
func (c *Conn) stopCallbacks() {
	c.cancel()
	close(c.cbStop)
	<-c.cbDone
	c.releaseProbes()
}

func (c *Conn) releaseProbes() {
	srv := c.servers()
	for i, a := range srv.addrs {
		if !srv.retired[i] {
			releaseProbe(c.probeKey(a))
		}
	}
}

// dispatchCallbacks runs the callback for each queued event, in order,
// until Close has stopped the sessions and the queue is empty.
func (c *Conn) dispatchCallbacks() {
	defer close(c.cbDone)
	c.cbGID.Store(goroutineID())
	for {
		c.cbMu.Lock()
		evs := c.cbQueue
		c.cbQueue = nil
		c.cbMu.Unlock()
		for _, ev := range evs {
			c.o.onEvent(ev)
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-c.cbWake:
		case <-c.cbStop:
			c.cbMu.Lock()
			empty := len(c.cbQueue) == 0
			c.cbMu.Unlock()
			if empty {
				return
			}
		}
	}
}

// sendEvent puts ev on the channel Connect returned, dropping it when the
// channel is full, except StateExpired, for which the oldest event makes
// room (a long outage fills the channel with connection attempts).
func (c *Conn) sendEvent(ev zk.Event) {
	c.eventsMu.Lock()
	defer c.eventsMu.Unlock()
	if c.events == nil {
		return
	}
	select {
	case c.events <- ev:
		return
	default:
	}
	if ev.State == zk.StateExpired {
		select {
		case <-c.events:
		default:
		}
		select {
		case c.events <- ev:
		default:
		}
	}
}

// sessionFor returns the session that serves member idx: the primary
// session while it is there (so that one server carries one session of
// ours, as with go-zookeeper's client), else the member's own session.
func (c *Conn) sessionFor(idx int) (*session, error) {
	if int(c.primary.cur.Load()) == idx {
		return c.primary, nil
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if s := c.mem[idx]; s != nil {
		return s, nil
	}
	name := fmt.Sprintf("m%d", idx)
	s, err := c.newSession(name, idx, func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
			c.r.Unsettle() // a connection to a server broke
		}
		if ev.Type == zk.EventSession && ev.State == zk.StateExpired && !c.closed.Load() {
			c.sessionExpired(name) // go-zookeeper goes on with a new one
		}
	})
	if err != nil {
		return nil, fmt.Errorf("oproute/zk: session for %s: %w", c.servers().members[idx].ID, err)
	}
	c.mem[idx] = s
	return s, nil
}

// watching marks the session behind z as one that may hold watches (see
// replyHold), before the call that may leave one.
func (c *Conn) watching(z *zk.Conn) {
	if c.primary.zk == z {
		c.primary.watching.Store(true)
		return
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	for _, s := range c.mem {
		if s != nil && s.zk == z {
			s.watching.Store(true)
		}
	}
}

func (c *Conn) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if c.expired.Load() {
		return zk.ErrSessionExpired
	}
	return nil
}

type linearizableKey struct{}

// linearizable makes the reads on ctx linearizable under WithStaleReads
// (recipes need them).
func linearizable(ctx context.Context) context.Context {
	return context.WithValue(ctx, linearizableKey{}, true)
}

// quorumCheck is the strict reads' quorum operation: it matches "/" at any
// version, so it never fails, and changes nothing.
var quorumCheck = &zk.CheckVersionRequest{Path: "/", Version: -1}

// read routes a read: a linearizable one is Sync(path) and then fn on the
// same session, which ZooKeeper orders after the sync, so the server has
// caught up with the leader as of the sync; under WithQuorumReads the sync
// is a quorum operation instead. A read that failed in transport (its
// server went away) is tried once more elsewhere. Under WithHedgedReads a
// read still unanswered after the hedge delay is sent, sync and all, on
// another server's session too, and the first answer wins.
func read[T any](c *Conn, ctx context.Context, path string, fn func(*zk.Conn) (T, error)) (T, error) {
	op, call := router.LinearizableRead, fn
	switch {
	case c.o.stale && ctx.Value(linearizableKey{}) == nil:
		op = router.StaleRead
	case c.o.quorum:
		call = func(z *zk.Conn) (T, error) {
			// An answer on the merits (a root ACL without read access) was
			// committed all the same; only a failed round trip stops the read.
			if _, err := z.Multi(quorumCheck); err != nil && outcomeOf(context.Background(), err) != router.AppError {
				var zero T
				return zero, err
			}
			return fn(z)
		}
	default:
		call = func(z *zk.Conn) (T, error) {
			if _, err := z.Sync(path); err != nil && err != zk.ErrNoNode {
				var zero T
				return zero, err
			}
			return fn(z)
		}
	}
	if !c.r.Hedging() || c.o.quorum {
		// Under WithQuorumReads a hedge would be a second proposal
		// through the leader: not a read's cost.
		return route(c, ctx, op, 2, nil, call)
	}
	return router.Hedge(ctx, c.r, op, func(ctx context.Context, hedge bool) (T, error) {
		attempts := 2
		if hedge {
			attempts = 1 // the first attempt still has its own retry
		}
		return route(c, ctx, op, attempts, nil, call)
	}, answered)
}

// answered tells a read's answer (a result, or an error on the merits such
// as ErrNoNode) from a failure another server might not have had.
func answered(err error) bool {
	return err == nil || outcomeOf(context.Background(), err) == router.AppError
}

// noHedge marks a read that sets a watch: the watch lives on the session
// that served it, so the read must run on one session only.
func (c *Conn) noHedge(ctx context.Context) context.Context {
	if !c.r.Hedging() {
		return ctx
	}
	return router.WithHedging(ctx, false)
}

// write routes a write. A session-bound write (an ephemeral create) goes on
// the primary session, which owns the Conn's ephemerals. Writes are never
// retried: a write cut in transport may have been applied.
func write[T any](c *Conn, ctx context.Context, sessionBound bool, fn func(*zk.Conn) (T, error)) (T, error) {
	var bound *session
	if sessionBound {
		bound = c.primary
	}
	return route(c, ctx, router.Write, 1, bound, fn)
}

// route runs fn on the session serving the member the router picks for op
// (or on bound, counted where bound is), reports the outcome to the router
// and, up to attempts times, tries again elsewhere after a member fault.
func route[T any](c *Conn, ctx context.Context, op router.Op, attempts int, bound *session, fn func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	if err := c.check(ctx); err != nil {
		return zero, err
	}
	pctx := ctx
	if bound != nil {
		// Counted where it goes; not while that server is retired (the
		// session is about to move, and a retired member takes no picks).
		if srv, cur := c.servers(), int(bound.cur.Load()); cur >= 0 && cur < len(srv.retired) && !srv.retired[cur] {
			pctx = router.WithMember(ctx, srv.members[cur].ID)
		}
	}
	var err error
	cutOnce := false // a probe-share read cut at its budget: once per call
	for attempt := 0; attempt < attempts; attempt++ {
		p, perr := c.r.Pick(pctx, op)
		if perr != nil {
			return zero, mapRouterErr(perr)
		}
		s, at := bound, -1
		if s == nil {
			if s, err = c.sessionFor(p.Index); err != nil {
				p.Abandon()
				return zero, err
			}
			if _, forced := router.ForcedMember(ctx); forced {
				at = p.Index
				if s != c.primary && !s.reach(ctx) {
					p.Abandon()
					if err := c.check(ctx); err != nil {
						return zero, err
					}
					return zero, fmt.Errorf("%w: %s", errNotPlaced, p.Member.ID)
				}
			}
		}
		var v T
		if budget := p.ProbeBudget(); budget > 0 && !cutOnce {
			// The router's probe of an ejected member: the caller pays at
			// most its budget, never a failed read.
			bctx, cancel := context.WithTimeout(ctx, budget)
			v, err = do(bctx, s, at, fn)
			cut := err != nil && bctx.Err() == context.DeadlineExceeded && ctx.Err() == nil
			cancel()
			if o := outcomeOf(ctx, err); cut || o == router.MemberFault || o == router.Overloaded {
				cutOnce = true
				if cut {
					o = router.CallerGaveUp
				}
				p.Done(o)
				if err := c.check(ctx); err != nil {
					return zero, err
				}
				attempt-- // the pool's turn is not a retry
				continue
			}
		} else {
			v, err = do(ctx, s, at, fn)
		}
		if errors.Is(err, errNotPlaced) {
			p.Abandon()
			return zero, fmt.Errorf("%w: %s", err, p.Member.ID)
		}
		o := outcomeOf(ctx, err)
		p.Done(o)
		if o != router.MemberFault || c.check(ctx) != nil {
			return v, c.finalErr(err)
		}
	}
	return zero, c.finalErr(err)
}

func (c *Conn) finalErr(err error) error {
	switch {
	case err == nil:
		return nil
	case c.closed.Load() && (errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer)):
		return ErrClosed
	case c.expired.Load() && isMemberFault(err):
		return zk.ErrSessionExpired
	}
	return err
}

func mapRouterErr(err error) error {
	if errors.Is(err, router.ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("oproute/zk: %w", err)
}

func (c *Conn) sessionMoved(s *session, from, to int) {
	c.moves.Add(1)
	c.onEvent(router.Event{Kind: EventSessionMoved, Attrs: []slog.Attr{
		slog.String("session", s.name), slog.String("from", c.servers().members[from].ID), slog.String("to", c.servers().members[to].ID)}})
}

func (c *Conn) sessionExpired(name string) {
	if name == "primary" {
		c.expiries[0].Add(1)
	} else {
		c.expiries[1].Add(1)
	}
	// The primary's expiry loses the Conn's ephemerals: a warning.
	c.onEvent(router.Event{Kind: EventSessionExpired, Warn: name == "primary", Attrs: []slog.Attr{slog.String("session", name)}})
}

// Collector returns the Conn's Prometheus metrics for the caller to
// register: the router's (router.Collector) and its sessions'
// (oproute_zk_session_moves_total, oproute_zk_session_expiries_total with
// label session = primary or member).
func (c *Conn) Collector() prometheus.Collector { return &zkCollector{c: c, router: c.r.Collector()} }

var (
	movesDesc    = prometheus.NewDesc("oproute_zk_session_moves_total", "Sessions established on another server than their last.", nil, nil)
	expiriesDesc = prometheus.NewDesc("oproute_zk_session_expiries_total", "Sessions ZooKeeper expired.", []string{"session"}, nil)
)

type zkCollector struct {
	c      *Conn
	router prometheus.Collector
}

func (z *zkCollector) Describe(ch chan<- *prometheus.Desc) {
	z.router.Describe(ch)
	ch <- movesDesc
	ch <- expiriesDesc
}

func (z *zkCollector) Collect(ch chan<- prometheus.Metric) {
	z.router.Collect(ch)
	ch <- prometheus.MustNewConstMetric(movesDesc, prometheus.CounterValue, float64(z.c.moves.Load()))
	ch <- prometheus.MustNewConstMetric(expiriesDesc, prometheus.CounterValue, float64(z.c.expiries[0].Load()), "primary")
	ch <- prometheus.MustNewConstMetric(expiriesDesc, prometheus.CounterValue, float64(z.c.expiries[1].Load()), "member")
}

// Stats returns the router's statistics.
func (c *Conn) Stats() router.Stats { return c.r.Stats() }

// SessionID returns the primary session's ID: the owner of the Conn's
// ephemeral nodes.
func (c *Conn) SessionID() int64 { return c.primary.zk.SessionID() }

// State returns the primary session's state; zk.StateExpired once it has
// expired.
func (c *Conn) State() zk.State {
	if c.expired.Load() {
		return zk.StateExpired
	}
	return c.primary.zk.State()
}

// Server returns the server the primary session is connected to.
func (c *Conn) Server() string { return c.primary.zk.Server() }

// SessionServers returns, per server index, how many of the Conn's
// sessions are connected there (for tests and diagnostics).
func (c *Conn) SessionServers() []int {
	n := make([]int, len(c.servers().members))
	if i := c.primary.cur.Load(); i >= 0 {
		n[i]++
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	for _, s := range c.mem {
		if s != nil {
			if i := s.cur.Load(); i >= 0 {
				n[i]++
			}
		}
	}
	return n
}

// Close ends every session (the primary's ephemerals are deleted by the
// server) and the router, and waits for their goroutines and for the
// callbacks of the events already queued, except when it is called from a
// callback. A second Close returns at once.
func (c *Conn) Close() {
	if c.closed.Swap(true) {
		return // closed, or being closed (perhaps by a callback Close waits for)
	}
	close(c.done)
	c.cancel()
	c.r.Close() // no more probe rounds, so no more moves start
	c.bg.Wait()
	c.releaseProbes()
	var wg sync.WaitGroup
	deadline := time.Now().Add(closeWait)
	for _, s := range c.sessions() {
		wg.Go(func() {
			s.gate.open()
			if !s.end(deadline) {
				c.o.logger.Printf("oproute/zk: session %s: go-zookeeper's goroutines did not end within %v of Close", s.name, closeWait)
			}
		})
	}
	wg.Wait()
	c.eventsMu.Lock()
	close(c.events)
	c.events = nil
	c.eventsMu.Unlock()
	// The callback goroutine delivers what is queued and ends. Called from
	// a callback, Close cannot wait for it: it ends when that callback
	// returns.
	close(c.cbStop)
	if c.o.onEvent == nil || goroutineID() != c.cbGID.Load() {
		<-c.cbDone
	}
}

// goroutineID is the calling goroutine's id, from its stack header
// ("goroutine 42 [running]:"): Close needs to know whether it runs inside
// a callback, and Go offers no other way to tell one goroutine from
// another. It is called twice per Conn, never on a hot path.
func goroutineID() uint64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// serverList is the Conn's servers, by index (the router's member index).
// Never changed in place: SetServers publishes a new one.
type serverList struct {
	members []router.Member
	addrs   []string
	byAddr  map[string]int
	retired []bool
	probes  []*probeEntry // nil for a retired server
}

func (c *Conn) servers() *serverList { return c.srv.Load() }

// active returns the indexes of the servers not retired.
func (l *serverList) active() []int {
	var out []int
	for i := range l.addrs {
		if !l.retired[i] {
			out = append(out, i)
		}
	}
	return out
}
