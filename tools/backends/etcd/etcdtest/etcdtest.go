// Package etcdtest adapts the routed etcd client to the project's test and
// benchmark harnesses, once: the conformance suite (conformance.Harness and
// its optional capabilities) and routebench (bench.Client) both use it, as
// net/http/httptest serves every test of an HTTP handler.
package etcdtest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

// Every capability the conformance suite probes for, checked at compile
// time: a method renamed fails the build, not a silent skip.
var (
	_ conformance.Harness           = Harness{}
	_ conformance.TopologyHarness   = Harness{}
	_ conformance.ClosedErrorer     = (*Client)(nil)
	_ conformance.Cluster           = Cluster{}
	_ conformance.MembershipCluster = Cluster{}
	_ conformance.Client            = (*Client)(nil)
	_ conformance.TxnClient         = (*Client)(nil)
	_ conformance.StreamClient      = (*Client)(nil)
	_ conformance.MaintenanceClient = (*Client)(nil)
	_ conformance.MembershipClient  = (*Client)(nil)
)

// Harness starts test-bed etcd clusters and connects routed clients.
type Harness struct {
	// Server is testbed.EtcdOptions.Server: an etcd server of another
	// version (testbed.EtcdServer) for the clusters' members.
	Server string
}

// NewCluster starts size members on the default topology, closed when t ends.
func (h Harness) NewCluster(t testing.TB, size int) conformance.Cluster {
	return h.started(t, testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.DefaultTopology(size), Server: h.Server}))
}

// NewClusterOn starts a cluster on topo, closed when t ends.
func (h Harness) NewClusterOn(t *testing.T, topo testbed.Topology) conformance.Cluster {
	return h.started(t, testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: topo, Server: h.Server}))
}

// started checks, from the server side, that a cluster of another
// server's members runs it: each member's Status reports its version.
func (h Harness) started(t testing.TB, c *testbed.EtcdCluster) Cluster {
	t.Helper()
	if h.Server == "" {
		return Cluster{c}
	}
	want, err := testbed.EtcdServerVersion(h.Server)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Size() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Status(ctx, i)
		cancel()
		if err != nil {
			t.Fatalf("member %d's status: %v", i, err)
		}
		if st.Version != want {
			t.Fatalf("member %d runs etcd %s, want %s", i, st.Version, want)
		}
	}
	return Cluster{c}
}

// Connect returns a routed client with the named policy.
func (Harness) Connect(endpoints []string, policy string) (conformance.Client, error) {
	return Connect(clientv3.Config{Endpoints: endpoints, DialTimeout: conformance.ConnectTimeout}, etcd.WithPolicy(policy), etcd.WithConnectTimeout(conformance.ConnectTimeout))
}

// Cluster is a test-bed cluster as the conformance suite sees it.
type Cluster struct{ *testbed.EtcdCluster }

// Client is the routed client with the harnesses' operations.
type Client struct{ *etcd.Client }

// Connect is etcd.New with a silent logger unless cfg names one.
func Connect(cfg clientv3.Config, opts ...etcd.Option) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cli, err := etcd.New(cfg, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{cli}, nil
}

// Put writes key=value.
func (c *Client) Put(ctx context.Context, key, value string) error {
	_, err := c.Client.Put(ctx, key, value)
	return err
}

// Get is a linearizable read of key.
func (c *Client) Get(ctx context.Context, key string) (string, bool, error) {
	resp, err := c.Client.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return "", false, err
	}
	return string(resp.Kvs[0].Value), true, nil
}

// Write stores value under key (bench.Client).
func (c *Client) Write(ctx context.Context, key string, value []byte) error {
	_, err := c.Client.Put(ctx, key, string(value))
	return err
}

// Read is a linearizable read of key, or of [key, end) when end is not
// empty (bench.Client).
func (c *Client) Read(ctx context.Context, key, end string) error {
	var err error
	if end == "" {
		_, err = c.Client.Get(ctx, key)
	} else {
		_, err = c.Client.Get(ctx, key, clientv3.WithRange(end))
	}
	return err
}

// Stats is the router's view.
func (c *Client) Stats() router.Stats { return c.Client.Stats() }

// Resync is what an etcd user does: Sync (or AutoSyncInterval) reads the
// member list into the client's endpoints, which the router follows.
func (c *Client) Resync(ctx context.Context) error { return c.Client.Sync(ctx) }

// ReadOnlyTxn runs a transaction that only reads key.
func (c *Client) ReadOnlyTxn(ctx context.Context, key string) error {
	_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), ">", 0)).Then(clientv3.OpGet(key)).Else(clientv3.OpGet(key + "/other")).Commit()
	return err
}

// MixedTxn runs a transaction that reads key and writes key=value.
func (c *Client) MixedTxn(ctx context.Context, key, value string) error {
	_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "!=", -1)).Then(clientv3.OpGet(key), clientv3.OpPut(key, value)).Commit()
	return err
}

// WatchFrom watches key from member's stream, moving when it stops serving.
func (c *Client) WatchFrom(ctx context.Context, member int, key string) (<-chan string, error) {
	wch := c.Watch(etcd.WithPreferredMember(ctx, c.Endpoints()[member]), key)
	out := make(chan string, 16)
	go func() { // ends when ctx does: clientv3 closes wch
		defer close(out)
		for resp := range wch {
			for _, ev := range resp.Events {
				select {
				case out <- string(ev.Kv.Value):
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// HoldSession keeps a lease-backed session of ttl alive until ctx ends;
// the channel closes if the session is lost first.
func (c *Client) HoldSession(ctx context.Context, ttl time.Duration) (<-chan struct{}, time.Duration, error) {
	s, err := concurrency.NewSession(c.Client.Client, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return nil, 0, err
	}
	lost := make(chan struct{})
	go func() { // ends with the session: expiry, or ctx
		<-s.Done()
		if ctx.Err() == nil {
			close(lost)
		}
	}()
	return lost, ttl.Truncate(time.Second), nil
}

// Defragment defragments member's backend.
func (c *Client) Defragment(ctx context.Context, member int) error {
	_, err := c.Client.Defragment(ctx, c.Endpoints()[member])
	return err
}

// Snapshot streams a snapshot from member, discarding it.
func (c *Client) Snapshot(ctx context.Context, member int) error {
	rc, err := c.Client.SnapshotWithVersion(etcd.WithMember(ctx, c.Endpoints()[member]))
	if err != nil {
		return err
	}
	defer rc.Snapshot.Close()
	_, err = io.Copy(io.Discard, rc.Snapshot)
	return err
}

// Close closes the client.
func (c *Client) Close() error { return c.Client.Close() }

// IsClosed implements conformance.ClosedErrorer: after Close, clientv3's
// calls fail with gRPC's codes.Canceled (the connection is closing) or the
// client's cancelled context.
func (c *Client) IsClosed(err error) bool {
	return status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled)
}
