package zk_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// ZooKeeper opcodes the stalling dialer tells apart.
const (
	opPing        = 11
	opSetWatches  = 101
	stallDuration = 300 * time.Millisecond
)

// reconnectStaller dials as the default dialer does. Once armed, it delays
// the redial (a server slow to accept: calls queue meanwhile) and, on the
// next connection, holds go-zookeeper's send loop for a while right after
// the first request that goes out ahead of the session's opSetWatches: the
// reply to that request then arrives while the watches are still being
// re-registered, the window in which go-zookeeper v1.0.4 races on lastZxid.
type reconnectStaller struct {
	dialed
	armed     atomic.Bool
	exercised atomic.Int64 // connections with a request answered ahead of opSetWatches
}

func (d *reconnectStaller) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	if d.armed.Load() {
		time.Sleep(100 * time.Millisecond) // fault injection: a slow accept
	}
	c, err := d.dialed.dial(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, d: d, stall: d.armed.Load()}, nil
}

type stallConn struct {
	net.Conn
	d       *reconnectStaller
	stall   bool
	writes  int  // only go-zookeeper's send side writes: no lock
	stalled bool // a request went out ahead of opSetWatches and was held
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.writes++
	n, err := c.Conn.Write(b)
	if c.writes == 1 || len(b) < 12 {
		return n, err // the connect request has no request header
	}
	switch int32(binary.BigEndian.Uint32(b[8:12])) {
	case opSetWatches:
		if c.stalled {
			c.d.exercised.Add(1)
		}
		c.stall = false
	case opPing, opSetAuth:
	default:
		if c.stall {
			c.stall, c.stalled = false, true
			time.Sleep(stallDuration) // fault injection: a slow send side
		}
	}
	return n, err
}

// A session holding watches reconnects, with calls that waited out the
// disconnection answered while go-zookeeper re-registers the watches:
// under -race (the README's test command) go-zookeeper v1.0.4 alone fails
// this with a data race on lastZxid; the watches still fire afterwards.
func TestReconnectWithWatchesIsRaceFree(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := direct(t, c, 0)
	if _, err := admin.Create("/wr", []byte("0"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	d := &reconnectStaller{}
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithConnectTimeout(sessionTimeout), ozk.WithDialer(d.dial), ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ep := c.Endpoints()[0]
	member := ozk.WithMember(ctx, ep)
	_, _, watch, err := conn.GetWContext(member, "/wr")
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(member, 2*time.Second)
				conn.GetContext(rctx, "/wr") // fails across the kicks
				rcancel()
			}
		}()
	}
	for cycle := 0; cycle < 20 && d.exercised.Load() < 3; cycle++ {
		before := d.exercised.Load()
		d.armed.Store(true)
		d.kick()
		deadline := time.Now().Add(5 * time.Second)
		for d.exercised.Load() == before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling the dialer's count
		}
		d.armed.Store(false)
	}
	close(stop)
	readers.Wait()
	if n := d.exercised.Load(); n == 0 {
		t.Fatal("no reply came in ahead of opSetWatches in 20 reconnects: the test tested nothing")
	} else {
		t.Logf("%d reconnects with a request answered ahead of opSetWatches", n)
	}

	// The watch was re-registered on each reconnect: it fires.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := conn.SetContext(wctx, "/wr", []byte("1"), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-watch:
		if ev.Type != zk.EventNodeDataChanged {
			t.Fatalf("watch event %v, want EventNodeDataChanged", ev)
		}
	case <-wctx.Done():
		t.Fatal("the watch did not fire 10 s after the write")
	}
}
