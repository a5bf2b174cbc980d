package etcd_test

import (
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"

	_ "github.com/oproute/oproute/backends/etcd" // sets the hooks
	"github.com/oproute/oproute/internal/testhooks"
)

// TestClassifiesEveryRPC: every method and stream of every gRPC service
// of the etcd server in go.mod that a client can call, Lock and Election
// included (their descriptions are in the server's module, which only
// this module takes), is one the backend classifies, and the backend
// classifies none that is in no service.
func TestClassifiesEveryRPC(t *testing.T) {
	rpcs := map[string]bool{}
	for _, sd := range []*grpc.ServiceDesc{
		&pb.KV_ServiceDesc, &pb.Watch_ServiceDesc, &pb.Lease_ServiceDesc, &pb.Cluster_ServiceDesc,
		&pb.Maintenance_ServiceDesc, &pb.Auth_ServiceDesc, &v3lockpb.Lock_ServiceDesc, &v3electionpb.Election_ServiceDesc,
	} {
		for _, m := range sd.Methods {
			rpcs["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
		for _, s := range sd.Streams {
			rpcs["/"+sd.ServiceName+"/"+s.StreamName] = true
		}
	}
	classified := testhooks.EtcdClassifiedRPCs()
	for rpc := range rpcs {
		if !slices.Contains(classified, rpc) {
			t.Errorf("%s is in etcd's API but not classified", rpc)
		}
	}
	for _, rpc := range classified {
		if !rpcs[rpc] {
			t.Errorf("the backend classifies %s, which is in no etcd service", rpc)
		}
	}
	if len(rpcs) < 40 {
		t.Errorf("%d RPCs in etcd's services: the list above lacks some", len(rpcs))
	}
}
