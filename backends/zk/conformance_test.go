package zk_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) { conformance.Run(t, harness{}) }

type harness struct{}

func (harness) NewCluster(t *testing.T, size int) conformance.Cluster {
	return cluster{testbed.StartZKT(t, testbed.ZKOptions{Topology: testbed.DefaultTopology(size)})}
}

func (harness) Connect(endpoints []string, policy string) (conformance.Client, error) {
	servers := make([]string, len(endpoints))
	for i, ep := range endpoints {
		servers[i] = strings.TrimPrefix(ep, "http://")
	}
	conn, _, err := ozk.Connect(servers, sessionTimeout, ozk.WithPolicy(policy),
		ozk.WithConnectTimeout(conformance.ConnectTimeout), ozk.WithLogger(quiet{}))
	if err != nil {
		return nil, err
	}
	return client{conn}, nil
}

type cluster struct{ *testbed.ZKCluster }

// Served counts what a server's own clients asked of it (mntr's request
// latency summaries count each request at the server the session is on):
// updates are writes (session creation included), reads include syncs.
func (c cluster) Served(ctx context.Context, i int) (conformance.Served, error) {
	m, err := c.Mntr(ctx, i)
	if err != nil {
		return conformance.Served{}, err
	}
	w, _ := strconv.ParseUint(m["zk_cnt_updatelatency"], 10, 64)
	r, _ := strconv.ParseUint(m["zk_cnt_readlatency"], 10, 64)
	return conformance.Served{Writes: w, Reads: r}, nil
}

type client struct{ *ozk.Conn }

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

func (c client) Close() error {
	c.Conn.Close()
	return nil
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
