package zk

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

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
	log            swapLogger // go-zookeeper's, o.logger until SetLogger

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
	// bgMu orders a background start from a caller's goroutine (a Lock's
	// sweep, startBackground) with Close's wait for bg.
	bgMu sync.Mutex

	onEvent  func(router.Event)
	moves    atomic.Uint64    // sessions established on another server than their last
	expiries [2]atomic.Uint64 // sessions expired: primary, member

	probeMaxAge time.Duration
}

type authCred struct {
	scheme string
	auth   []byte
}

// Connect starts a client of the ensemble servers (host:port, the port
// defaults to 2181), in the shape of zk.Connect, and like zk.Connect it
// returns at once: the router probes the servers and the primary session
// connects in the background, so that a service may start before its
// ensemble. Calls made meanwhile wait for a session (within their context;
// without one, as go-zookeeper's do, until zk.ErrNoServer after a session
// timeout with no server, a read tried on a second server up to about
// twice that), and a write made before the leader is known goes where the
// router sends it, a follower forwarding it. With
// WithConnectTimeout, Connect waits instead, up to that long, until the
// router has probed the servers and the primary session is established,
// so that the first write goes to the leader; it fails with ErrUnreachable
// if no server answers or gives it a session. The channel carries the
// primary session's events, as zk.Connect's does.
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
	if o.dialer == nil {
		o.dialer = net.DialTimeout
	}
	ms, byAddr, err := members.Build(servers, hostPort, o.Zones)
	if err != nil {
		return nil, nil, err
	}
	c := &Conn{sessionTimeout: sessionTimeout, o: o,
		events: make(chan zk.Event, eventBuffer), done: make(chan struct{})}
	c.log.set(o.logger)
	srv := &serverList{members: ms, byAddr: byAddr, retired: make([]bool, len(ms))}
	for _, m := range ms {
		srv.addrs = append(srv.addrs, m.Addr)
	}
	c.srv.Store(srv)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mem = make([]*session, len(ms))
	// Idle servers are not probed while settled: each probe is a new
	// connection the server pays for, a leader change drops every
	// server's client connections (which the sessions see at once), and a
	// server's first call makes it one in use, probed at every settled round.
	rcfg := o.Config(router.Config{Policy: router.Hybrid, MinEjectGap: DefaultMinEjectGap, IdleProbeRounds: -1})
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
	wait := o.connectTimeout > 0
	deadline := time.Now().Add(o.connectTimeout)
	if wait {
		if err := r.WaitProbed(o.connectTimeout); err != nil {
			r.Close()
			c.stopCallbacks() // the probes released with them
			// The router's error says why the last probe failed.
			return nil, nil, fmt.Errorf("%w: %v: %w", ErrUnreachable, srv.addrs, err)
		}
	}
	if c.primary, err = c.newSession("primary", -1, c.onPrimaryEvent); err != nil {
		r.Close()
		c.stopCallbacks()
		return nil, nil, fmt.Errorf("oproute/zk: %w", err)
	}
	c.started.Store(true)
	// As etcd's DialTimeout does: the first call finds a session in place,
	// or Connect fails.
	for wait && c.primary.zk.State() != zk.StateHasSession {
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

// startBackground runs fn in the background unless the Conn is closed;
// Close waits for it. For starts from callers' goroutines, which nothing
// else orders with Close.
func (c *Conn) startBackground(fn func()) {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if !c.closed.Load() {
		c.bg.Go(fn)
	}
}

// Server returns the server the primary session is connected to.
func (c *Conn) Server() string { return c.primary.zk.Server() }

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
	// A startBackground that saw the Conn open has added to bg by now.
	c.bgMu.Lock()
	//lint:ignore SA2001 an empty critical section: a barrier
	c.bgMu.Unlock()
	c.bg.Wait()
	c.releaseProbes()
	var wg sync.WaitGroup
	deadline := time.Now().Add(closeWait)
	for _, s := range c.sessions() {
		wg.Go(func() {
			s.gate.open()
			if !s.end(deadline) {
				c.log.Printf("oproute/zk: session %s: go-zookeeper's goroutines did not end within %v of Close", s.name, closeWait)
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
