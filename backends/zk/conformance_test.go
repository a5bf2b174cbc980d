package zk_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) { conformance.Run(t, harness{}) }

// The membership test skips a backend that lacks these.
var (
	_ conformance.MembershipCluster = reconfigCluster{}
	_ conformance.MembershipClient  = client{}
	_ conformance.MembershipHarness = harness{}
)

type harness struct{}

func (harness) NewCluster(t *testing.T, size int) conformance.Cluster {
	return cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: testbed.DefaultTopology(size)})}
}

var _ conformance.TopologyHarness = harness{}

func (harness) NewClusterOn(t *testing.T, topo testbed.Topology) conformance.Cluster {
	return cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: topo})}
}

func (harness) Connect(endpoints []string, policy string) (conformance.Client, error) {
	servers := make([]string, len(endpoints))
	for i, ep := range endpoints {
		servers[i] = strings.TrimPrefix(ep, "http://")
	}
	cl := client{servers: servers, expired: make(chan struct{})}
	var once sync.Once
	conn, _, err := ozk.Connect(servers, sessionTimeout, ozk.WithPolicy(policy),
		ozk.WithConnectTimeout(conformance.ConnectTimeout), ozk.WithLogger(quiet{}),
		ozk.WithEventCallback(func(ev zk.Event) {
			if ev.State == zk.StateExpired {
				once.Do(func() { close(cl.expired) })
			}
		}))
	if err != nil {
		return nil, err
	}
	cl.Conn = conn
	return cl, nil
}

type cluster struct{ *testbed.ZKCluster }

// NewMembershipCluster starts an ensemble with dynamic reconfiguration:
// no delay proxies (testbed.ZKOptions.Reconfig).
func (harness) NewMembershipCluster(t *testing.T, size int) conformance.Cluster {
	return reconfigCluster{cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: testbed.DefaultTopology(size), Reconfig: true})}}
}

type reconfigCluster struct{ cluster }

func (c reconfigCluster) AddMember(ctx context.Context, zone string) (int, error) {
	return c.AddServer(ctx, zone)
}

func (c reconfigCluster) RemoveMember(ctx context.Context, i int) error {
	return c.RemoveServer(ctx, i)
}

// Resync reads the ensemble's configuration, as clientv3's Sync reads the
// member list.
func (c client) Resync(ctx context.Context) error { return c.SyncServers(ctx) }

// CutClients blackholes every client link; DirectEndpoints (the servers'
// own ports) stay reachable.
func (c cluster) CutClients(on bool) { c.BlackholeClients(on) }

type client struct {
	*ozk.Conn
	servers []string
	expired chan struct{}
}

func znode(key string) string { return "/" + strings.ReplaceAll(key, "/", "_") }

var acl = zk.WorldACL(zk.PermAll)

func (c client) Put(ctx context.Context, key, value string) error {
	p := znode(key)
	for {
		_, err := c.SetContext(ctx, p, []byte(value), -1)
		if err != zk.ErrNoNode {
			return err
		}
		if _, err = c.CreateContext(ctx, p, []byte(value), 0, acl); err != zk.ErrNodeExists {
			return err
		}
	}
}

func (c client) Get(ctx context.Context, key string) (string, bool, error) {
	d, _, err := c.GetContext(ctx, znode(key))
	if err == zk.ErrNoNode {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return string(d), true, nil
}

func (c client) Stats() router.Stats { return c.Conn.Stats() }

func (c client) PutEphemeral(ctx context.Context, key, value string) error {
	_, err := c.CreateContext(ctx, znode(key), []byte(value), zk.FlagEphemeral, acl)
	return err
}

func (c client) Owner(ctx context.Context, key string) (int64, error) {
	_, st, err := c.GetContext(ctx, znode(key))
	if err == zk.ErrNoNode {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.EphemeralOwner, nil
}

func (c client) WatchVia(ctx context.Context, member int, key string) (<-chan struct{}, error) {
	_, _, events, err := c.GetWContext(ozk.WithMember(ctx, c.servers[member]), znode(key))
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

func (c client) Expired() <-chan struct{} { return c.expired }

func (c client) SessionTimeout() time.Duration { return sessionTimeout }

func (c client) Close() error {
	c.Conn.Close()
	return nil
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// WatchFrom re-arms a data watch after each change, the first on server
// member's session and the next ones wherever the router prefers: a
// ZooKeeper watch is one-shot, and the session that holds it moves with
// its server.
func (c client) WatchFrom(ctx context.Context, member int, key string) (<-chan string, error) {
	p, wctx := znode(key), ozk.WithPreferredMember(ctx, c.servers[member])
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
				if err == nil || ctx.Err() != nil || err == ozk.ErrClosed {
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
func (c client) HoldSession(context.Context, time.Duration) (<-chan struct{}, error) {
	return c.expired, nil
}
