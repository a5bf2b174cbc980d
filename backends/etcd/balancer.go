package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/internal/override"
	"github.com/oproute/oproute/internal/pool"
	"github.com/oproute/oproute/router"
)

// balancerName is the gRPC load-balancing policy this package registers.
const balancerName = "oproute_etcd"

func init() { balancer.Register(builder{}) }

// routers maps a client's id (named in its service config) to its router:
// grpc builds balancers itself, so the config is how one finds its router.
var routers sync.Map // string → *routerEntry

type routerEntry struct {
	r              *router.Router
	connsPerMember int
	// byAddr maps each current member's address to its router index; it
	// follows the client's endpoints (followEndpoints).
	byAddr atomic.Pointer[map[string]int]
	// connected holds, per balancer (*pickerBuilder), the members with a
	// ready connection in the picker gRPC last installed, for the prober:
	// probing a member with none would only fail, and clientv3's retry
	// interceptor would log each attempt as a warning. Per balancer,
	// because clientv3 opens short-lived connections of its own for
	// Status, HashKV and Defragment with the same dial options, hence this
	// balancer too.
	connected sync.Map // *pickerBuilder → []int
	// leader is what writes waiting for a reachable leader watch.
	leader leaderWatch
}

// indexOf returns the router index of the member at addr.
func (e *routerEntry) indexOf(addr string) (int, bool) {
	i, ok := (*e.byAddr.Load())[addr]
	return i, ok
}

// isConnected reports whether member idx has a ready connection.
func (e *routerEntry) isConnected(idx int) bool {
	found := false
	e.connected.Range(func(_, v any) bool {
		found = slices.Contains(v.([]int), idx)
		return !found
	})
	return found
}

type lbConfig struct {
	serviceconfig.LoadBalancingConfig
	Router string `json:"router"`
}

type builder struct{}

func (builder) Name() string { return balancerName }

func (builder) ParseConfig(raw json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var cfg lbConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("%s: config: %w", balancerName, err)
	}
	return &cfg, nil
}

func (builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return &lb{cc: cc, opts: opts}
}

// lb wraps grpc's base balancer, which keeps one SubConn per address, and
// hands it each member's address Conns times with distinct attributes, so
// that base keeps a pool of connections per member. The router is found
// on the first config update.
type lb struct {
	cc    balancer.ClientConn
	opts  balancer.BuildOptions
	inner balancer.Balancer
	pb    *pickerBuilder
}

// connAttr marks the k-th connection of a member's pool.
type connAttr struct{}

type connID struct {
	member int // -1: an address the router does not know
	k      int
}

func (b *lb) UpdateClientConnState(s balancer.ClientConnState) error {
	cfg, _ := s.BalancerConfig.(*lbConfig)
	var entry *routerEntry
	if cfg != nil {
		if e, ok := routers.Load(cfg.Router); ok {
			entry = e.(*routerEntry)
		}
	}
	if entry == nil {
		return fmt.Errorf("%s: no router %v (client closed?)", balancerName, cfg)
	}
	if b.inner == nil {
		b.pb = &pickerBuilder{entry: entry}
		b.inner = base.NewBalancerBuilder(balancerName, b.pb, base.Config{}).Build(publishingCC{b.cc, b.pb}, b.opts)
	}
	var addrs []resolver.Address
	byAddr := *entry.byAddr.Load()
	for _, a := range flatten(s.ResolverState) {
		member, ok := byAddr[a.Addr]
		n := entry.connsPerMember
		if !ok {
			member, n = -1, 1
		}
		for k := range n {
			c := a
			c.Attributes = c.Attributes.WithValue(connAttr{}, connID{member: member, k: k})
			addrs = append(addrs, c)
		}
	}
	s.ResolverState.Addresses, s.ResolverState.Endpoints = addrs, nil
	return b.inner.UpdateClientConnState(s)
}

