package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/backends/zk/zktest"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/internal/zk4lw"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// ZooKeeper is the ZooKeeper backend: ensembles of real servers from
// Debian's zookeeper package on the test bed, or an existing ensemble.
type ZooKeeper struct {
	// CPUBudgets confine the test bed's servers; zero: shared cores.
	testbed.CPUBudgets
}

// Name returns "zk".
func (ZooKeeper) Name() string { return "zk" }

// SessionTimeout is the benchmark clients' session timeout.
const SessionTimeout = 10 * time.Second

// Start starts an ensemble on the test bed.
func (z ZooKeeper) Start(ctx context.Context, topo testbed.Topology) (Cluster, error) {
	tb, err := testbed.StartZK(ctx, testbed.ZKOptions{Topology: topo, CPUBudgets: z.CPUBudgets})
	if err != nil {
		return nil, err
	}
	c := &zkCluster{tb: tb, placement: placedOn(tb.Endpoints(), topo), admin: tb.DirectEndpoints()}
	if err := c.warmUp(ctx, jvmWarmUp); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// jvmWarmUp is how long a fresh ensemble serves a round-robin load before
// the first trial: a cold JVM interprets before its JIT compiles. With 5 s
// the first trial still ran 2–3× slower than the fifth (round_robin write
// P50 11 ms in trial 1, 4 ms from trial 4 on).
const jvmWarmUp = 20 * time.Second

func (c *zkCluster) warmUp(ctx context.Context, d time.Duration) error {
	cli, err := c.Connect(ctx, router.RoundRobin, 1)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				key := fmt.Sprintf("warmup/%d", (w*7919+n)%200)
				if n%5 == 0 {
					cli.Write(ctx, key, []byte("warm"))
				} else {
					cli.Read(ctx, key, "")
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// Attach uses an existing ensemble (host:port servers).
func (ZooKeeper) Attach(ctx context.Context, endpoints []string) (Cluster, error) {
	if len(endpoints) == 0 {
		return nil, ozk.ErrNoServers
	}
	c := &zkCluster{placement: placement{endpoints: endpoints}, admin: endpoints}
	if _, err := c.Leader(ctx); err != nil {
		return nil, fmt.Errorf("bench: attach %v: %w", endpoints, err)
	}
	return c, nil
}

type zkCluster struct {
	tb *testbed.ZKCluster // nil when attached
	placement
	admin []string // where four-letter words go: the servers' own ports
}

func (c *zkCluster) Faults() Faults {
	if c.tb == nil {
		return nil
	}
	return c.tb
}

func (c *zkCluster) srvr(ctx context.Context, i int) (zk4lw.Srvr, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b, err := zk4lw.Send(ctx, nil, c.admin[i], "srvr")
	if err != nil {
		return zk4lw.Srvr{}, err
	}
	return zk4lw.ParseSrvr(b)
}

func (c *zkCluster) Leader(ctx context.Context) (int, error) {
	if c.tb != nil {
		return c.tb.Leader(ctx)
	}
	for i := range c.admin {
		if st, err := c.srvr(ctx, i); err == nil && st.Mode == "leader" {
			return i, nil
		}
	}
	return -1, testbed.ErrNoLeader
}

// Served counts the requests each server's own sessions made (mntr's
// latency summaries count a request where its session is): updates are
// writes, reads include each linearizable read's sync.
func (c *zkCluster) Served(ctx context.Context) ([]Served, error) {
	return servedByMember(len(c.admin), func(i int) (Served, error) {
		if c.tb != nil && c.tb.Server(i).PID() == 0 {
			return Served{}, nil
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b, err := zk4lw.Send(cctx, nil, c.admin[i], "mntr")
		if err != nil {
			return Served{}, err
		}
		n := zk4lw.ParseRequests(zk4lw.ParseMntr(b))
		return Served{Writes: n.Updates, Reads: n.Reads}, nil
	})
}

func (c *zkCluster) ServerCPU() []time.Duration { return membersCPU(c.bed()) }

func (c *zkCluster) bed() bedCPU {
	if c.tb == nil {
		return nil // not a nil *testbed cluster in an interface
	}
	return c.tb
}

func (c *zkCluster) Traffic() (testbed.TrafficCounts, error) {
	if c.tb == nil {
		return testbed.TrafficCounts{}, ErrNeedsTestbed
	}
	return c.tb.Traffic()
}

func (c *zkCluster) Close() error {
	if c.tb != nil {
		return c.tb.Close()
	}
	return nil
}

// stickyMember is the server a sticky session is pinned to, as in the
// paper's Table VI: a follower in the client's zone.
func (c *zkCluster) stickyMember(ctx context.Context) string {
	leader, _ := c.Leader(ctx)
	for i, z := range c.zones {
		if z == c.clientZone && i != leader {
			return c.endpoints[i]
		}
	}
	return ""
}

func (c *zkCluster) Connect(ctx context.Context, policy string, _ int) (Client, error) {
	if policy == Stock {
		return c.connectStock()
	}
	if stockPolicy(policy) {
		return nil, fmt.Errorf("bench: %s is an etcd baseline (ZooKeeper's stock client is sticky)", policy)
	}
	opts := []ozk.Option{ozk.WithPolicy(routedPolicy(policy)), ozk.WithConnectTimeout(10 * time.Second), ozk.WithLogger(testutil.Discard{}), ozk.WithRouterConfig(routerTune(policy))}
	if ctx.Value(unsharedProbes{}) != nil {
		opts = append(opts, ozk.WithDialer(net.DialTimeout)) // a dialer of its own: its probes are its own
	}
	if zones, ok := c.zonesByEndpoint(); ok {
		opts = append(opts, ozk.WithZones(c.clientZone, zones))
	}
	if policy == router.Sticky {
		if m := c.stickyMember(ctx); m != "" {
			opts = append(opts, ozk.WithRouterConfig(func(rc *router.Config) { rc.StickyMember = m }))
		}
	}
	conn, pin, err := connectPinned(ctx, policy, c, c.tb != nil, func() (*zktest.Client, error) { return zktest.Connect(c.endpoints, SessionTimeout, opts...) })
	if err != nil {
		return nil, err
	}
	return &zkClient{Client: conn, pin: pin}, nil
}

// zkClient is the routed Conn (zktest's adapter), its writes pinned where
// the policy says (Oracle, StaticLeader).
type zkClient struct {
	*zktest.Client
	pin *writePin
}

func (c *zkClient) Write(ctx context.Context, key string, value []byte) error {
	return c.Client.Write(c.pin.route(ctx, ozk.WithMember), key, value)
}

// ErrNoRanges: ZooKeeper has no range reads.
var ErrNoRanges = zktest.ErrNoRanges

func (c *zkClient) Close() error {
	c.pin.close()
	return c.Client.Close()
}

// ProbeRequests is the client connections the servers' proxies accepted so
// far: the routed clients' srvr probes (one connection each; ZooKeeper
// closes a connection after one four-letter word) and their sessions'
// (re)connections, which a settled fleet does not make.
func (c *zkCluster) ProbeRequests(context.Context) (uint64, error) {
	if c.tb == nil {
		return 0, ErrNoProbeCounts
	}
	var n uint64
	for i := range c.endpoints {
		n += c.tb.ClientConnections(i)
	}
	return n, nil
}

// zkErrorClasses names the errors a ZooKeeper write fails with, by value.
var zkErrorClasses = []struct {
	err   error
	class string
}{
	{ozk.ErrClosed, "closed"},
	{ozk.ErrUnreachable, "unreachable"},
	{zk.ErrConnectionClosed, "connection_closed"},
	{zk.ErrNoServer, "no_server"},
	{zk.ErrSessionExpired, "session_expired"},
	{zk.ErrSessionMoved, "session_moved"},
	{zk.ErrNoAuth, "no_auth"},
	{context.Canceled, "canceled"},
}

// ErrorClass implements the fleet's errorClasser.
func (c *zkClient) ErrorClass(err error) string { return zkErrorClass(err) }

// zkErrorClass names a ZooKeeper error by its value, "" for none known.
func zkErrorClass(err error) string {
	for _, e := range zkErrorClasses {
		if errors.Is(err, e.err) {
			return e.class
		}
	}
	return ""
}

// stockZK is plain go-zookeeper, the fleet's baseline: zk.Connect over the
// servers (it shuffles them and keeps its one session on one server,
// heartbeating it), with no probes.
type stockZK struct{ conn *zk.Conn }

func (c *zkCluster) connectStock() (Client, error) {
	conn, events, err := zk.Connect(c.endpoints, SessionTimeout, zk.WithLogger(testutil.Discard{}))
	if err != nil {
		return nil, err
	}
	go func() {
		for range events { // drained until Close closes it
		}
	}()
	return &stockZK{conn}, nil
}

// call runs fn, which takes no context, abandoning it when ctx ends first:
// go-zookeeper has no per-call deadline. An abandoned call ends when its
// answer comes or the connection does.
func call[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func (c *stockZK) SetContext(ctx context.Context, path string, data []byte, version int32) (*zk.Stat, error) {
	return call(ctx, func() (*zk.Stat, error) { return c.conn.Set(path, data, version) })
}

func (c *stockZK) CreateContext(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return call(ctx, func() (string, error) { return c.conn.Create(path, data, flags, acl) })
}

func (c *stockZK) Write(ctx context.Context, key string, value []byte) error {
	return zktest.Put(ctx, c, key, value)
}

// Read is the paper's linearizable read on ZooKeeper: sync, then the read,
// on the one session.
func (c *stockZK) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return ErrNoRanges
	}
	p := zktest.Znode(key)
	_, err := call(ctx, func() ([]byte, error) {
		if _, err := c.conn.Sync(p); err != nil {
			return nil, err
		}
		v, _, err := c.conn.Get(p)
		return v, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

func (c *stockZK) Stats() router.Stats { return router.Stats{} }

func (c *stockZK) ErrorClass(err error) string { return zkErrorClass(err) }

func (c *stockZK) Close() error {
	c.conn.Close()
	return nil
}

// HoldStreams implements the fleet's streamHolder: a watch on key's znode
// (one-shot, and nothing changes it during a fleet's run).
func (c *zkClient) HoldStreams(ctx context.Context, key string) (func(), error) {
	_, _, _, err := c.ExistsWContext(ctx, zktest.Znode(key))
	return func() {}, err
}

// HoldStreams implements the fleet's streamHolder, as zkClient's.
func (c *stockZK) HoldStreams(_ context.Context, key string) (func(), error) {
	_, _, _, err := c.conn.ExistsW(zktest.Znode(key))
	return func() {}, err
}
