package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/internal/members"
	"github.com/oproute/oproute/internal/pool"
	"github.com/oproute/oproute/router"
)

// Client is a *clientv3.Client whose RPCs are routed by operation. Every
// clientv3 API works unchanged through the embedded client.
type Client struct {
	*clientv3.Client
	router  *router.Router
	id      string
	current atomic.Pointer[clientv3.Client] // for the prober, which starts before New returns
	closed  atomic.Bool                     // the router has ended (endWithInner)
	ended   chan struct{}                   // closed when endWithInner has stopped the router
	closing sync.Once                       // Close closes the embedded client once
	streams *streams
	// routerReady is router once New has it: the probe loop's hook starts
	// before New returns.
	routerReady atomic.Pointer[router.Router]
	entry       atomic.Pointer[routerEntry] // the balancer's view, for the prober
	zones       map[string]string           // WithZones, for endpoints added later
	endpoints   []string                    // the endpoints the router's members follow; probing goroutine only
	leaderWait  time.Duration               // WithLeaderWait
	onEvent     func(router.Event)          // the router's OnEvent, for the client's own events
	refused     atomic.Bool                 // EventStatusRefused told
}

// EventStatusRefused is the client's event (router.Event.Kind) when a
// member refuses its Status probe (auth enabled, and the client has no
// credentials, a Token it set (clientv3 v3.7) has expired, or the user lacks the root role
// where the server asks for it): the router cannot learn the leader, and
// writes go round robin. Told once per client, with the error. Most etcd
// releases serve Status to any authenticated user; v3.6.0 to v3.6.11 and
// v3.5.28 to v3.5.31 to the root role only.
const EventStatusRefused = "etcd_status_refused"

// Sentinel errors, besides the router's (router.ErrDuplicateMember,
// router.ErrUnknownPolicy, router.ErrInvalidConfig …).
var (
	// ErrNoEndpoints: the configuration names no endpoint. It wraps
	// router.ErrNoMembers.
	ErrNoEndpoints = fmt.Errorf("oproute/etcd: no endpoints: %w", router.ErrNoMembers)
	// ErrInvalidEndpoint: an endpoint is not a host:port or URL.
	ErrInvalidEndpoint = errors.New("oproute/etcd: invalid endpoint")
	// ErrUnreachable: the WithConnectTimeout wait passed with no member
	// answering. It wraps router.ErrUnreachable.
	ErrUnreachable = fmt.Errorf("oproute/etcd: %w", router.ErrUnreachable)
)

// errNotConnected: a probe found its member without a ready connection.
var errNotConnected = errors.New("no ready connection")

type options struct {
	members.Options
	connectTimeout time.Duration
	serviceConfig  string
	connsPerMember int
	events         *slog.Logger
	leaderWait     time.Duration
}

// Option configures New.
type Option func(*options)

// WithPolicy picks the routing policy by name (router.Policies(), or
// hybrid with an option on: router.HybridHedge, router.HybridP2C). Default
// is router.Hybrid.
func WithPolicy(name string) Option { return func(o *options) { o.Policy = name } }

// WithConnectTimeout makes New wait, up to d, until the router has probed
// the members (the leader is known, or every member has answered), so that
// the first write goes to the leader; New fails with ErrUnreachable if no
// member answers in time. Without it (or with 0) New returns as
// clientv3.New does, at once, and the first calls find the members as
// they come up. clientv3.Config.DialTimeout keeps its own meaning (the
// wait for an auth token, RejectOldCluster's status calls, the lease
// keep-alive timeout).
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithConnsPerMember sets how many gRPC connections are kept per member.
// Default is pool.DefaultSize (1, as stock clientv3 keeps), whatever the
// policy, so that policies compare on an equal budget.
func WithConnsPerMember(n int) Option { return func(o *options) { o.connsPerMember = n } }

