package testbed_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/testbed"
)

// TestZKEnsemble: an ensemble starts with the topology's leader, and kill,
// restart and pause act on the real JVMs. That its peer links carry the
// injected delay is TestZKDegradePeers's, which times it with the cores
// held and judges each state by its lower fifth.
func TestZKEnsemble(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx := context.Background()
	if l, err := c.Leader(ctx); err != nil || l != 0 {
		t.Fatalf("leader %d, %v; want z0", l, err)
	}

	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Up to initLimit×tickTime more where a follower still held a
	// proposal uncommitted (ZOOKEEPER-4685, docs/testbed.md).
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
