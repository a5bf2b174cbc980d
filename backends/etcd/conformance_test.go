package etcd_test

import (
	"context"
	"io"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) { conformance.Run(t, harness{}) }

// The membership test skips a backend that lacks these.
var (
	_ conformance.MembershipCluster = cluster{}
	_ conformance.MembershipClient  = client{}
)

type harness struct{}

func (harness) NewCluster(t *testing.T, size int) conformance.Cluster {
	return cluster{startCluster(t, testbed.DefaultTopology(size))}
}

var _ conformance.TopologyHarness = harness{}

func (harness) NewClusterOn(t *testing.T, topo testbed.Topology) conformance.Cluster {
	return cluster{startCluster(t, topo)}
}

func (harness) Connect(endpoints []string, policy string) (conformance.Client, error) {
	cli, err := etcd.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop(), DialTimeout: conformance.ConnectTimeout}, etcd.WithPolicy(policy))
	if err != nil {
		return nil, err
	}
	return client{cli}, nil
}

func startCluster(t *testing.T, topo testbed.Topology) *testbed.EtcdCluster {
	return testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: topo})
}

type cluster struct{ *testbed.EtcdCluster }

type client struct{ *etcd.Client }

func (c client) Put(ctx context.Context, key, value string) error {
	_, err := c.Client.Put(ctx, key, value)
	return err
}

func (c client) Get(ctx context.Context, key string) (string, bool, error) {
	resp, err := c.Client.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return "", false, err
	}
	return string(resp.Kvs[0].Value), true, nil
}

func (c client) Stats() router.Stats { return c.Client.Stats() }

// Resync is what an etcd user does: Sync (or AutoSyncInterval) reads the
// member list into the client's endpoints, which the router follows.
func (c client) Resync(ctx context.Context) error { return c.Client.Sync(ctx) }

func (c client) ReadOnlyTxn(ctx context.Context, key string) error {
	_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), ">", 0)).Then(clientv3.OpGet(key)).Else(clientv3.OpGet(key + "/other")).Commit()
	return err
}

func (c client) MixedTxn(ctx context.Context, key, value string) error {
	_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "!=", -1)).Then(clientv3.OpGet(key), clientv3.OpPut(key, value)).Commit()
	return err
}

func (c client) WatchFrom(ctx context.Context, member int, key string) (<-chan string, error) {
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

func (c client) HoldSession(ctx context.Context, ttl time.Duration) (<-chan struct{}, error) {
	s, err := concurrency.NewSession(c.Client.Client, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	lost := make(chan struct{})
	go func() { // ends with the session: expiry, or ctx
		<-s.Done()
		if ctx.Err() == nil {
			close(lost)
		}
	}()
	return lost, nil
}

func (c client) Defragment(ctx context.Context, member int) error {
	_, err := c.Client.Defragment(ctx, c.Endpoints()[member])
	return err
}

func (c client) Snapshot(ctx context.Context, member int) error {
	rc, err := c.Client.SnapshotWithVersion(etcd.WithMember(ctx, c.Endpoints()[member]))
	if err != nil {
		return err
	}
	defer rc.Snapshot.Close()
	_, err = io.Copy(io.Discard, rc.Snapshot)
	return err
}
