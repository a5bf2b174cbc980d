package etcd_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// A router ends with the client it routes, however that ends: closing only
// the embedded clientv3 client, as etcd's kubernetes.Client.Close does, or
// only its connection (ActiveConnection().Close(), after which stock
// clientv3 leaves nothing running either) stops the router's probe loop
// and every goroutine the routed client started (no Status call reaches a
// member after it); a later Close returns at once.
func TestRouterEndsWithInnerClient(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx := context.Background()
	statuses := func() uint64 {
		var n uint64
		for i := range c.Size() {
			counts, err := c.GRPCCounts(ctx, i)
			if err != nil {
				t.Fatal(err)
			}
			n += counts["etcdserverpb.Maintenance/Status"]
		}
		return n
	}
	// The members' /metrics connections are the test's, not the client's.
	running := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop")}

	// Stock clientv3, its connection closed: nothing of it runs on.
	stock, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), TLS: c.ClientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stock.Get(ctx, "k8s/a"); err != nil {
		t.Fatal(err)
	}
	stock.ActiveConnection().Close()
	goleak.VerifyNone(t, running...)
	stock.Close()

	for _, end := range []struct {
		name string
		end  func(*etcd.Client) error
	}{
		{"kubernetes.Client.Close", func(cli *etcd.Client) error {
			kc := &kubernetes.Client{Client: cli.Client}
			kc.Kubernetes = kc
			if _, err := kc.Kubernetes.OptimisticPut(ctx, "k8s/a", []byte("v"), 0, kubernetes.PutOptions{}); err != nil {
				return err
			}
			return kc.Close()
		}},
		{"ActiveConnection().Close()", func(cli *etcd.Client) error {
			if _, err := cli.Put(ctx, "k8s/a", "v"); err != nil {
				return err
			}
			return cli.ActiveConnection().Close()
		}},
	} {
		t.Run(end.name, func(t *testing.T) {
			running := append(slices.Clone(running), goleak.IgnoreCurrent())
			everyRound := etcd.WithRouterConfig(func(rc *router.Config) { rc.StableProbeInterval = router.DefaultProbeInterval })
			cli := newClient(t, c, everyRound)
			if err := end.end(cli); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			testutil.Poll(t, 5*time.Second, "the router stopped", func() bool { return testhooks.EtcdEnded(cli) })

			// With only the connection closed no Status call could reach a
			// member anyway: there the Ended poll and goleak judge.
			before := statuses()
			window := time.NewTimer(2 * time.Second) // 8 probe rounds of a running router: the measured window
			<-window.C
			if n := statuses() - before; n != 0 {
				t.Fatalf("the members answered %d Status calls in 2 s after the client ended, want 0", n)
			}
			goleak.VerifyNone(t, running...) // before the routed client's own Close
			done := make(chan error, 1)
			go func() { done <- cli.Close() }()
			if err := testutil.Receive(t, done, 2*time.Second, "Close after the client ended"); err != nil {
				t.Fatalf("Close after the client ended: %v", err)
			}
			if err := cli.Ctx().Err(); err == nil {
				t.Fatal("Close left the embedded client open")
			}
		})
	}
}
