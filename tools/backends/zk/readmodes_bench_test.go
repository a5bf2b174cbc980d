package zk_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// BenchmarkReadModes compares a linearizable read's cost by mode on a
// 3-server ensemble (default topology: client and peer links shaped):
// sync+get (the default) and WithQuorumReads (a quorum check, then get),
// one caller at a time and 8 at once. txns/op is read from the leader's
// zxid: a strict read is a transaction in every server's log. Run with
// -benchtime 3s; three trials alternate the modes.
func BenchmarkReadModes(b *testing.B) {
	c := testbed.StartZKT(b, testbed.ZKOptions{})
	ctx := context.Background()
	setup, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithLogger(quiet{}))
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	if _, err := setup.Create("/bench", []byte("v"), 0, acl); err != nil {
		b.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}
	zxid := func() int64 {
		st, err := c.Srvr(ctx, leader)
		if err != nil {
			b.Fatal(err)
		}
		return st.Zxid
	}
	type mode struct {
		name string
		conn *ozk.Conn
	}
	var modes []mode
	for _, m := range []struct {
		name string
		opts []ozk.Option
	}{{"sync+get", nil}, {"quorum", []ozk.Option{ozk.WithQuorumReads()}}} {
		conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, append([]ozk.Option{ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(sessionTimeout)}, m.opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		for range 300 { // sessions on every server, the JVMs warm
			if _, _, err := conn.Get("/bench"); err != nil {
				b.Fatal(err)
			}
		}
		modes = append(modes, mode{m.name, conn})
	}
	// Trials alternate the modes, so that drift (JIT, a noisy neighbour)
	// hits both.
	for trial := range 3 {
		for _, callers := range []int{1, 8} {
			for _, m := range modes {
				b.Run(fmt.Sprintf("%s/callers=%d/trial=%d", m.name, callers, trial), func(b *testing.B) {
					z0 := zxid()
					b.ReportAllocs()
					// RunParallel starts parallelism × GOMAXPROCS goroutines.
					b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
					if callers == 1 {
						b.SetParallelism(1)
					}
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, _, err := m.conn.Get("/bench"); err != nil {
								b.Error(err)
								return
							}
						}
					})
					b.StopTimer()
					b.ReportMetric(float64(zxid()-z0)/float64(b.N), "txns/op")
				})
			}
		}
	}
}
