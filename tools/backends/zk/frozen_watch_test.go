package zk_test

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/testutil"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// maxWatchLateness is the most a watch may fire after the change it
// reports was acknowledged, while the server that holds it is frozen: the
// mechanism's 2.4 s (1.5 s of silence, 400 ms for the ping's answer, a
// 500 ms probe) and 1.6 s for the session's move, its reconnection and the
// watch set again on a loaded machine. Unrouted, it fires after about 19 s.
const maxWatchLateness = 4 * time.Second

// An otherwise idle, settled Conn holds a watch through a follower; the
// follower is frozen (SIGSTOP: its TCP connections stay open) and a plain
// client changes the node through another server. The watch fires within
// maxWatchLateness of the change. The session timeout is 30 s, a common
// one: go-zookeeper alone would give up on the server after 20 s.
func TestIdleWatchLeavesFrozenServer(t *testing.T) {
	c := testbed.SharedZKT(t)
	conn, _, err := ozk.Connect(c.Endpoints(), 30*time.Second, ozk.WithConnectTimeout(30*time.Second), ozk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if _, err := conn.Create("/frozen-w", []byte("0"), 0, acl); err != nil {
		t.Fatal(err)
	}
	leader := -1
	testutil.Poll(t, 10*time.Second, "a leader", func() bool {
		for i := range c.Size() {
			if st, err := c.Srvr(t.Context(), i); err == nil && st.Mode == "leader" {
				leader = i
			}
		}
		return leader >= 0
	})
	frozen := (leader + 1) % c.Size()
	writer := direct(t, c, (frozen+1)%c.Size())
	_, _, events, err := conn.GetWContext(ozk.WithPreferredMember(t.Context(), c.Endpoints()[frozen]), "/frozen-w")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 15*time.Second, "the Conn settled", func() bool { return settled(conn) })

	if err := c.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	defer c.Resume(frozen)
	if _, err := writer.Set("/frozen-w", []byte("1"), -1); err != nil {
		t.Fatal(err)
	}
	acked := time.Now()
	select {
	case ev := <-events:
		late := time.Since(acked)
		t.Logf("z%d frozen: the watch fired %v after the change was acknowledged (%v)", frozen, late.Round(time.Millisecond), ev.Type)
		if ev.Type != zk.EventNodeDataChanged {
			t.Fatalf("the watch ended with %+v, want a data change", ev)
		}
		if late > maxWatchLateness {
			t.Errorf("the watch fired %v after the change, want at most %v", late.Round(time.Millisecond), maxWatchLateness)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not fire within 20 s of the change")
	}
}
