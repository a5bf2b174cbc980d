package testbed_test

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/oproute/oproute/tools/testbed"
)

func TestMajorityLeader(t *testing.T) {
	st := func(leader, term uint64) *pb.StatusResponse {
		return &pb.StatusResponse{Leader: leader, RaftTerm: term}
	}
	for _, tc := range []struct {
		name   string
		sts    []*pb.StatusResponse
		voters int
		want   uint64
		ok     bool
	}{
		{"all agree", []*pb.StatusResponse{st(2, 5), st(2, 5), st(2, 5)}, 3, 2, true},
		{"a majority, one silent", []*pb.StatusResponse{st(2, 5), nil, st(2, 5)}, 3, 2, true},
		{"one answer of three", []*pb.StatusResponse{nil, nil, st(2, 5)}, 3, 0, false},
		{"no leader named", []*pb.StatusResponse{st(0, 5), st(0, 5), st(0, 5)}, 3, 0, false},
		{"two names, two each", []*pb.StatusResponse{st(1, 4), st(1, 4), st(3, 6), st(3, 6)}, 4, 0, false},
		{"a stale minority", []*pb.StatusResponse{st(1, 4), st(3, 6), st(3, 6)}, 3, 3, true},
		{"half of four is not a majority", []*pb.StatusResponse{st(1, 4), st(1, 4), nil, nil}, 4, 1, false},
	} {
		got, ok := testbed.MajorityLeader(tc.sts, tc.voters)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