// WithZones places endpoints in zones and names the client's zone;
// serializable reads prefer members in the client's zone.
func WithZones(clientZone string, endpointZones map[string]string) Option {
	return func(o *options) { o.ClientZone, o.Zones = clientZone, endpointZones }
}

// WithHedgedReads hedges reads (linearizable and serializable Ranges,
// read-only Txns; never writes or streams) under the hybrid policy: a read
// with no answer after about the pool's recent 99th-percentile read
// latency goes to a second healthy member as well, and the first answer
// wins (see router.HedgeConfig for the delay and the budget). With
// h.Enabled every read is hedged unless its call opts out; without, only
// calls that opt in (WithHedging).
func WithHedgedReads(h router.HedgeConfig) Option { return func(o *options) { o.Hedge = &h } }

// WithHedging makes the reads under ctx hedged (on) or not (off), whatever
// the client's default; the client needs WithHedgedReads.
func WithHedging(ctx context.Context, on bool) context.Context { return router.WithHedging(ctx, on) }

// WithLoadAwareReads makes the hybrid policy choose each read's member in
// the read pool by power of two choices over read latency × reads in
// flight, instead of round robin (router.Config.LoadAware).
func WithLoadAwareReads() Option { return func(o *options) { o.LoadAware = true } }

// WithRouterConfig lets the caller adjust the router's parameters (probe
// interval, ejection ratio, …) after the defaults are set. Members and
// Prober belong to the backend and are overwritten.
func WithRouterConfig(tune func(*router.Config)) Option { return func(o *options) { o.Tune = tune } }

// WithEventLogger sends the router's events (leader changed or lost, a
// member unreachable or back, out of the read pool or back, with the
// evidence; one line per change) to l. By default they go to the client's
// zap logger (clientv3.Config.Logger, or the one clientv3 makes).
func WithEventLogger(l *slog.Logger) Option { return func(o *options) { o.events = l } }

// WithLeader makes the RPCs under ctx go to the leader whatever their class.
func WithLeader(ctx context.Context) context.Context { return router.WithLeader(ctx) }

// WithPreferredMember makes the RPCs under ctx go to the member with this
// endpoint while it is in the read pool, and where the policy says
// otherwise. A Watch opened with it starts on that member and, when the
// member stops serving, resumes on another.
func WithPreferredMember(ctx context.Context, endpoint string) context.Context {
	return metadata.AppendToOutgoingContext(router.WithPreferredMember(ctx, endpoint), memberHeader, "prefer:"+endpoint)
}

// memberHeader marks calls bound to a member in their gRPC metadata:
// clientv3 shares one watch stream among watches with the same metadata,
// and a watch meant for one member must not ride (or steer) another's.
const memberHeader = "oproute-member"

// WithMember makes the RPCs under ctx go to the member with this endpoint,
// as given in Config.Endpoints.
func WithMember(ctx context.Context, endpoint string) context.Context {
	return metadata.AppendToOutgoingContext(router.WithMember(ctx, endpoint), memberHeader, endpoint)
}

var clientSeq atomic.Uint64

