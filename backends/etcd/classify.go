package etcd

import (
	"context"
	"reflect"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/oproute/oproute/internal/override"
	"github.com/oproute/oproute/router"
)

// rpcClass is how the picker treats one RPC.
type rpcClass struct {
	op router.Op
	// leader pins the RPC to the leader whatever its class (falling back
	// like writes do when the leader is unknown).
	leader bool
}

// rpcClasses classifies every method and stream of the etcd v3 gRPC API
// (etcdserverpb KV, Watch, Lease, Cluster, Maintenance, Auth; v3lockpb
// Lock; v3electionpb Election), by full method name. classify_test.go
// walks the generated ServiceDescs and fails on any RPC missing here, so an
// RPC added by a later etcd cannot go unclassified.
//
//   - Write: the RPC goes through raft, or is served by the leader alone;
//     a follower would only forward it. Sending it to the leader saves a
//     hop, and its latency is a sample of the leader's health.
//   - LinearizableRead: any member serves it after a ReadIndex round trip
//     with the leader, so it is spread.
//   - Stream: long-lived, or member-local and of a duration that says
//     nothing about the member's health. It is spread and never a latency
//     sample.
var rpcClasses = map[string]rpcClass{
	// KV. A serializable Range and a read-only Txn are refined by
	// the unary interceptor (Client.unary), which sees the request.
	"/etcdserverpb.KV/Range":       {op: router.LinearizableRead},
	"/etcdserverpb.KV/RangeStream": {op: router.Stream}, // a streamed read, as long as the range is big
	"/etcdserverpb.KV/Put":         {op: router.Write},
	"/etcdserverpb.KV/DeleteRange": {op: router.Write},
	"/etcdserverpb.KV/Txn":         {op: router.Write},
	"/etcdserverpb.KV/Compact":     {op: router.Write},

	// Watch is served from the member's own store.
	"/etcdserverpb.Watch/Watch": {op: router.Stream},

	// Lease: the leader owns the lessor; a follower forwards every lease
	// RPC to it, keep-alives included. LeaseKeepAlive is a stream, so it
	// is not a latency sample, but it is pinned to the leader.
	"/etcdserverpb.Lease/LeaseGrant":      {op: router.Write},
	"/etcdserverpb.Lease/LeaseRevoke":     {op: router.Write},
	"/etcdserverpb.Lease/LeaseTimeToLive": {op: router.Write},
	"/etcdserverpb.Lease/LeaseLeases":     {op: router.Write},
	"/etcdserverpb.Lease/LeaseKeepAlive":  {op: router.Stream, leader: true},

	// Cluster: membership changes go through raft; MemberList is a
	// linearizable read of the membership.
	"/etcdserverpb.Cluster/MemberAdd":     {op: router.Write},
	"/etcdserverpb.Cluster/MemberRemove":  {op: router.Write},
	"/etcdserverpb.Cluster/MemberUpdate":  {op: router.Write},
	"/etcdserverpb.Cluster/MemberPromote": {op: router.Write},
	"/etcdserverpb.Cluster/MemberList":    {op: router.LinearizableRead},

	// Maintenance: Alarm and Downgrade go through raft and MoveLeader is
	// served by the leader alone. The others are member-local (Status,
	// Hash, HashKV) or long (Defragment, Snapshot): their duration says
	// nothing about the member's health, and one Defragment must never
	// eject a member.
	"/etcdserverpb.Maintenance/Alarm":      {op: router.Write},
	"/etcdserverpb.Maintenance/MoveLeader": {op: router.Write},
	"/etcdserverpb.Maintenance/Downgrade":  {op: router.Write},
	"/etcdserverpb.Maintenance/Status":     {op: router.Stream},
	"/etcdserverpb.Maintenance/Hash":       {op: router.Stream},
	"/etcdserverpb.Maintenance/HashKV":     {op: router.Stream},
	"/etcdserverpb.Maintenance/Defragment": {op: router.Stream},
	"/etcdserverpb.Maintenance/Snapshot":   {op: router.Stream},

	// Auth: every RPC goes through raft, Authenticate and the reads
	// (AuthStatus, UserGet, UserList, RoleGet, RoleList) included.
	"/etcdserverpb.Auth/AuthEnable":           {op: router.Write},
	"/etcdserverpb.Auth/AuthDisable":          {op: router.Write},
	"/etcdserverpb.Auth/AuthStatus":           {op: router.Write},
	"/etcdserverpb.Auth/Authenticate":         {op: router.Write},
	"/etcdserverpb.Auth/UserAdd":              {op: router.Write},
	"/etcdserverpb.Auth/UserGet":              {op: router.Write},
	"/etcdserverpb.Auth/UserList":             {op: router.Write},
	"/etcdserverpb.Auth/UserDelete":           {op: router.Write},
	"/etcdserverpb.Auth/UserChangePassword":   {op: router.Write},
	"/etcdserverpb.Auth/UserGrantRole":        {op: router.Write},
	"/etcdserverpb.Auth/UserRevokeRole":       {op: router.Write},
	"/etcdserverpb.Auth/RoleAdd":              {op: router.Write},
	"/etcdserverpb.Auth/RoleGet":              {op: router.Write},
	"/etcdserverpb.Auth/RoleList":             {op: router.Write},
	"/etcdserverpb.Auth/RoleDelete":           {op: router.Write},
	"/etcdserverpb.Auth/RoleGrantPermission":  {op: router.Write},
	"/etcdserverpb.Auth/RoleRevokePermission": {op: router.Write},

	// Lock and Election block by design (until the lock is free, the
	// campaign won, the leader changes): never latency samples.
	"/v3lockpb.Lock/Lock":             {op: router.Stream},
	"/v3lockpb.Lock/Unlock":           {op: router.Stream},
	"/v3electionpb.Election/Campaign": {op: router.Stream},
	"/v3electionpb.Election/Proclaim": {op: router.Stream},
	"/v3electionpb.Election/Leader":   {op: router.Stream},
	"/v3electionpb.Election/Resign":   {op: router.Stream},
	"/v3electionpb.Election/Observe":  {op: router.Stream},
}

