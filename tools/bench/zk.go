package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/internal/zk4lw"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/backends/zk/zktest"
	"github.com/oproute/oproute/tools/testbed"
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

// Attach uses an existing ensemble (host:port servers; with TLS their
// secureClientPort, where four-letter words go too) and creates the
// persistent znodes its keys go under (AttachOptions.KeyPrefix).
func (ZooKeeper) Attach(ctx context.Context, opts AttachOptions) (Cluster, error) {
	if len(opts.Endpoints) == 0 {
		return nil, ozk.ErrNoServers
	}
	p, err := opts.placement()
	if err != nil {
		return nil, err
	}
	c := &zkCluster{placement: p, admin: opts.Endpoints, attach: opts, paths: znodes{opts.KeyPrefix}}
	if _, err := c.Leader(ctx); err != nil {
		return nil, fmt.Errorf("bench: attach %v: %w", opts.Endpoints, err)
	}
	if err := c.makeParents(ctx); err != nil {
		return nil, fmt.Errorf("bench: attach %v: %w", opts.Endpoints, err)
	}
	return c, nil
}

type zkCluster struct {
	tb *testbed.ZKCluster // nil when attached
	placement
	admin  []string      // where four-letter words go: the servers' own ports
	attach AttachOptions // TLS and credentials; zero on the test bed
	paths  znodes        // the keys' znodes
	// created are the parent znodes this attach created, outermost first:
	// the only parents its cleanup may delete (one that was there before
	// is someone's, with its data and ACL).
	created []string
}

// dialer is how sessions reach the servers: go-zookeeper's own
// (net.DialTimeout), or TLS to an attached ensemble. The server name
// checked is the address's host unless the configuration names one.
func (c *zkCluster) dialer() zk.Dialer {
	cfg := c.attach.TLS
	if cfg == nil {
		return net.DialTimeout
	}
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, network, addr, cfg)
	}
}

// fourLetterDial is how four-letter words reach the servers: plain (nil),
// or over TLS to an attached ensemble's secure port.
func (c *zkCluster) fourLetterDial() zk4lw.Dialer {
	if c.attach.TLS == nil {
		return nil
	}
	d := &tls.Dialer{Config: c.attach.TLS}
	return d.DialContext
}

// digest is the digest scheme's credentials, user:password.
func (c *zkCluster) digest() []byte { return []byte(c.attach.Username + ":" + c.attach.Password) }

// addAuth gives a routed Conn the attached ensemble's credentials, if any:
// every session of it, present and future.
func (c *zkCluster) addAuth(ctx context.Context, conn *ozk.Conn) error {
	if c.attach.Username == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, SessionTimeout)
	defer cancel()
	if err := conn.AddAuthContext(ctx, "digest", c.digest()); err != nil {
		return fmt.Errorf("bench: digest auth as %s: %w", c.attach.Username, err)
	}
	return nil
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
	b, err := zk4lw.Send(ctx, c.fourLetterDial(), c.admin[i], "srvr")
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
		b, err := zk4lw.Send(cctx, c.fourLetterDial(), c.admin[i], "mntr")
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
		return c.connectStock(ctx)
	}
	if stockPolicy(policy) {
		return nil, fmt.Errorf("bench: %s is an etcd baseline (ZooKeeper's stock client is sticky)", policy)
	}
	opts := []ozk.Option{ozk.WithPolicy(routedPolicy(policy)), ozk.WithConnectTimeout(10 * time.Second), ozk.WithLogger(testutil.Discard{}), ozk.WithRouterConfig(routerTune(policy))}
	if ctx.Value(unsharedProbes{}) != nil {
		opts = append(opts, ozk.WithDialer(c.dialer())) // a dialer of its own: its probes are its own
	} else if c.attach.TLS != nil {
		opts = append(opts, ozk.WithTLS(c.attach.TLS))
	}
	if zones, ok := c.zonesByEndpoint(); ok {
		opts = append(opts, ozk.WithZones(c.clientZone, zones))
	}
	if policy == router.Sticky {
		if m := c.stickyMember(ctx); m != "" {
			opts = append(opts, ozk.WithRouterConfig(func(rc *router.Config) { rc.StickyMember = m }))
		}
	}
	conn, pin, err := connectPinned(ctx, policy, c, c.tb != nil, func() (*zktest.Client, error) {
		return c.connectWithAuth(ctx, opts...)
	})
	if err != nil {
		return nil, err
	}
	return &zkClient{Client: conn, pin: pin, paths: c.paths}, nil
}

