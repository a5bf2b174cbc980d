package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// BenchmarkStockVsRouted is the drop-in's cost at equal routing: one Put
// and one linearizable Get at a time, through stock clientv3 and through
// the routed client with round_robin (the same rotation as stock; with the
// default 1 connection per member, as stock has, and with 3), against the
// same 3-member cluster on its members' own ports (no delay proxies: the
// client's cost is not hidden under emulated distance). One caller, so
// nothing queues for the CPU. Besides ns/op it reports the client's CPU
// per operation (getrusage: the members run in processes of their own);
// -benchmem gives allocations and bytes per RPC exactly. Trials alternate
// the clients so that drift hits all of them:
//
//	go test -run '^$' -bench BenchmarkStockVsRouted -benchmem -benchtime 2000x ./tools/backends/etcd
func BenchmarkStockVsRouted(b *testing.B) {
	c := testbed.StartEtcdT(b, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	eps := c.DirectEndpoints()
	cfg := clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second}
	ctx := context.Background()

	// Each client lives only for its own runs, so that no other client's
	// probes run on the CPU it is charged.
	clients := []struct {
		name string
		open func() (clientv3.KV, func() error, error)
	}{
		{"stock", func() (clientv3.KV, func() error, error) {
			cli, err := clientv3.New(cfg)
			if err != nil {
				return nil, nil, err
			}
			return cli, cli.Close, nil
		}},
	}
	for _, v := range []struct {
		name string
		opts []etcd.Option
	}{
		{"round_robin_3conns", []etcd.Option{etcd.WithPolicy(router.RoundRobin), etcd.WithConnsPerMember(3)}},
		{"round_robin", []etcd.Option{etcd.WithPolicy(router.RoundRobin)}},
		// Probes are a fixed cost per client (a Status RPC per member
		// every 250 ms), which one sequential caller pays ~1.5
		// allocations per call of; probing once a minute leaves the
		// per-RPC path alone in the figures.
		{"round_robin_probes_1m", []etcd.Option{etcd.WithPolicy(router.RoundRobin), etcd.WithRouterConfig(func(c *router.Config) { c.ProbeInterval = time.Minute })}},
		{"hybrid", nil},
	} {
		clients = append(clients, struct {
			name string
			open func() (clientv3.KV, func() error, error)
		}{v.name, func() (clientv3.KV, func() error, error) {
			cli, err := etcd.New(cfg, append([]etcd.Option{etcd.WithConnectTimeout(cfg.DialTimeout)}, v.opts...)...)
			if err != nil {
				return nil, nil, err
			}
			return cli, cli.Close, nil
		}})
	}
	value := string(make([]byte, 256))
	ops := []struct {
		name string
		do   func(clientv3.KV) error
	}{
		{"Put", func(kv clientv3.KV) error { _, err := kv.Put(ctx, "bench", value); return err }},
		{"Get", func(kv clientv3.KV) error { _, err := kv.Get(ctx, "bench"); return err }},
	}
	for trial := range 3 {
		for _, op := range ops {
			for _, cl := range clients {
				kv, closeKV, err := cl.open()
				if err != nil {
					b.Fatal(err)
				}
				for range 200 { // connections up on every member, servers warm
					if err := op.do(kv); err != nil {
						b.Fatal(err)
					}
				}
				b.Run(fmt.Sprintf("%s/%s/trial=%d", op.name, cl.name, trial), func(b *testing.B) {
					b.ReportAllocs()
					cpu0 := testutil.ProcessCPU()
					for b.Loop() {
						if err := op.do(kv); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64((testutil.ProcessCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				})
				closeKV()
			}
		}
	}
}
