package etcd

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestTxnIsReadOnly(t *testing.T) {
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("k")}}}
	nested := func(ops ...*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: ops}}}
	}
	for _, tc := range []struct {
		name string
		txn  *pb.TxnRequest
		want bool
	}{
		{"empty", &pb.TxnRequest{}, true},
		{"gets", &pb.TxnRequest{Success: []*pb.RequestOp{get}, Failure: []*pb.RequestOp{get}}, true},
		{"put in success", &pb.TxnRequest{Success: []*pb.RequestOp{get, put}}, false},
		{"delete in failure", &pb.TxnRequest{Success: []*pb.RequestOp{get}, Failure: []*pb.RequestOp{del}}, false},
		{"nested read", &pb.TxnRequest{Success: []*pb.RequestOp{nested(get)}}, true},
		{"nested write", &pb.TxnRequest{Failure: []*pb.RequestOp{nested(get, nested(put))}}, false},
	} {
		if got := txnIsReadOnly(tc.txn); got != tc.want {
			t.Errorf("%s: TxnIsReadOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}
