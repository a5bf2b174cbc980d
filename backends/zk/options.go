package zk

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/members"
	"github.com/oproute/oproute/router"
)

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

// WithConnectTimeout makes Connect wait, up to d, until the router has
// probed the servers (so that the first write goes to the leader) and the
// primary session is established, failing with ErrUnreachable if no
// server answers or gives it a session. Without it (or with 0) Connect
// returns at once and connects in the background, as zk.Connect does.
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

// DefaultMinEjectGap is the router's MinEjectGap for ZooKeeper, twice
// etcd's: a linearizable read here is two client round trips (sync, then
// the read: go-zookeeper cannot pipeline them with an ordering guarantee)
// plus the sync's hop to the leader, so a server one zone away reads about
// 6 ms slower than the others on the default test bed with nothing wrong.
const DefaultMinEjectGap = 10 * time.Millisecond