// classifyMethod returns the operation class of an etcd RPC by its full method
// name ("/etcdserverpb.KV/Put"), from one table that covers every RPC of
// the etcd API (see rpcClasses for why each goes where it goes). Txn
// counts as a write here; the interceptor refines it to a read when it
// holds no write, as it refines a serializable Range to a stale read.
//
// An unknown method is a write: the leader serves anything a follower can,
// so it is the safe default for an RPC added by a later etcd.
func classifyMethod(fullMethod string) router.Op {
	if c, ok := rpcClasses[fullMethod]; ok {
		return c.op
	}
	return router.Write
}

// leaderBound reports whether the RPC must go to the leader whatever its
// class: LeaseKeepAlive, a stream that a follower would only forward to the
// leader, which owns the lessor. The picker pins it to the leader and falls
// back like a write when the leader is unknown.
func leaderBound(fullMethod string) bool {
	return rpcClasses[fullMethod].leader
}

// txnIsReadOnly reports whether a Txn holds no write in any branch,
// including nested Txns.
func txnIsReadOnly(t *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{t.GetSuccess(), t.GetFailure()} {
		for _, op := range ops {
			switch r := op.GetRequest().(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if !txnIsReadOnly(r.RequestTxn) {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}

type opKey struct{}

// unary is the client's unary interceptor. It tags read-only Txns and
// serializable Ranges on the context, which the picker cannot see (it gets
// the method, not the message), hedges reads when the router says so, and
// holds writes while no leader is reachable (WithLeaderWait).
func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	op := router.Write
	switch r := req.(type) {
	case *pb.RangeRequest:
		op = router.LinearizableRead
		if r.GetSerializable() {
			op = router.StaleRead
			ctx = context.WithValue(ctx, opKey{}, op)
		}
	case *pb.TxnRequest:
		if txnIsReadOnly(r) {
			op = router.LinearizableRead
			ctx = context.WithValue(ctx, opKey{}, op)
		}
	}
	if op == router.Write && classifyMethod(method) == router.Write && !override.Any(ctx) {
		if err := c.awaitLeader(ctx, c.leaderWait); err != nil {
			return err // not sent
		}
	}
	var err error
	if op.IsRead() && c.router != nil && c.router.Hedging() {
		err = c.hedge(ctx, op, method, req, reply, cc, invoker, opts)
	} else {
		err = invoker(ctx, method, req, reply, cc, opts...)
	}
	if h, ok := reply.(interface{ GetHeader() *pb.ResponseHeader }); ok && err == nil && c.router != nil {
		// Every answer carries the Raft term: a newer one than the probes
		// showed means the leader may have moved.
		c.router.Backend().ObserveTerm(h.GetHeader().GetRaftTerm())
	}
	return err
}

// hedge runs one read through router.Hedge. The hedge gets a reply of its
// own, and its own copies of the output call options (clientv3 asks every
// RPC for its peer): the first attempt may still be writing the caller's.
// The winner's are what the caller sees.
func (c *Client) hedge(ctx context.Context, op router.Op, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	type answer struct {
		reply   any
		publish func() // copies the hedge's outputs to the caller's
	}
	// Made now: once the race is on, the first attempt writes reply.
	newReply, setReply, ok := replyOf(reply)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...) // not a message it can copy: unhedged
	}
	won, err := router.Hedge(ctx, c.router, op, func(ctx context.Context, hedge bool) (answer, error) {
		if !hedge {
			return answer{reply: reply}, invoker(ctx, method, req, reply, cc, opts...)
		}
		out := newReply()
		own, publish := privateOutputs(opts)
		return answer{out, publish}, invoker(ctx, method, req, out, cc, own...)
	}, hedgeOutcome)
	if won.publish != nil {
		setReply(won.reply)
		won.publish()
	}
	return err
}

// replyOf returns, for a reply message, how to make an empty one of its
// type and how to make it another's copy: through protobuf's API where
// the message has it (etcd's API from v3.7), as a struct for a message of
// the older API only (v3.6's gogo-generated messages, which protobuf-go
// cannot reflect). ok is false for anything else.
func replyOf(reply any) (newReply func() any, set func(from any), ok bool) {
	if m, ok := reply.(proto.Message); ok {
		typ := m.ProtoReflect().Type()
		return func() any { return typ.New().Interface() }, func(from any) {
			proto.Reset(m)
			proto.Merge(m, from.(proto.Message))
		}, true
	}
	v := reflect.ValueOf(reply)
	if _, ok := reply.(protoadapt.MessageV1); !ok || v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, nil, false
	}
	v = v.Elem()
	return func() any { return reflect.New(v.Type()).Interface() }, func(from any) { v.Set(reflect.ValueOf(from).Elem()) }, true
}

