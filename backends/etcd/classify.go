package etcd

import (
	"context"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/oproute/oproute/router"
)

// Classify returns the operation class of an etcd RPC by its full method
// name ("/etcdserverpb.KV/Put"). Txn counts as a write here; the
// interceptor refines it to a read when it holds no write, as it refines a
// serializable Range to a stale read.
//
// Leader-bound (router.Write): Put, DeleteRange, Txn, Compact, LeaseGrant,
// LeaseRevoke, LeaseTimeToLive and LeaseLeases (a follower forwards them to
// the leader, which owns the lessor), every Cluster change, every Auth RPC
// (all go through raft), and MoveLeader, Alarm and Downgrade. Streams:
// Watch and LeaseKeepAlive. Everything else is a linearizable read, spread.
func Classify(fullMethod string) router.Op {
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	switch service {
	case "etcdserverpb.KV":
		if method == "Range" {
			return router.LinearizableRead
		}
		return router.Write // Put, DeleteRange, Txn, Compact
	case "etcdserverpb.Watch":
		return router.Stream
	case "etcdserverpb.Lease":
		if method == "LeaseKeepAlive" {
			return router.Stream
		}
		return router.Write
	case "etcdserverpb.Cluster":
		if method == "MemberList" {
			return router.LinearizableRead
		}
		return router.Write
	case "etcdserverpb.Auth":
		return router.Write
	case "etcdserverpb.Maintenance":
		switch method {
		case "MoveLeader", "Alarm", "Downgrade":
			return router.Write
		case "Status", "HashKV", "Hash", "Defragment", "Snapshot":
			return router.StaleRead // member-local
		}
	}
	return router.LinearizableRead
}

// TxnIsReadOnly reports whether a Txn holds no write in any branch,
// including nested Txns.
func TxnIsReadOnly(t *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{t.GetSuccess(), t.GetFailure()} {
		for _, op := range ops {
			switch r := op.GetRequest().(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if !TxnIsReadOnly(r.RequestTxn) {
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

// classifyInterceptor tags read-only Txns and serializable Ranges on the
// context, which the picker cannot see: it gets the method, not the message.
func classifyInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *pb.RangeRequest:
		if r.GetSerializable() {
			ctx = context.WithValue(ctx, opKey{}, router.StaleRead)
		}
	case *pb.TxnRequest:
		if TxnIsReadOnly(r) {
			ctx = context.WithValue(ctx, opKey{}, router.LinearizableRead)
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func classify(ctx context.Context, fullMethod string) router.Op {
	if op, ok := ctx.Value(opKey{}).(router.Op); ok {
		return op
	}
	return Classify(fullMethod)
}
