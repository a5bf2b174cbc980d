package etcd

import (
	"context"
	"net"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
)

// etcdRPCs are the RPCs of etcd's API module (testutil.EtcdAPIServices):
// Lock and Election are in the server's module, which the tools module's
// tests take (tools/backends/etcd).
func etcdRPCs() map[string]bool {
	rpcs := map[string]bool{}
	for service, client := range testutil.EtcdAPIServices {
		for _, rpc := range testutil.GRPCMethods(service, client) {
			rpcs[rpc] = true
		}
	}
	return rpcs
}

func TestClassifyCoversEveryRPC(t *testing.T) {
	rpcs := etcdRPCs()
	if len(rpcs) == 0 {
		t.Fatal("no RPC found in the client interfaces")
	}
	for rpc := range rpcs {
		if _, ok := rpcClasses[rpc]; !ok {
			t.Errorf("%s is in etcd's API but not in rpcClasses: classify it", rpc)
		}
	}
	for rpc := range rpcClasses {
		if !rpcs[rpc] && testutil.EtcdRPCsSince[rpc] == "" && !strings.HasPrefix(rpc, "/v3lockpb.Lock/") && !strings.HasPrefix(rpc, "/v3electionpb.Election/") {
			t.Errorf("rpcClasses names %s, which is in no etcd service", rpc)
		}
	}
}

func TestClassifyEachRPC(t *testing.T) {
	const (
		w  = router.Write
		lr = router.LinearizableRead
		s  = router.Stream
	)
	want := map[string]router.Op{
		"/etcdserverpb.KV/Range":       lr,
		"/etcdserverpb.KV/RangeStream": s,
		"/etcdserverpb.KV/Put":         w,
		"/etcdserverpb.KV/DeleteRange": w,
		"/etcdserverpb.KV/Txn":         w,
		"/etcdserverpb.KV/Compact":     w,

		"/etcdserverpb.Watch/Watch": s,

		"/etcdserverpb.Lease/LeaseGrant":      w,
		"/etcdserverpb.Lease/LeaseRevoke":     w,
		"/etcdserverpb.Lease/LeaseTimeToLive": w,
		"/etcdserverpb.Lease/LeaseLeases":     w,
		"/etcdserverpb.Lease/LeaseKeepAlive":  s,

		"/etcdserverpb.Cluster/MemberAdd":     w,
		"/etcdserverpb.Cluster/MemberRemove":  w,
		"/etcdserverpb.Cluster/MemberUpdate":  w,
		"/etcdserverpb.Cluster/MemberPromote": w,
		"/etcdserverpb.Cluster/MemberList":    lr,

		"/etcdserverpb.Maintenance/Alarm":      w,
		"/etcdserverpb.Maintenance/MoveLeader": w,
		"/etcdserverpb.Maintenance/Downgrade":  w,
		"/etcdserverpb.Maintenance/Status":     s,
		"/etcdserverpb.Maintenance/Hash":       s,
		"/etcdserverpb.Maintenance/HashKV":     s,
		"/etcdserverpb.Maintenance/Defragment": s,
		"/etcdserverpb.Maintenance/Snapshot":   s,

		"/v3lockpb.Lock/Lock":             s,
		"/v3lockpb.Lock/Unlock":           s,
		"/v3electionpb.Election/Campaign": s,
		"/v3electionpb.Election/Proclaim": s,
		"/v3electionpb.Election/Leader":   s,
		"/v3electionpb.Election/Resign":   s,
		"/v3electionpb.Election/Observe":  s,

		// Unknown RPCs go to the leader, which serves anything.
		"/etcdserverpb.KV/RangeV2":         w,
		"/etcdserverpb.Maintenance/Foo":    w,
		"/grpc.health.v1.Health/Check":     w,
		"/some.Other/Method":               w,
		"":                                 w,
		"etcdserverpb.KV/Range":            w, // not a full method name
		"/etcdserverpb.KV/Range/":          w,
		"/etcdserverpb.kv/range":           w, // names are case-sensitive
		"/etcdserverpb.Auth/AuthEnableNew": w,
	}
	// Every Auth RPC is a write.
	for _, rpc := range testutil.GRPCMethods("etcdserverpb.Auth", testutil.EtcdAPIServices["etcdserverpb.Auth"]) {
		want[rpc] = w
	}
	for rpc := range etcdRPCs() {
		if _, ok := want[rpc]; !ok {
			t.Errorf("%s: no expected class in this test", rpc)
		}
	}
	for rpc, op := range want {
		t.Run(rpc+" is "+op.String(), func(t *testing.T) {
			if got := classifyMethod(rpc); got != op {
				t.Errorf("classifyMethod(%q) = %v, want %v", rpc, got, op)
			}
		})
	}
}

