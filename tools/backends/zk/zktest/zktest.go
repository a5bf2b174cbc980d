// Package zktest adapts the routed ZooKeeper client to the project's test
// and benchmark harnesses, once: the conformance suite (conformance.Harness
// and its optional capabilities) and routebench (bench.Client) both use it,
// as net/http/httptest serves every test of an HTTP handler.
package zktest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

// Every capability the conformance suite probes for, checked at compile
// time: a method renamed fails the build, not a silent skip.
var (
	_ conformance.Harness           = Harness{}
	_ conformance.TopologyHarness   = Harness{}
	_ conformance.MembershipHarness = Harness{}
	_ conformance.Cluster           = Cluster{}
	_ conformance.ClientCutter      = Cluster{}
	_ conformance.MembershipCluster = ReconfigCluster{}
	_ conformance.Client            = (*Client)(nil)
	_ conformance.SessionClient     = (*Client)(nil)
	_ conformance.StreamClient      = (*Client)(nil)
	_ conformance.MembershipClient  = (*Client)(nil)
)

// SessionTimeout is the harness clients' session timeout.
const SessionTimeout = 6 * time.Second

// ACL is the open ACL the harnesses' znodes get.
var ACL = zk.WorldACL(zk.PermAll)

// Znode is key's znode: one level under the root.
func Znode(key string) string { return "/" + strings.ReplaceAll(key, "/", "_") }

// Harness starts test-bed ensembles and connects routed Conns.
type Harness struct{}

// NewCluster starts size servers on the default topology, closed when t ends.
func (Harness) NewCluster(t testing.TB, size int) conformance.Cluster {
	return Cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: testbed.DefaultTopology(size)})}
}

// NewClusterOn starts an ensemble on topo, closed when t ends.
func (Harness) NewClusterOn(t *testing.T, topo testbed.Topology) conformance.Cluster {
	return Cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: topo})}
}

// NewMembershipCluster starts an ensemble with dynamic reconfiguration:
// no delay proxies (testbed.ZKOptions.Reconfig).
func (Harness) NewMembershipCluster(t *testing.T, size int) conformance.Cluster {
	return ReconfigCluster{Cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: testbed.DefaultTopology(size), Reconfig: true})}}
}

// Connect returns a routed Conn with the named policy.
func (Harness) Connect(endpoints []string, policy string) (conformance.Client, error) {
	return Connect(endpoints, SessionTimeout, ozk.WithPolicy(policy), ozk.WithConnectTimeout(conformance.ConnectTimeout))
}

// Cluster is a test-bed ensemble as the conformance suite sees it.
type Cluster struct{ *testbed.ZKCluster }

// CutClients blackholes every client link; DirectEndpoints (the servers'
// own ports) stay reachable.
func (c Cluster) CutClients(on bool) { c.BlackholeClients(on) }

// ReconfigCluster is an ensemble whose membership changes by reconfig.
type ReconfigCluster struct{ Cluster }

// AddMember adds a server in zone by reconfig.
func (c ReconfigCluster) AddMember(ctx context.Context, zone string) (int, error) {
	return c.AddServer(ctx, zone)
}

// RemoveMember removes server i by reconfig.
func (c ReconfigCluster) RemoveMember(ctx context.Context, i int) error {
	return c.RemoveServer(ctx, i)
}

// Client is a routed Conn with the harnesses' operations.
type Client struct {
	*ozk.Conn
	servers []string
	timeout time.Duration
	expired chan struct{}
}

// Connect is ozk.Connect with a silent go-zookeeper logger, waiting for
// the router's probes and the session up to the session timeout (unless
// opts say otherwise); the Client notes when the primary session expires.
func Connect(endpoints []string, sessionTimeout time.Duration, opts ...ozk.Option) (*Client, error) {
	servers := make([]string, len(endpoints))
	for i, ep := range endpoints {
		servers[i] = strings.TrimPrefix(ep, "http://")
	}
	c := &Client{servers: servers, timeout: sessionTimeout, expired: make(chan struct{})}
	var once sync.Once
	opts = append([]ozk.Option{ozk.WithLogger(testutil.Discard{}), ozk.WithConnectTimeout(sessionTimeout), ozk.WithEventCallback(func(ev zk.Event) {
		if ev.State == zk.StateExpired {
			once.Do(func() { close(c.expired) })
		}
	})}, opts...)
	conn, _, err := ozk.Connect(servers, sessionTimeout, opts...)
	if err != nil {
		return nil, err
	}
	c.Conn = conn
	return c, nil
}

// Put writes key=value, creating its znode on first use.
func (c *Client) Put(ctx context.Context, key, value string) error {
	return c.Write(ctx, key, []byte(value))
}

