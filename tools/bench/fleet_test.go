package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/go-zookeeper/zk"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/oproute/oproute/backends/etcd"
	ozk "github.com/oproute/oproute/backends/zk"
)

func TestFleetCasesNamed(t *testing.T) {
	got, err := FleetCasesNamed([]string{"failover-50", "idle-100", "failover-50"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
	}
	if want := []string{"idle-100", "failover-50"}; !slices.Equal(names, want) {
		t.Errorf("rows %v, want %v (default order, once each)", names, want)
	}
	if _, err := FleetCasesNamed([]string{"idle-7"}); err == nil {
		t.Error("an unknown row was accepted")
	}
}

func TestFailedWriteCauses(t *testing.T) {
	for _, tc := range []struct {
		c    Client
		err  error
		want string
	}{
		{&zkClient{}, fmt.Errorf("put: %w", zk.ErrConnectionClosed), "connection_closed"},
		{&zkClient{}, zk.ErrNoServer, "no_server"},
		{&zkClient{}, ozk.ErrUnreachable, "unreachable"},
		{&zkClient{}, fmt.Errorf("put: %w", context.DeadlineExceeded), "timeout"},
		{&zkClient{}, errors.New("something else"), "other"},
		{&etcdClient{}, rpctypes.ErrGRPCNoLeader, "Unavailable"},
		{&etcdClient{}, rpctypes.Error(rpctypes.ErrGRPCLeaderChanged), "Unavailable"},
		{&stockClient{}, etcd.ErrUnreachable, "unreachable"},
	} {
		if got := errorClass(tc.c, tc.err); got != tc.want {
			t.Errorf("%T %v: %q, want %q", tc.c, tc.err, got, tc.want)
		}
	}
}