// zkClient is the routed Conn (zktest's adapter), its writes pinned where
// the policy says (Oracle, StaticLeader).
type zkClient struct {
	*zktest.Client
	pin   *writePin
	paths znodes
}

func (c *zkClient) Write(ctx context.Context, key string, value []byte) error {
	return zktest.PutZnode(c.pin.route(ctx, ozk.WithMember), c.Client, c.paths.znode(key), value)
}

// Read is zktest's, on the key's znode.
func (c *zkClient) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return ErrNoRanges
	}
	_, _, err := c.GetContext(ctx, c.paths.znode(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
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
type stockZK struct {
	conn  *zk.Conn
	paths znodes
}

func (c *zkCluster) connectStock(ctx context.Context) (Client, error) {
	conn, events, err := zk.Connect(c.endpoints, SessionTimeout, zk.WithLogger(testutil.Discard{}), zk.WithDialer(c.dialer()))
	if err != nil {
		return nil, err
	}
	go func() {
		for range events { // drained until Close closes it
		}
	}()
	if c.attach.Username != "" {
		// go-zookeeper sends it once connected, and again on every reconnect.
		actx, cancel := context.WithTimeout(ctx, SessionTimeout)
		_, err := call(actx, func() (struct{}, error) { return struct{}{}, conn.AddAuth("digest", c.digest()) })
		cancel()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("bench: digest auth as %s: %w", c.attach.Username, err)
		}
	}
	return &stockZK{conn: conn, paths: c.paths}, nil
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
	return zktest.PutZnode(ctx, c, c.paths.znode(key), value)
}

// Read is the paper's linearizable read on ZooKeeper: sync, then the read,
// on the one session.
func (c *stockZK) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return ErrNoRanges
	}
	p := c.paths.znode(key)
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
	_, _, _, err := c.ExistsWContext(ctx, c.paths.znode(key))
	return func() {}, err
}

// HoldStreams implements the fleet's streamHolder, as zkClient's.
func (c *stockZK) HoldStreams(_ context.Context, key string) (func(), error) {
	_, _, _, err := c.conn.ExistsW(c.paths.znode(key))
	return func() {}, err
}

// serverVersions implements versionTeller: each server's srvr.
func (c *zkCluster) serverVersions(ctx context.Context) []string {
	out := make([]string, len(c.admin))
	var wg sync.WaitGroup
	for i := range c.admin {
		wg.Go(func() {
			if st, err := c.srvr(ctx, i); err == nil {
				out[i] = st.Version
			}
		})
	}
	wg.Wait()
	return out
}

// adminConn is a routed Conn for the keys' parents and their cleanup, with
// the TLS and credentials every client has.
func (c *zkCluster) adminConn(ctx context.Context) (*zktest.Client, error) {
	opts := []ozk.Option{ozk.WithConnectTimeout(10 * time.Second), ozk.WithLogger(testutil.Discard{})}
	if c.attach.TLS != nil {
		opts = append(opts, ozk.WithTLS(c.attach.TLS))
	}
	return c.connectWithAuth(ctx, opts...)
}