// New returns a client for cfg whose RPCs are routed by operation: writes to
// the leader, linearizable reads over the healthy read pool (with the
// default policy). It is a drop-in for clientv3.New(cfg).
//
// As clientv3.New does, New does not wait for connections, whatever
// cfg.DialTimeout: a cluster not yet up, or a TLS mistake, shows on the
// first calls. (clientv3 v3.6 waits up to DialTimeout when cfg.DialOptions
// holds grpc.WithBlock, which v3.7 ignores; with credentials both wait for
// the auth token.) WithConnectTimeout makes it wait until the leader is known
// (or every member has answered a probe), failing with ErrUnreachable if
// no member answers in time.
func New(cfg clientv3.Config, opts ...Option) (*Client, error) {
	o := options{connsPerMember: pool.DefaultSize, leaderWait: DefaultLeaderWait}
	for _, opt := range opts {
		opt(&o)
	}
	if o.connsPerMember < 1 || o.connsPerMember > 64 {
		return nil, fmt.Errorf("%w: %d connections per member, want 1..64", router.ErrInvalidConfig, o.connsPerMember)
	}
	if o.connectTimeout < 0 {
		return nil, fmt.Errorf("%w: connect timeout %v, want ≥ 0", router.ErrInvalidConfig, o.connectTimeout)
	}
	if o.leaderWait < 0 {
		return nil, fmt.Errorf("%w: leader wait %v, want ≥ 0", router.ErrInvalidConfig, o.leaderWait)
	}
	if len(cfg.Endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	ms, byAddr, err := members.Build(cfg.Endpoints, hostPort, o.Zones)
	if err != nil {
		return nil, err
	}

	c := &Client{id: "c" + strconv.FormatUint(clientSeq.Add(1), 10), zones: o.Zones, endpoints: slices.Clone(cfg.Endpoints), leaderWait: o.leaderWait}
	sc, err := serviceConfig(o.serviceConfig, c.id)
	if err != nil {
		return nil, err
	}
	c.streams = newStreams(func() *router.Router { return c.routerReady.Load() }, func(ctx context.Context, m router.Member) error {
		_, err := c.probe(ctx, m)
		return err
	})
	rcfg := o.Config(router.Config{Policy: router.Hybrid})
	rcfg.Members, rcfg.Prober = ms, router.ProberFunc(c.probe)
	if rcfg.OnEvent == nil {
		rcfg.OnEvent = c.logEvent
		if o.events != nil {
			rcfg.OnEvent = router.SlogEvents(o.events)
		}
	}
	userRefresh := rcfg.OnRefresh
	rcfg.OnRefresh = func() {
		c.followEndpoints()
		c.streams.moveOff()
		if e := c.entry.Load(); e != nil {
			e.leader.wake() // the round may have named a leader
		}
		if userRefresh != nil {
			userRefresh()
		}
	}
	c.onEvent = rcfg.OnEvent
	r, err := router.New(rcfg)
	if err != nil {
		return nil, fmt.Errorf("oproute/etcd: %w", err)
	}
	c.router = r
	c.routerReady.Store(r)
	entry := &routerEntry{r: r, connsPerMember: o.connsPerMember, leader: newLeaderWatch()}
	entry.byAddr.Store(&byAddr)
	c.entry.Store(entry)
	routers.Store(c.id, entry)

	// etcd's resolver forces round_robin through its service config;
	// disabling resolver service configs lets our default one name our
	// balancer, with the user's method configs (WithServiceConfig). Our
	// options go last so they win.
	cfg.DialOptions = append(slices.Clone(cfg.DialOptions),
		grpc.WithDisableServiceConfig(),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(c.unary),
		grpc.WithChainStreamInterceptor(c.streams.intercept, holdSnapshotBench),
	)
	cli, err := clientv3.New(cfg)
	if err != nil {
		r.Close()
		routers.Delete(c.id)
		return nil, fmt.Errorf("oproute/etcd: %w", err)
	}
	c.Client = cli
	c.current.Store(cli)
	c.ended = make(chan struct{})
	go c.endWithInner(cli)
	r.Refresh()
	if o.connectTimeout > 0 {
		if err := c.waitReachable(o.connectTimeout); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// waitReachable waits until the router has probed the members; it fails
// only if no member answers within timeout.
func (c *Client) waitReachable(timeout time.Duration) error {
	if err := c.router.WaitProbed(timeout); err != nil {
		// The router's error says why the last probe failed.
		return fmt.Errorf("%w: %v: %w", ErrUnreachable, c.Endpoints(), err)
	}
	return nil
}

// hostPort turns an etcd endpoint ("http://h:p", "https://h:p", "h:p") into
// the address gRPC dials.
func hostPort(ep string) (string, error) {
	if scheme, rest, ok := strings.Cut(ep, ":"); ok && (scheme == "unix" || scheme == "unixs") {
		return unixAddress(ep, rest)
	}
	s := ep
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("%w: %q", ErrInvalidEndpoint, ep)
		}
		switch u.Scheme {
		case "http", "https":
		default:
			return "", fmt.Errorf("%w: %q: scheme %q", ErrInvalidEndpoint, ep, u.Scheme)
		}
		s = u.Host
	}
	if s == "" || !strings.Contains(s, ":") {
		return "", fmt.Errorf("%w: %q: want host:port", ErrInvalidEndpoint, ep)
	}
	return s, nil
}

// unixAddress reads a unix endpoint as clientv3's resolver does (its
// internal endpoint package), so that a member's address is the one the
// balancer is handed: "unix:///abs" stays, the legacy "unix://rel" and
// "unix:rel" become "unix:rel"; "unixs" is the same socket with TLS.
func unixAddress(ep, rest string) (string, error) {
	var addr string
	switch {
	case strings.HasPrefix(rest, "///"):
		addr = "unix://" + rest[2:]
	case strings.HasPrefix(rest, "//"):
		addr = "unix:" + rest[2:]
	default:
		addr = "unix:" + rest
	}
	if strings.TrimLeft(strings.TrimPrefix(addr, "unix:"), "/") == "" {
		return "", fmt.Errorf("%w: %q: no socket path", ErrInvalidEndpoint, ep)
	}
	return addr, nil
}

// probe asks member m for its status on one of the client's own pooled
// connections (never a fresh dial), so TLS, credentials and dial options
// apply to probes as to everything else.
func (c *Client) probe(ctx context.Context, m router.Member) (router.ProbeResult, error) {
	cli := c.current.Load()
	if cli == nil {
		return router.ProbeResult{}, errors.New("oproute/etcd: client starting")
	}
	e := c.entry.Load()
	if e == nil {
		return router.ProbeResult{}, errors.New("oproute/etcd: client starting")
	}
	idx, ok := e.indexOf(m.Addr)
	if !ok {
		return router.ProbeResult{}, fmt.Errorf("status of %s: no longer an endpoint", m.ID)
	}
	if !e.isConnected(idx) {
		// Not connected (yet, or any more): the probe fails without a call,
		// so nothing logs it. Connect takes the channel out of idle (gRPC
		// dials nothing before the first call or Connect) and is a no-op
		// once it is active; gRPC dials the members in the background.
		cli.ActiveConnection().Connect()
		return router.ProbeResult{}, fmt.Errorf("status of %s: %w", m.ID, errNotConnected)
	}
	ctx = context.WithValue(ctx, probeKey{}, idx)
	resp, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
	if err != nil {
		if authRefused(err) {
			// With auth enabled Status needs a user. The member answered, so
			// it is reachable, but it told us nothing: the leader stays
			// unknown and writes go round robin; the caller's own calls fail
			// with etcd's auth error, as with clientv3.
			if !c.refused.Swap(true) {
				c.onEvent(router.Event{Kind: EventStatusRefused, Warn: true, Member: m.ID, Attrs: []slog.Attr{slog.String("error", err.Error())}})
			}
			return router.ProbeResult{}, nil
		}
		return router.ProbeResult{}, fmt.Errorf("status of %s: %w", m.ID, err)
	}
	res := router.ProbeResult{
		ServerID:   strconv.FormatUint(resp.GetHeader().GetMemberId(), 16),
		Term:       resp.GetRaftTerm(),
		NotServing: resp.GetIsLearner(),
		Leaderless: resp.GetLeader() == 0, // e.g. cut off from its peers: its ReadIndex would hang
		Committed:  resp.GetRaftIndex(),
		Applied:    resp.GetRaftAppliedIndex(),
	}
	if resp.GetLeader() != 0 {
		res.LeaderID = strconv.FormatUint(resp.GetLeader(), 16)
	}
	return res, nil
}

// authRefused reports whether err is etcd refusing an unauthenticated or
// unauthorised call.
func authRefused(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return errors.Is(err, rpctypes.ErrGRPCUserEmpty)
}

// followEndpoints makes the router's members follow clientv3's endpoints
// (SetEndpoints, Sync, AutoSyncInterval change them): a new endpoint
// becomes a member that takes traffic after its first good probe, a
// dropped one is retired (no new calls; streams there move). It runs
// after every probe round.
func (c *Client) followEndpoints() {
	cli := c.current.Load()
	e := c.entry.Load()
	if cli == nil || e == nil || c.closed.Load() {
		return
	}
	eps := cli.Endpoints()
	if slices.Equal(eps, c.endpoints) || len(eps) == 0 {
		return
	}
	ms, _, err := members.Build(eps, hostPort, c.zones)
	if err == nil {
		err = c.router.SetMembers(ms)
	}
	if err != nil {
		cli.GetLogger().Warn("oproute: endpoints not followed", zap.Strings("endpoints", eps), zap.Error(err))
		c.endpoints = eps
		return
	}
	byAddr := map[string]int{}
	for i, m := range c.router.Stats().Members {
		if !m.Retired {
			byAddr[m.Member.Addr] = i
		}
	}
	e.byAddr.Store(&byAddr)
	c.endpoints = eps
	// The balancer labelled the new endpoints' connections before the
	// router knew them: resolve again so that it labels them by member.
	cli.SetEndpoints(eps...)
}

// logEvent logs a router event on the client's zap logger, as etcd's own
// client logs: one line, the member and the evidence as fields.
func (c *Client) logEvent(e router.Event) {
	cli := c.current.Load()
	if cli == nil {
		return
	}
	fields := make([]zap.Field, 0, len(e.Attrs)+2)
	fields = append(fields, zap.String("component", "oproute"))
	if e.Member != "" {
		fields = append(fields, zap.String("member", e.Member))
	}
	for _, a := range e.Attrs {
		fields = append(fields, zap.Any(a.Key, a.Value.Any()))
	}
	lg := cli.GetLogger()
	if e.Level() >= slog.LevelWarn {
		lg.Warn(e.Kind, fields...)
	} else {
		lg.Info(e.Kind, fields...)
	}
}

// Collector returns the client's Prometheus metrics (router.Collector) for
// the caller to register; no global registry is touched.
func (c *Client) Collector() prometheus.Collector { return c.router.Collector() }

// Stats returns where operations went, the leader, ejections and fallbacks.
func (c *Client) Stats() router.Stats { return c.router.Stats() }

// Close closes the etcd client and stops the router. It is idempotent,
// and returns once the router's goroutines have ended. It closes the
// embedded client even when the router has already ended with it.
func (c *Client) Close() error {
	var err error
	c.closing.Do(func() {
		err = c.Client.Close() // cancels its Ctx: endWithInner stops the router
		if errors.Is(err, context.Canceled) {
			err = nil // clientv3 reports its own cancelled context on a clean close
		}
	})
	<-c.ended
	return err
}

// endWithInner stops the router when the embedded clientv3 client ends,
// however it ends: closed by Close or by anyone holding it (wrappers such
// as etcd's kubernetes.Client close only the client they embed), or its
// connection closed (ActiveConnection().Close()), after which no call
// can succeed. A router left probing would be a leak per wrapper.
func (c *Client) endWithInner(cli *clientv3.Client) {
	defer close(c.ended)
	conn := cli.ActiveConnection()
	for s := conn.GetState(); s != connectivity.Shutdown; s = conn.GetState() {
		if !conn.WaitForStateChange(cli.Ctx(), s) {
			break // the client was closed
		}
	}
	c.closed.Store(true)
	if e := c.entry.Load(); e != nil {
		e.leader.close()
	}
	c.router.Close()
	routers.Delete(c.id)
}
