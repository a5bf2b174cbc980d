package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/goleak"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// A router ends with the client it routes: closing only the embedded
// clientv3 client, as etcd's kubernetes.Client.Close does, stops the
// router's probe loop and every goroutine the routed client started (no
// Status call reaches a member after it); a later Close returns at once.
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
	everyRound := etcd.WithRouterConfig(func(rc *router.Config) { rc.StableProbeInterval = router.DefaultProbeInterval })
	cli := newClient(t, c, everyRound)
	kc := &kubernetes.Client{Client: cli.Client}
	kc.Kubernetes = kc
	if _, err := kc.Kubernetes.OptimisticPut(ctx, "k8s/a", []byte("v"), 0, kubernetes.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kc.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "the router stopped", func() bool { return etcd.Ended(cli) })

	before := statuses()
	window := time.NewTimer(2 * time.Second) // 8 probe rounds of a running router: the measured window
	<-window.C
	if n := statuses() - before; n != 0 {
		t.Fatalf("the members answered %d Status calls in 2 s after the inner client closed, want 0", n)
	}
	goleak.VerifyNone(t, running...) // before the routed client's own Close
	done := make(chan error, 1)
	go func() { done <- cli.Close() }()
	if err := testutil.Receive(t, done, 2*time.Second, "Close after the inner client closed"); err != nil {
		t.Fatalf("Close after the inner client closed: %v", err)
	}
}
