package testutil

import (
	"reflect"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// GRPCMethods are the full method names ("/etcdserverpb.KV/Range") of a
// gRPC service's RPCs, read from its generated client interface, whose
// methods are named as the RPCs are. etcd exports its ServiceDescs only
// from v3.7; the interfaces are there in every release the SDK supports.
func GRPCMethods(service string, client reflect.Type) []string {
	methods := make([]string, 0, client.NumMethod())
	for i := range client.NumMethod() {
		methods = append(methods, "/"+service+"/"+client.Method(i).Name)
	}
	return methods
}

// EtcdRPCsSince are the RPCs the etcd backend classifies that the lowest
// etcd API it supports (v3.6.0) lacks, with the release that added each:
// built against that API, the backend classifies them and no service has
// them.
var EtcdRPCsSince = map[string]string{
	"/etcdserverpb.KV/RangeStream": "v3.7.0",
}

// EtcdAPIServices are the gRPC services of etcd's API module a client
// can call, by their generated client interfaces: all but Lock and
// Election, whose descriptions are in etcd's server module, which the
// SDK's module does not take.
var EtcdAPIServices = map[string]reflect.Type{
	"etcdserverpb.KV":          reflect.TypeFor[pb.KVClient](),
	"etcdserverpb.Watch":       reflect.TypeFor[pb.WatchClient](),
	"etcdserverpb.Lease":       reflect.TypeFor[pb.LeaseClient](),
	"etcdserverpb.Cluster":     reflect.TypeFor[pb.ClusterClient](),
	"etcdserverpb.Maintenance": reflect.TypeFor[pb.MaintenanceClient](),
	"etcdserverpb.Auth":        reflect.TypeFor[pb.AuthClient](),
}
