package zk

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oproute/oproute/internal/testutil"
)

// The package's tests here need no server: those against real servers are
// in the tools module (tools/backends/zk), beside the test bed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A move waiting for a request in flight to drain must end with Close, at
// once: it used to outlive Close and wait out its 2 s drain. The move
// drains before it dials, so the servers need not answer.
func TestCloseEndsMovesAtOnce(t *testing.T) {
	conn, _, err := Connect([]string{"127.0.0.1:1", "127.0.0.1:2"}, 6*time.Second, WithLogger(testutil.Discard{}))
	if err != nil {
		t.Fatal(err)
	}
	s := conn.primary
	if err := s.gate.enter(context.Background()); err != nil { // in flight for good
		t.Fatal(err)
	}
	defer s.gate.leave()
	s.moving.Store(true)
	conn.bg.Go(func() { s.moveDrained(conn.ctx, (int(s.cur.Load())+1)%len(conn.servers().members)) })
	testutil.Poll(t, 5*time.Second, "the move draining", func() bool { return gateShut(&s.gate) })
	start := time.Now()
	conn.Close()
	// Below the move's 2 s drain; above go-zookeeper's own Close, which
	// waits up to 1 s for its close request when a session's connection is
	// being dialled (took 1.002 s once in a quick-tier run).
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Close took %v with a move draining", took)
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "moveDrained") {
		t.Error("a move outlived Close")
	}
}

func gateShut(g *gate) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shutc != nil
}
