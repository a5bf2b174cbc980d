package testbed_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/testbed"
)

// TestZKEnsemble: an ensemble starts with the topology's leader, its peer
// links carry the injected delay, and kill, restart and pause act on the
// real JVMs.
func TestZKEnsemble(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx := context.Background()
	if l, err := c.Leader(ctx); err != nil || l != 0 {
		t.Fatalf("leader %d, %v; want z0", l, err)
	}

	// Writes through the leader wait for a follower's ack: delaying every
	// follower's links by 5 ms must show in the leader's write latency,
	// which only happens if the peer links go through the proxies.
	conn, _, err := zk.Connect([]string{c.Endpoints()[0]}, 6*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Create("/t", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	setLatency := func() time.Duration {
		start := time.Now()
		for range 20 {
			if _, err := conn.Set("/t", []byte("x"), -1); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start) / 20
	}
	for range 5 {
		setLatency() // warm the JVMs up
	}
	base := setLatency()
	c.Degrade(1, 5*time.Millisecond, 0)
	c.Degrade(2, 5*time.Millisecond, 0)
	slow := setLatency()
	c.Degrade(1, 0, 0)
	c.Degrade(2, 0, 0)
	t.Logf("leader Set: %v; with followers' links +5 ms: %v", base, slow)
	if slow < base+6*time.Millisecond {
		t.Errorf("peer delay not applied: Set %v → %v, want ≥ +6 ms (it adds a 10 ms round trip)", base, slow)
	}

	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Up to initLimit×tickTime more where a follower still held the last
	// Set's proposal uncommitted (ZOOKEEPER-4685, docs/testbed.md).
	wctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	l, err := c.WaitLeader(wctx)
	if err != nil || l == 0 {
		t.Fatalf("after killing z0: leader %d, %v", l, err)
	}
	t.Logf("z%d leads %v after the kill", l, time.Since(start))
	if err := c.Restart(wctx, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Srvr(ctx, 0); err != nil || st.Mode != "follower" {
		t.Fatalf("restarted z0: %+v %v", st, err)
	}

	f := (l + 1) % 3
	if f == 0 {
		f = (l + 2) % 3
	}
	if err := c.Pause(f); err != nil {
		t.Fatal(err)
	}
	_, err = c.Srvr(ctx, f)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("srvr on a paused server: %v, want a timeout", err)
	}
	if err := c.Resume(f); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Srvr(ctx, f); err != nil {
		t.Errorf("srvr after resume: %v", err)
	}
}

// ZooKeeper answers one four-letter word per connection and closes it: a
// probe cannot keep a connection for srvr (3.8, NIOServerCnxn cancels the
// connection's key and closes it once the answer is written).
func TestFourLetterWordClosesConnection(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	conn, err := net.DialTimeout("tcp", c.DirectEndpoints()[0], 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("srvr")); err != nil {
		t.Fatal(err)
	}
	first, err := io.ReadAll(conn) // to the server's close
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(first, []byte("Mode:")) {
		t.Fatalf("srvr answered %q", first)
	}
	// A second word on the same connection gets nothing back.
	conn.Write([]byte("srvr"))
	if second, _ := io.ReadAll(conn); len(second) > 0 {
		t.Fatalf("a second four-letter word on one connection was answered: %q", second)
	}
}