// connectWithAuth connects a routed Conn with opts and the credentials
// every client has.
func (c *zkCluster) connectWithAuth(ctx context.Context, opts ...ozk.Option) (*zktest.Client, error) {
	conn, err := zktest.Connect(c.endpoints, SessionTimeout, opts...)
	if err != nil {
		return nil, err
	}
	if err := c.addAuth(ctx, conn.Conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// parentsTimeout bounds creating the keys' parent znodes.
const parentsTimeout = 30 * time.Second

// makeParents creates the persistent znodes the keys go under, outermost
// first, open to all as the keys' own (zktest.ACL). Outer ones that exist
// stay as they are; the innermost must be new, the run's own, which claims
// the prefix: another run, or an application's znode of that name, makes
// it ErrPrefixInUse.
func (c *zkCluster) makeParents(ctx context.Context) error {
	parents := c.paths.parents()
	if len(parents) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, parentsTimeout)
	defer cancel()
	conn, err := c.adminConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	for i, p := range parents {
		_, err := conn.CreateContext(ctx, p, nil, 0, zktest.ACL)
		switch {
		case err == nil:
			c.created = append(c.created, p)
		case errors.Is(err, zk.ErrNodeExists) && i < len(parents)-1:
		case errors.Is(err, zk.ErrNodeExists):
			c.deleteCreated(ctx, conn)
			return fmt.Errorf("%w: %s exists", ErrPrefixInUse, p)
		default:
			c.deleteCreated(ctx, conn)
			return fmt.Errorf("bench: creating %s: %w", p, err)
		}
	}
	return nil
}

// deleteCreated deletes the parents this attach created, innermost first,
// as far as they are empty, and forgets them.
func (c *zkCluster) deleteCreated(ctx context.Context, conn *zktest.Client) error {
	for i := len(c.created) - 1; i >= 0; i-- {
		err := conn.DeleteContext(ctx, c.created[i], -1)
		if errors.Is(err, zk.ErrNotEmpty) {
			return nil // another's keys, or a stray one: it stays, with what is above it
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("bench: deleting %s: %w", c.created[i], err)
		}
		c.created = c.created[:i]
	}
	return nil
}

// keyZnodes are the znodes of the keys under prefix: its innermost
// parent's children, or with the test bed's naming the root's children
// named as its keys are.
func keyZnodes(ctx context.Context, conn *zktest.Client, prefix string) ([]string, error) {
	z := znodes{prefix}
	dir, name := "/", z.flatPrefix()
	if parents := z.parents(); len(parents) > 0 {
		dir, name = parents[len(parents)-1], ""
	}
	children, _, err := conn.ChildrenContext(ctx, dir)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bench: listing %s: %w", dir, err)
	}
	var out []string
	for _, child := range children {
		if strings.HasPrefix(child, name) {
			out = append(out, path.Join(dir, child))
		}
	}
	return out, nil
}

// claimKeys implements keyStore. Attach claimed the prefix already when
// it created its innermost znode (makeParents); with the test bed's flat
// naming, which has no parent to create, the root's children are counted.
func (c *zkCluster) claimKeys(ctx context.Context, prefix string) error {
	conn, err := c.adminConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	keys, err := keyZnodes(ctx, conn, prefix)
	if err == nil && len(keys) > 0 {
		err = ErrPrefixInUse
	}
	return err
}

// zkDeleteBatch is how many znodes one Multi deletes: its request and
// answer stay well under ZooKeeper's jute.maxbuffer (1 MiB by default).
const zkDeleteBatch = 500

// deleteKeys implements keyStore: the keys' znodes in batches, a Multi
// each, then the parents this attach created, innermost first, as far as
// they are empty; parents that were there before stay.
func (c *zkCluster) deleteKeys(ctx context.Context, prefix string) (int64, error) {
	conn, err := c.adminConn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	keys, err := keyZnodes(ctx, conn, prefix)
	if err != nil {
		return 0, err
	}
	var deleted int64
	var errs []error
	for batch := range slices.Chunk(keys, zkDeleteBatch) {
		n, err := deleteZnodes(ctx, conn, batch)
		deleted += n
		errs = append(errs, err)
	}
	errs = append(errs, c.deleteCreated(ctx, conn))
	return deleted, errors.Join(errs...)
}

// deleteZnodes deletes paths in one Multi, or one by one when it fails (a
// znode already gone fails the whole of it), and returns how many it
// deleted.
func deleteZnodes(ctx context.Context, conn *zktest.Client, paths []string) (int64, error) {
	ops := make([]any, len(paths))
	for i, p := range paths {
		ops[i] = &zk.DeleteRequest{Path: p, Version: -1}
	}
	res, err := conn.MultiContext(ctx, ops...)
	if err == nil && !slices.ContainsFunc(res, func(r zk.MultiResponse) bool { return r.Error != nil }) {
		return int64(len(paths)), nil
	}
	var n int64
	var errs []error
	for _, p := range paths {
		switch err := conn.DeleteContext(ctx, p, -1); {
		case err == nil:
			n++
		case !errors.Is(err, zk.ErrNoNode):
			errs = append(errs, fmt.Errorf("bench: deleting %s: %w", p, err)) // and go on with the rest
		}
	}
	return n, errors.Join(errs...)
}
