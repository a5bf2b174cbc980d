package etcd_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// The caller's service config reaches the connection as it reaches stock
// clientv3's: a method config that gives KV/Range a 1 µs timeout makes
// every Get fail with DeadlineExceeded under both, while Put, which it
// does not name, goes through. Stock takes it in DialOptions with
// WithDisableServiceConfig (else etcd's resolver's own config wins), the
// routed client in WithServiceConfig, beside its balancer. Those timeouts
// are the caller's: no member leaves the read pool. Put in the routed
// client's DialOptions instead, it is replaced by the router's, as
// documented.
func TestServiceConfigMerged(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const rangeTimesOut = `{"methodConfig":[{"name":[{"service":"etcdserverpb.KV","method":"Range"}],"timeout":"0.000001s"}]}`
	// One attempt a call: clientv3 retries a Range that timed out while
	// its caller's context is live, up to MaxUnaryRetries (100) times.
	base := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), TLS: c.ClientTLS(), MaxUnaryRetries: 1}
	inDialOptions := base
	inDialOptions.DialOptions = []grpc.DialOption{grpc.WithDisableServiceConfig(), grpc.WithDefaultServiceConfig(rangeTimesOut)}

	stock, err := clientv3.New(inDialOptions)
	if err != nil {
		t.Fatal(err)
	}
	defer stock.Close()
	routed, err := etcd.New(base, etcd.WithServiceConfig(rangeTimesOut), etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer routed.Close()
	testutil.Poll(t, 10*time.Second, "the routed client ready", func() bool { return allProbed(routed) && routed.Stats().Leader != "" })
	const gets = 30 // about 10 a member, twice router.Config's default ConsecutiveFailures (5)
	for name, kv := range map[string]clientv3.KV{"stock": stock, "routed": routed} {
		if _, err := kv.Put(ctx, "sc", "v"); err != nil {
			t.Fatalf("%s: Put, which the method config does not name: %v", name, err)
		}
		for range gets {
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := kv.Get(gctx, "sc")
			gcancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("%s: Get under a 1 µs method timeout: %v, want DeadlineExceeded", name, err)
			}
		}
	}
	for _, m := range routed.Stats().Members {
		if m.Ejections > 0 || m.Errors[router.LinearizableRead] > 0 {
			t.Errorf("%s: %d ejections (%q), %d read errors after the caller's own timeouts, want none",
				m.Member.ID, m.Ejections, m.OutReason, m.Errors[router.LinearizableRead])
		}
	}

	replaced, err := etcd.New(inDialOptions, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer replaced.Close()
	if _, err := replaced.Get(ctx, "sc"); err != nil {
		t.Fatalf("routed, the service config in DialOptions: Get %v, want it served (the config replaced)", err)
	}
}
