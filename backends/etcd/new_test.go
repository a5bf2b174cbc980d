package etcd_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
)

// The package's tests here need no server: those against real members are
// in the tools module (tools/backends/etcd), beside the test bed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []string
		opts []etcd.Option
		want error
	}{
		{"no endpoints", nil, nil, etcd.ErrNoEndpoints},
		{"no endpoints is router.ErrNoMembers", nil, nil, router.ErrNoMembers},
		{"empty endpoint", []string{""}, nil, etcd.ErrInvalidEndpoint},
		{"no port", []string{"http://127.0.0.1"}, nil, etcd.ErrInvalidEndpoint},
		{"bad scheme", []string{"ftp://127.0.0.1:1"}, nil, etcd.ErrInvalidEndpoint},
		{"unix socket without a path", []string{"unix://"}, nil, etcd.ErrInvalidEndpoint},
		{"same socket twice", []string{"unix:///run/etcd.sock", "unixs:///run/etcd.sock"}, nil, router.ErrDuplicateMember},
		{"same address twice", []string{"127.0.0.1:2379", "http://127.0.0.1:2379"}, nil, router.ErrDuplicateMember},
		{"unknown policy", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithPolicy("fastest")}, router.ErrUnknownPolicy},
		{"zero conns", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithConnsPerMember(0)}, router.ErrInvalidConfig},
		{"negative leader wait", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithLeaderWait(-time.Second)}, router.ErrInvalidConfig},
		{"negative connect timeout", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithConnectTimeout(-time.Second)}, router.ErrInvalidConfig},
		{"service config not JSON", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`{"methodConfig":`)}, router.ErrInvalidConfig},
		{"service config not an object", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`[]`)}, router.ErrInvalidConfig},
		{"service config with a balancer", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)}, router.ErrInvalidConfig},
		{"service config with a balancing policy", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`{"LoadBalancingPolicy":"pick_first"}`)}, router.ErrInvalidConfig},
		{"service config with health checking", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`{"healthCheckConfig":{"serviceName":""}}`)}, router.ErrInvalidConfig},
		{"service config gRPC refuses", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithServiceConfig(`{"methodConfig":[{"name":[{"service":"etcdserverpb.KV"}],"timeout":"soon"}]}`)}, router.ErrInvalidConfig},
		{"nonsense ratio", []string{"127.0.0.1:2379"}, []etcd.Option{etcd.WithRouterConfig(func(c *router.Config) { c.EjectRatio = -3 })}, router.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := etcd.New(clientv3.Config{Endpoints: tc.eps, Logger: zap.NewNop()}, tc.opts...)
			if err == nil {
				cli.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