func TestLeaderBound(t *testing.T) {
	for rpc := range etcdRPCs() {
		want := rpc == "/etcdserverpb.Lease/LeaseKeepAlive"
		if got := leaderBound(rpc); got != want {
			t.Errorf("leaderBound(%q) = %v, want %v", rpc, got, want)
		}
	}
	for _, rpc := range []string{"", "/some.Other/Method", "/etcdserverpb.Lease/LeaseKeepAliveV2"} {
		if leaderBound(rpc) {
			t.Errorf("leaderBound(%q) = true for an unknown RPC, want false (it is a write already)", rpc)
		}
	}
}

// TestUnaryInterceptorRefinesReads checks what the picker sees: the
// interceptor's refinement of serializable Ranges and read-only Txns, the
// table otherwise.
func TestUnaryInterceptorRefinesReads(t *testing.T) {
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	for _, tc := range []struct {
		name   string
		method string
		req    any
		want   router.Op
	}{
		{"serializable range is a stale read", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("k"), Serializable: true}, router.StaleRead},
		{"linearizable range is a linearizable read", "/etcdserverpb.KV/Range", &pb.RangeRequest{Key: []byte("k")}, router.LinearizableRead},
		{"read-only txn is a linearizable read", "/etcdserverpb.KV/Txn", &pb.TxnRequest{Success: []*pb.RequestOp{get}}, router.LinearizableRead},
		{"txn with a put is a write", "/etcdserverpb.KV/Txn", &pb.TxnRequest{Success: []*pb.RequestOp{get, put}}, router.Write},
		{"put is a write", "/etcdserverpb.KV/Put", &pb.PutRequest{Key: []byte("k")}, router.Write},
		{"status is a stream", "/etcdserverpb.Maintenance/Status", &pb.StatusRequest{}, router.Stream},
		{"defragment is a stream", "/etcdserverpb.Maintenance/Defragment", &pb.DefragmentRequest{}, router.Stream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got router.Op
			invoker := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				got = classify(ctx, method)
				return nil
			}
			if err := (&Client{}).unary(context.Background(), tc.method, tc.req, nil, nil, invoker); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("classify = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHedgeOutputsPrivate: a hedge's output call options (clientv3 asks
// every RPC for its peer) are its own until it wins.
func TestHedgeOutputsPrivate(t *testing.T) {
	var p peer.Peer
	var header metadata.MD
	keep := grpc.WaitForReady(true)
	opts := []grpc.CallOption{keep, grpc.Peer(&p), grpc.Header(&header)}
	own, publish := privateOutputs(opts)
	if len(own) != 3 || own[0] != keep {
		t.Fatalf("options = %v", own)
	}
	ownPeer, ownHeader := own[1].(grpc.PeerCallOption).PeerAddr, own[2].(grpc.HeaderCallOption).HeaderAddr
	if ownPeer == &p || ownHeader == &header {
		t.Fatal("the hedge writes into the caller's peer or header")
	}
	ownPeer.Addr = &net.TCPAddr{Port: 2379}
	*ownHeader = metadata.Pairs("k", "v")
	if p.Addr != nil || header != nil {
		t.Fatal("the caller's outputs changed before the hedge won")
	}
	publish()
	if p.Addr == nil || header.Get("k")[0] != "v" {
		t.Fatalf("after the win: peer %v, header %v", p, header)
	}
}

// TestReplyOf: a hedge's reply is made and copied whichever API etcd's
// messages have: protobuf-go's in the workspace (etcd v3.7), gogo's at the
// SDK's own lowest requirement (v3.6, GOWORK=off), where hedging once sent
// nothing for want of a protobuf-go message.
func TestReplyOf(t *testing.T) {
	reply := &pb.RangeResponse{}
	newReply, set, ok := replyOf(reply)
	if !ok {
		t.Fatalf("replyOf(%T): not a message it can copy", reply)
	}
	won, isRange := newReply().(*pb.RangeResponse)
	if !isRange {
		t.Fatalf("replyOf(%T) makes %T", reply, newReply())
	}
	won.Header = &pb.ResponseHeader{Revision: 7}
	won.Kvs = []*mvccpb.KeyValue{{Key: []byte("k"), Value: []byte("v")}}
	won.Count = 1
	set(won)
	if reply.GetHeader().GetRevision() != 7 || len(reply.Kvs) != 1 || string(reply.Kvs[0].Value) != "v" || reply.Count != 1 {
		t.Fatalf("the caller's reply after the copy: %v", reply)
	}
	if _, _, ok := replyOf(struct{}{}); ok {
		t.Fatal("replyOf(struct{}{}) claims it can copy it")
	}
}
