package etcd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// A reply larger than the client's MaxCallRecvMsgSize fails with gRPC's
// ResourceExhausted from every member alike, as with stock clientv3: it is
// the caller's error: no member counts it against itself, nor leaves the
// read pool for it, whether the reads are spread or all sent to one member
// (more failures in a row than Config.ConsecutiveFailures either way).
func TestReplyOverSizeLimitIsTheCallersError(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := newClient(t, c).Put(ctx, "big", strings.Repeat("x", 64<<10)); err != nil {
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
	testutil.Poll(t, 10*time.Second, "the routed client ready", func() bool { return allProbed(routed) && routed.Stats().Leader != "" })

	const reads = 60 // 20 a member, four times router.Config's default ConsecutiveFailures (5)
	for name, kv := range map[string]clientv3.KV{"stock": stock, "routed": routed} {
		for range reads {
			if _, err := kv.Get(ctx, "big"); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("%s: a 64 KiB reply with a 16 KiB limit: %v, want ResourceExhausted", name, err)
			}
		}
	}
	// A member the caller's reads all go to fails them alone: still the
	// caller's error, not the member's.
	one := etcd.WithMember(ctx, c.Endpoints()[0])
	for range reads / c.Size() {
		if _, err := routed.Get(one, "big"); status.Code(err) != codes.ResourceExhausted {
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
