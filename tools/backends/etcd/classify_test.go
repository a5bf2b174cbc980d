package etcd_test

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"

	"golang.org/x/mod/semver"

	_ "github.com/oproute/oproute/backends/etcd" // sets the hooks
	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"
)

// TestClassifiesEveryRPC: every method and stream of every gRPC service
// of the etcd server in go.mod that a client can call, Lock and Election
// included (their descriptions are in the server's module, which only
// this module takes), is one the backend classifies, and the backend
// classifies none that is in no service.
func TestClassifiesEveryRPC(t *testing.T) {
	rpcs := map[string]bool{}
	services := maps.Clone(testutil.EtcdAPIServices)
	services["v3lockpb.Lock"] = reflect.TypeFor[v3lockpb.LockClient]()
	services["v3electionpb.Election"] = reflect.TypeFor[v3electionpb.ElectionClient]()
	for service, client := range services {
		for _, rpc := range testutil.GRPCMethods(service, client) {
			rpcs[rpc] = true
		}
	}
	classified := testhooks.EtcdClassifiedRPCs()
	for rpc := range rpcs {
		if !slices.Contains(classified, rpc) {
			t.Errorf("%s is in etcd's API but not classified", rpc)
		}
	}
	for _, rpc := range classified {
		if !rpcs[rpc] && testutil.EtcdRPCsSince[rpc] == "" {
			t.Errorf("the backend classifies %s, which is in no etcd service", rpc)
		}
	}
	// The RPCs named as newer than the lowest supported API are in every
	// build of that version or later (the test bed's, the newest; not
	// .ci/lowest's).
	built := "v" + version.Version
	for rpc, since := range testutil.EtcdRPCsSince {
		if semver.Compare(built, since) >= 0 && !rpcs[rpc] {
			t.Errorf("%s, named as added in %s, is in no etcd service of this build (%s)", rpc, since, built)
		}
	}
	if len(rpcs) < 40 {
		t.Errorf("%d RPCs in etcd's services: the list above lacks some", len(rpcs))
	}
}
