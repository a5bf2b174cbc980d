package etcd

import (
	"context"
	"testing"

	"google.golang.org/grpc/balancer"

	"github.com/oproute/oproute/internal/pool"
	"github.com/oproute/oproute/router"
)

type fakeSubConn struct {
	balancer.SubConn
	member int
}

// The picker's fallback, for a member the router picked that has no ready
// connection, names the member by the router's stable index: after
// SetEndpoints retires a lower index, Members() (current members only) no
// longer lines up with it.
func TestPickerFallbackUsesStableIndex(t *testing.T) {
	ms := []router.Member{{ID: "a", Addr: "127.0.0.1:1"}, {ID: "b", Addr: "127.0.0.1:2"}, {ID: "c", Addr: "127.0.0.1:3"}}
	r, err := router.New(router.Config{Members: ms, Policy: router.RoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.SetMembers(ms[1:]); err != nil { // "a" (index 0) retired
		t.Fatal(err)
	}
	// Only "c" (stable index 2) has a connection; picks of "b" fall back.
	c := &fakeSubConn{member: 2}
	p := &picker{r: r, pool: pool.New([][]balancer.SubConn{nil, nil, {c}}), ready: []int{2}}
	for range 20 {
		res, err := p.Pick(balancer.PickInfo{FullMethodName: "/etcdserverpb.KV/Range", Ctx: context.Background()})
		if err != nil {
			t.Fatal(err)
		}
		if res.SubConn != c {
			t.Fatalf("picked %v, want member c's connection", res.SubConn)
		}
		if res.Done != nil {
			res.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
		}
	}
	if got := r.Stats().Members[2].Ops; got[router.Write]+got[router.LinearizableRead] != 20 {
		t.Fatalf("member c counted %v picks, want 20: %+v", got, r.Stats().Members)
	}
}
