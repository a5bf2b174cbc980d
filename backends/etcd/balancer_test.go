package etcd

import (
	"context"
	"testing"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/resolver"

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

// The prober is told a member's connection is ready once gRPC has
// installed the picker that has it, not when the picker is built: a probe
// woken by it that met the picker before would fail through clientv3's
// retry interceptor and log a "no ready connection" warning (it did at
// start-up, TestProbesDoNotWarnWhileConnecting, in a clean-clone CI).
func TestReadyMembersPublishedOnceInstalled(t *testing.T) {
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
	grpc := &installingCC{e: e}
	cc := publishingCC{grpc, pb}
	install := func(members ...int) {
		ready := map[balancer.SubConn]base.SubConnInfo{}
		for _, m := range members {
			ready[&fakeSubConn{member: m}] = base.SubConnInfo{Address: resolver.Address{Attributes: attributes.New(connAttr{}, connID{member: m})}}
		}
		cc.UpdateState(balancer.State{Picker: pb.Build(base.PickerBuildInfo{ReadySCs: ready})})
	}
	install(0)
	install(0, 1)
	if grpc.earlyReady {
		t.Error("member b reported ready to the prober before gRPC installed the picker that has it")
	}
	for i, want := range []bool{true, true, false} {
		if got := e.isConnected(i); got != want {
			t.Errorf("member %d: ready %v once installed, want %v", i, got, want)
		}
	}
}

// installingCC stands for gRPC installing a picker: it notes whether the
// prober already saw a member ready that the picker before this one lacks.
type installingCC struct {
	balancer.ClientConn
	e          *routerEntry
	installed  balancer.Picker
	earlyReady bool
}

func (c *installingCC) UpdateState(s balancer.State) {
	if old, ok := c.installed.(*picker); ok {
		for i := range 3 {
			if _, has := old.pool.Get(i); !has && c.e.isConnected(i) {
				c.earlyReady = true
			}
		}
	}
	c.installed = s.Picker
}