func flatten(s resolver.State) []resolver.Address {
	if len(s.Endpoints) == 0 {
		return s.Addresses
	}
	var out []resolver.Address
	for _, ep := range s.Endpoints {
		out = append(out, ep.Addresses...)
	}
	return out
}

func (b *lb) ResolverError(err error) {
	if b.inner != nil {
		b.inner.ResolverError(err)
	}
}

// UpdateSubConnState is never called: the base balancer's SubConns report
// their state through their own StateListener. The balancer.Balancer
// interface still lists it.
func (b *lb) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

func (b *lb) Close() {
	if b.inner != nil {
		b.inner.Close()
	}
	if b.pb != nil {
		b.pb.entry.connected.Delete(b.pb)
	}
}

func (b *lb) ExitIdle() {
	// ExitIdle is on balancer.Balancer from gRPC v1.72; before, an optional
	// interface of its own (supported gRPC versions: docs/releases.md).
	if inner, ok := b.inner.(interface{ ExitIdle() }); ok {
		inner.ExitIdle()
	}
}

type pickerBuilder struct {
	entry *routerEntry
	ready int // members with a ready connection in the last picker
}

// publishingCC is the ClientConn the base balancer sees: once gRPC has
// installed a picker, it tells the prober and the leader's waiters which
// members it has ready connections to. Not before: a probe woken by a
// newly ready member must find it in the picker its RPC gets.
type publishingCC struct {
	balancer.ClientConn
	pb *pickerBuilder
}

func (c publishingCC) UpdateState(s balancer.State) {
	c.ClientConn.UpdateState(s)
	var ready []int
	if p, ok := s.Picker.(*picker); ok {
		ready = p.ready
	}
	c.pb.published(ready)
}

// published records the members with a ready connection in the picker
// gRPC has just installed.
func (pb *pickerBuilder) published(ready []int) {
	pb.entry.connected.Store(pb, ready)
	if len(ready) != pb.ready {
		// A member's connection became ready (probe now, so that a new
		// client learns the leader early) or broke (perhaps the leader's:
		// gRPC knows before any probe): evidence either way.
		pb.entry.r.Backend().Unsettle()
	}
	pb.ready = len(ready)
	pb.entry.leader.wake()
}

func (pb *pickerBuilder) Build(info base.PickerBuildInfo) balancer.Picker {
	if len(info.ReadySCs) == 0 {
		return base.NewErrPicker(balancer.ErrNoSubConnAvailable)
	}
	n := 0 // members by index: the highest current index + 1
	for _, i := range *pb.entry.byAddr.Load() {
		n = max(n, i+1)
	}
	conns := make([][]balancer.SubConn, n)
	var ready []int
	var others []balancer.SubConn
	for sc, sci := range info.ReadySCs {
		id, _ := sci.Address.Attributes.Value(connAttr{}).(connID)
		if id.member < 0 || id.member >= n {
			others = append(others, sc)
			continue
		}
		conns[id.member] = append(conns[id.member], sc)
	}
	for i := range conns {
		if len(conns[i]) > 0 {
			ready = append(ready, i)
		}
	}
	return &picker{r: pb.entry.r, pool: pool.New(conns), ready: ready, others: others}
}

// picker routes each RPC with the router and hands gRPC a connection from
// the chosen member's pool.
type picker struct {
	r      *router.Router
	pool   *pool.Pool[balancer.SubConn]
	ready  []int // members with a ready connection
	others []balancer.SubConn
	next   atomic.Uint32
}

type probeKey struct{}

