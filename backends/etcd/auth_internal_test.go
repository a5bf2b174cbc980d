package etcd

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAuthRefused: a probe's refusal for want of credentials is told by
// its code or by etcd's error value, as a member sends it and as gRPC
// hands it over (a status rebuilt from its proto), wrapped or not; other
// failures are not refusals.
func TestAuthRefused(t *testing.T) {
	empty := status.Error(codes.InvalidArgument, "etcdserver: user name is empty")
	rebuilt := status.FromProto(status.Convert(empty).Proto()).Err()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{empty, true},
		{rebuilt, true},
		{fmt.Errorf("status of m0: %w", rebuilt), true},
		{rpctypes.ErrGRPCInvalidAuthToken, true},
		{rpctypes.ErrGRPCPermissionDenied, true},
		{rpctypes.ErrGRPCNoLeader, false},
		{status.Error(codes.InvalidArgument, "etcdserver: key is not provided"), false},
		{fmt.Errorf("status of m0: %w", errNotConnected), false},
	} {
		if got := authRefused(tc.err); got != tc.want {
			t.Errorf("authRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