// Write stores value under key's znode, creating it on first use
// (bench.Client).
func (c *Client) Write(ctx context.Context, key string, value []byte) error {
	return Put(ctx, c, key, value)
}

// ZnodeWriter is what Put needs of a client: ozk.Conn's calls.
type ZnodeWriter interface {
	SetContext(ctx context.Context, path string, data []byte, version int32) (*zk.Stat, error)
	CreateContext(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error)
}

// Put stores value under key's znode through w, creating it on first use.
func Put(ctx context.Context, w ZnodeWriter, key string, value []byte) error {
	return PutZnode(ctx, w, Znode(key), value)
}

// PutZnode stores value in the znode at path through w, creating it (with
// ACL; not its parents) on first use.
func PutZnode(ctx context.Context, w ZnodeWriter, path string, value []byte) error {
	for {
		_, err := w.SetContext(ctx, path, value, -1)
		if !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		if _, err = w.CreateContext(ctx, path, value, 0, ACL); !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
}

// Get is a linearizable read of key.
func (c *Client) Get(ctx context.Context, key string) (string, bool, error) {
	d, _, err := c.GetContext(ctx, Znode(key))
	if errors.Is(err, zk.ErrNoNode) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return string(d), true, nil
}

// ErrNoRanges: ZooKeeper has no range reads.
var ErrNoRanges = errors.New("zktest: ZooKeeper has no range reads")

// Read is a linearizable read of key; a missing znode is no error
// (bench.Client).
func (c *Client) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return ErrNoRanges
	}
	_, _, err := c.GetContext(ctx, Znode(key)) // the value is not copied out: a benchmark's hot path
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// Stats is the router's view.
func (c *Client) Stats() router.Stats { return c.Conn.Stats() }

// Resync reads the ensemble's configuration, as clientv3's Sync reads the
// member list.
func (c *Client) Resync(ctx context.Context) error { return c.SyncServers(ctx) }

// PutEphemeral creates key=value owned by the primary session.
func (c *Client) PutEphemeral(ctx context.Context, key, value string) error {
	_, err := c.CreateContext(ctx, Znode(key), []byte(value), zk.FlagEphemeral, ACL)
	return err
}

// Owner returns the session that owns ephemeral key, 0 if none does.
func (c *Client) Owner(ctx context.Context, key string) (int64, error) {
	_, st, err := c.GetContext(ctx, Znode(key))
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.EphemeralOwner, nil
}

// WatchVia sets a one-shot data watch on key through server member.
func (c *Client) WatchVia(ctx context.Context, member int, key string) (<-chan struct{}, error) {
	_, _, events, err := c.GetWContext(ozk.WithMember(ctx, c.servers[member]), Znode(key))
	if err != nil {
		return nil, err
	}
	fired := make(chan struct{}, 1)
	go func() { // ends with the watch: it fires, or Close ends it
		if ev := <-events; ev.Type == zk.EventNodeDataChanged || ev.Type == zk.EventNodeDeleted {
			fired <- struct{}{}
		}
	}()
	return fired, nil
}

// Expired is closed once the primary session has expired.
func (c *Client) Expired() <-chan struct{} { return c.expired }

// SessionTimeout is the timeout the Conn was opened with.
func (c *Client) SessionTimeout() time.Duration { return c.timeout }

// WatchFrom re-arms a data watch after each change, the first on server
// member's session and the next ones wherever the router prefers: a
// ZooKeeper watch is one-shot, and the session that holds it moves with
// its server.
func (c *Client) WatchFrom(ctx context.Context, member int, key string) (<-chan string, error) {
	p, wctx := Znode(key), ozk.WithPreferredMember(ctx, c.servers[member])
	_, _, events, err := c.GetWContext(wctx, p)
	if err != nil {
		return nil, err
	}
	out := make(chan string, 16)
	go func() { // ends when ctx does or the Conn closes
		defer close(out)
		for {
			select {
			case ev, ok := <-events:
				if !ok || ev.Type == zk.EventNotWatching {
					return
				}
			case <-ctx.Done():
				return
			}
			var d []byte
			var err error
			for {
				rctx, cancel := context.WithTimeout(wctx, 2*time.Second)
				d, _, events, err = c.GetWContext(rctx, p)
				cancel()
				if err == nil || ctx.Err() != nil || errors.Is(err, ozk.ErrClosed) {
					break
				}
			}
			if err != nil {
				return
			}
			select {
			case out <- string(d):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// HoldSession is the Conn's primary session; its timeout was fixed at
// Connect.
func (c *Client) HoldSession(context.Context, time.Duration) (<-chan struct{}, time.Duration, error) {
	return c.expired, c.timeout, nil
}

// Close closes the Conn.
func (c *Client) Close() error {
	c.Conn.Close()
	return nil
}
