package etcd_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// BenchmarkStockVsRouted is the drop-in's cost at equal routing: one Put
// and one linearizable Get at a time, through stock clientv3 and through
// the routed client with round_robin (the same rotation as stock; with 1
// connection per member, as stock has, and with the default), against the
// same 3-member cluster on its members' own ports (no delay proxies: the
// client's cost is not hidden under emulated distance). One caller, so
// nothing queues for the CPU. Besides ns/op it reports the client's CPU
// per operation (getrusage: the members run in processes of their own);
// -benchmem gives allocations and bytes per RPC exactly. Trials alternate
// the clients so that drift hits all of them:
//
//	go test -run '^$' -bench BenchmarkStockVsRouted -benchmem -benchtime 2000x ./backends/etcd
func BenchmarkStockVsRouted(b *testing.B) {
	c := testbed.StartEtcdT(b, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	eps := c.DirectEndpoints()
	cfg := clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second}
	ctx := context.Background()

	type client struct {
		name string
		kv   clientv3.KV
	}
	stock, err := clientv3.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer stock.Close()
	clients := []client{{"stock", stock}}
	for _, v := range []struct {
		name string
		opts []etcd.Option
	}{
		{"round_robin_1conn", []etcd.Option{etcd.WithPolicy(router.RoundRobin), etcd.WithConnsPerMember(1)}},
		{"round_robin", []etcd.Option{etcd.WithPolicy(router.RoundRobin)}},
		{"hybrid", nil},
	} {
		cli, err := etcd.New(cfg, v.opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Close()
		clients = append(clients, client{v.name, cli})
	}
	value := string(make([]byte, 256))
	for _, cl := range clients { // connections up, servers warm
		for range 300 {
			if _, err := cl.kv.Put(ctx, "bench", value); err != nil {
				b.Fatal(err)
			}
			if _, err := cl.kv.Get(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	}
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
				b.Run(fmt.Sprintf("%s/%s/trial=%d", op.name, cl.name, trial), func(b *testing.B) {
					b.ReportAllocs()
					cpu0 := processCPU()
					for b.Loop() {
						if err := op.do(cl.kv); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
