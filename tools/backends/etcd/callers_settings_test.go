package etcd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// The caller's own gRPC settings are the caller's: its service config
// applies as on stock clientv3, and what it makes fail (its timeouts, its
// message size limits) is never held against a member. One cluster for
// both: neither faults it, and their keys are their own.
func TestCallersOwnSettings(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	t.Run("ServiceConfigMerged", func(t *testing.T) { testServiceConfigMerged(t, c) })
	t.Run("ReplyOverSizeLimit", func(t *testing.T) { testReplyOverSizeLimit(t, c) })
}

// The caller's service config reaches the connection as it reaches stock
// clientv3's: a method config that gives KV/Range a 1 µs timeout makes
// every Get fail with DeadlineExceeded under both, while Put, which it
// does not name, goes through. Stock takes it in DialOptions with
// WithDisableServiceConfig (else etcd's resolver's own config wins), the
// routed client in WithServiceConfig, beside its balancer. Those timeouts
// are the caller's: no member leaves the read pool. Put in the routed
// client's DialOptions instead, it is replaced by the router's, as
// documented.
func testServiceConfigMerged(t *testing.T, c *testbed.EtcdCluster) {
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
	waitReady(t, routed)
	const gets = 30 // about 10 a member, twice router.Config's default ConsecutiveFailures (5)
	for name, kv := range map[string]clientv3.KV{"stock": stock, "routed": routed} {
		if _, err := kv.Put(ctx, "caller/sc", "v"); err != nil {
			t.Fatalf("%s: Put, which the method config does not name: %v", name, err)
		}
		for range gets {
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := kv.Get(gctx, "caller/sc")
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
	if _, err := replaced.Get(ctx, "caller/sc"); err != nil {
		t.Fatalf("routed, the service config in DialOptions: Get %v, want it served (the config replaced)", err)
	}
}

// A reply larger than the client's MaxCallRecvMsgSize fails with gRPC's
// ResourceExhausted from every member alike, as with stock clientv3: it is
// the caller's error: no member counts it against itself, nor leaves the
// read pool for it, whether the reads are spread or all sent to one member
// (more failures in a row than Config.ConsecutiveFailures either way).
func testReplyOverSizeLimit(t *testing.T, c *testbed.EtcdCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := newClient(t, c).Put(ctx, "caller/big", strings.Repeat("x", 64<<10)); err != nil {
		t.Fatal(err)
	}
	cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), TLS: c.ClientTLS(), MaxCallRecvMsgSize: 16 << 10}
	stock, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stock.Close()
	routed, err := etcd.New(cfg, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer routed.Close()
	waitReady(t, routed)

	const reads = 60 // 20 a member, four times router.Config's default ConsecutiveFailures (5)
	for name, kv := range map[string]clientv3.KV{"stock": stock, "routed": routed} {
		for range reads {
			if _, err := kv.Get(ctx, "caller/big"); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("%s: a 64 KiB reply with a 16 KiB limit: %v, want ResourceExhausted", name, err)
			}
		}
	}
	// A member the caller's reads all go to fails them alone: still the
	// caller's error, not the member's.
	one := etcd.WithMember(ctx, c.Endpoints()[0])
	for range reads / c.Size() {
		if _, err := routed.Get(one, "caller/big"); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("routed to one member: %v, want ResourceExhausted", err)
		}
	}
	st := routed.Stats()
	var served int
	for _, m := range st.Members {
		if m.Ejections > 0 || m.Errors[router.LinearizableRead] > 0 {
			t.Errorf("%s: %d ejections (%q), %d read errors after replies over the caller's size limit, want none",
				m.Member.ID, m.Ejections, m.OutReason, m.Errors[router.LinearizableRead])
		}
		if m.Ops[router.LinearizableRead] > 0 {
			served++
		}
	}
	if served != c.Size() {
		t.Errorf("the reads reached %d of %d members, want every one (else the test judged fewer): %+v", served, c.Size(), st)
	}
}