// Maintenance a client asks of one member: a defragmentation stops it
// serving while it runs, a snapshot streams its whole store.
const (
	defragmentMethod = "/etcdserverpb.Maintenance/Defragment"
	snapshotMethod   = "/etcdserverpb.Maintenance/Snapshot"
)

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	ctx := info.Ctx
	if idx, ok := ctx.Value(probeKey{}).(int); ok {
		// Leader probes go to their member without being counted as traffic.
		if sc, ok := p.pool.Get(idx); ok {
			return balancer.PickResult{SubConn: sc}, nil
		}
		return balancer.PickResult{}, status.Errorf(codes.Unavailable, "oproute: member %d has no ready connection", idx)
	}
	if len(p.ready) == 0 {
		// Only addresses the router does not know (endpoints changed by
		// SetEndpoints): plain round robin.
		return balancer.PickResult{SubConn: p.others[(p.next.Add(1)-1)%uint32(len(p.others))]}, nil
	}
	op := classify(ctx, info.FullMethodName)
	// Streams are few and long: only they need the leader-bound lookup and
	// the bookkeeping that lets the stream mover find them.
	stream := op == router.Stream
	toLeader := stream && leaderBound(info.FullMethodName)
	pctx := ctx
	if toLeader && !override.Any(ctx) {
		pctx = router.WithLeader(ctx)
	}
	pick, err := p.r.Pick(pctx, op)
	if err != nil {
		return balancer.PickResult{}, pickError(err)
	}
	sc, ok := p.pool.Get(pick.Index)
	if !ok {
		pick.Abandon()
		if _, forced := override.Forced(ctx); forced {
			return balancer.PickResult{}, status.Errorf(codes.Unavailable, "oproute: member %s has no ready connection", pick.Member.ID)
		}
		// The router has not yet seen this member go: use one that is up.
		// alt is a stable index, as Pick.Index; one retired since this
		// picker was built is skipped.
		alt, m, ok := -1, router.Member{}, false
		for k := range len(p.ready) {
			alt = p.ready[(int(p.next.Add(1)-1)+k)%len(p.ready)]
			if m, ok = p.r.Member(alt); ok {
				break
			}
		}
		if !ok {
			return balancer.PickResult{}, status.Errorf(codes.Unavailable, "oproute: no ready connection to a current member")
		}
		if pick, err = p.r.Pick(router.WithMember(ctx, m.ID), op); err != nil {
			return balancer.PickResult{}, pickError(err)
		}
		sc, _ = p.pool.Get(alt)
	}
	var endBusy func()
	if stream {
		_, forced := override.Forced(ctx)
		picked(ctx, pick.Index, forced, toLeader)
		if info.FullMethodName == defragmentMethod || info.FullMethodName == snapshotMethod {
			// Planned load the client asked for, not a grey failure
			// (router.Backend.Busy). A Snapshot's bench is held by the
			// stream's reads too (benchHold); the end is idempotent.
			endBusy = p.r.Backend().Busy(pick.Index)
			if h, ok := ctx.Value(benchHoldKey{}).(*benchHold); ok {
				h.hold(endBusy)
			}
		}
	}
	d := donePool.Get().(*pickDone)
	d.pick, d.ctx, d.endBusy = pick, ctx, endBusy
	return balancer.PickResult{SubConn: sc, Done: d.fn}, nil
}

// pickDone carries one pick to the end of its RPC. Recycled: a closure per
// RPC was an allocation stock clientv3's picker does not make (gRPC calls
// Done exactly once per pick).
type pickDone struct {
	pick    router.Pick
	ctx     context.Context
	endBusy func()
	fn      func(balancer.DoneInfo) // d.done, bound once
}

var donePool sync.Pool // of *pickDone

func init() {
	donePool.New = func() any {
		d := &pickDone{}
		d.fn = d.done
		return d
	}
}

func (d *pickDone) done(di balancer.DoneInfo) {
	d.pick.Done(outcomeOf(d.ctx, di))
	if d.endBusy != nil {
		d.endBusy()
	}
	d.pick, d.ctx, d.endBusy = router.Pick{}, nil, nil
	donePool.Put(d)
}

func pickError(err error) error {
	switch {
	case errors.Is(err, router.ErrUnknownMember):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, router.ErrClosed):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
