package zk_test

import (
	"context"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// TestConnsPerHost: many Conns of one process against one ensemble whose
// servers allow ZooKeeper's default 60 connections per client address.
// Their probes are shared: each server sees about 8 probe connections a
// second from the process, not 4 per Conn. Then Conns are added (each with
// a session on every server) until one cannot get its sessions: the figure
// docs/zookeeper.md gives.
func TestConnsPerHost(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{MaxClientCnxns: 60})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eps := c.Endpoints()
	var conns []*ozk.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	// open adds a Conn with a session on every server; false when it cannot.
	open := func() (bool, error) {
		conn, _, err := ozk.Connect(eps, sessionTimeout, ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(3*time.Second))
		if err != nil {
			return false, err
		}
		conns = append(conns, conn)
		for i := range eps {
			octx, cancel := context.WithTimeout(ozk.WithMember(ctx, eps[i]), 3*time.Second)
			_, _, err := conn.GetContext(octx, "/")
			cancel()
			if err != nil {
				return false, err
			}
		}
		return true, nil
	}
	const shared = 20
	for range shared {
		if ok, err := open(); !ok {
			t.Fatalf("Conn %d: %v", len(conns), err)
		}
	}
	accepted := func() []uint64 {
		n := make([]uint64, len(eps))
		for i := range n {
			n[i] = c.ClientConnections(i)
		}
		return n
	}
	a0, start := accepted(), time.Now()
	testutil.Poll(t, 10*time.Second, "two seconds of probes", func() bool { return time.Since(start) >= 2*time.Second })
	a1, took := accepted(), time.Since(start)
	for i := range eps {
		perSecond := float64(a1[i]-a0[i]) / took.Seconds()
		t.Logf("z%d: %.1f new client connections a second with %d Conns", i, perSecond, shared)
		// 2 / ProbeInterval shared probes, plus slack for moves; unshared
		// would be 4 × 20 = 80.
		if perSecond > 12 {
			t.Errorf("z%d: %.1f probe connections a second from %d Conns, want ≤ 12 (shared probes)", i, perSecond, shared)
		}
	}

	var lastErr error
	for len(conns) < 100 {
		ok, err := open()
		if !ok {
			lastErr = err
			break
		}
	}
	most := len(conns) - 1
	if lastErr == nil {
		most = len(conns)
	}
	t.Logf("%d Conns with a session on every server before one failed (maxClientCnxns 60): %v", most, lastErr)
	if most < 50 {
		t.Errorf("only %d Conns per host", most)
	}
}
