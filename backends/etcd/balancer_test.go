package etcd

import (
	"context"
	"testing"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

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

// Build records the members with a ready connection and wakes the prober
// before gRPC installs the picker it returns, so a probe can reach the
// picker before. A probe of a member the newer picker has waits for it;
// one of a member no picker has fails at once. (Failing the first logged a
// "no ready connection" warning through clientv3's retry interceptor at
// start-up, TestProbesDoNotWarnWhileConnecting, in a clean-clone CI.)
func TestProbeWaitsForTheNewerPicker(t *testing.T) {
	ms := []router.Member{{ID: "a", Addr: "127.0.0.1:1"}, {ID: "b", Addr: "127.0.0.1:2"}, {ID: "c", Addr: "127.0.0.1:3"}}
	r, err := router.New(router.Config{Members: ms})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e := &routerEntry{r: r}
	byAddr := map[string]int{ms[0].Addr: 0, ms[1].Addr: 1, ms[2].Addr: 2}
	e.byAddr.Store(&byAddr)
	pb := &pickerBuilder{entry: e}
	build := func(members ...int) balancer.Picker {
		ready := map[balancer.SubConn]base.SubConnInfo{}
		for _, m := range members {
			ready[&fakeSubConn{member: m}] = base.SubConnInfo{Address: resolver.Address{Attributes: attributes.New(connAttr{}, connID{member: m})}}
		}
		return pb.Build(base.PickerBuildInfo{ReadySCs: ready})
	}
	probe := func(p balancer.Picker, idx int) error {
		_, err := p.Pick(balancer.PickInfo{FullMethodName: "/etcdserverpb.Maintenance/Status", Ctx: context.WithValue(context.Background(), probeKey{}, idx)})
		return err
	}
	installed := build(0)
	build(0, 1) // not installed yet
	if err := probe(installed, 1); err != balancer.ErrNoSubConnAvailable {
		t.Errorf("probe of a member the newer picker has: %v, want balancer.ErrNoSubConnAvailable (wait for it)", err)
	}
	if err := probe(installed, 2); status.Code(err) != codes.Unavailable {
		t.Errorf("probe of a member no picker has: %v, want codes.Unavailable at once", err)
	}
	if err := probe(installed, 0); err != nil {
		t.Errorf("probe of a member the picker has: %v", err)
	}
}