// privateOutputs returns opts with the options gRPC writes into after the
// call (peer, header, trailer) pointing at fresh values, and a func that
// copies those to the caller's.
func privateOutputs(opts []grpc.CallOption) ([]grpc.CallOption, func()) {
	own := slices.Clone(opts)
	var copies []func()
	for i, o := range own {
		switch o := o.(type) {
		case grpc.PeerCallOption:
			p := new(peer.Peer)
			own[i] = grpc.Peer(p)
			copies = append(copies, func() { *o.PeerAddr = *p })
		case grpc.HeaderCallOption:
			md := new(metadata.MD)
			own[i] = grpc.Header(md)
			copies = append(copies, func() { *o.HeaderAddr = *md })
		case grpc.TrailerCallOption:
			md := new(metadata.MD)
			own[i] = grpc.Trailer(md)
			copies = append(copies, func() { *o.TrailerAddr = *md })
		}
	}
	return own, func() {
		for _, c := range copies {
			c()
		}
	}
}

// hedgeOutcome is a hedged read attempt's outcome: its error, sent.
func hedgeOutcome(err error) router.Outcome {
	return outcomeOf(context.Background(), balancer.DoneInfo{Err: err, BytesSent: true})
}

// classify is the class of an RPC as the picker sees it: the one the
// interceptor put on ctx, else Classify's.
func classify(ctx context.Context, fullMethod string) router.Op {
	if op, ok := ctx.Value(opKey{}).(router.Op); ok {
		return op
	}
	return classifyMethod(fullMethod)
}
