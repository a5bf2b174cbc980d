package zk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

func connect(t *testing.T, c *testbed.ZKCluster, opts ...ozk.Option) *ozk.Conn {
	t.Helper()
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

func TestSmoke(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	conn := connect(t, c)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.Create("/a", []byte("1"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create("/a", []byte("1"), 0, acl); err != zk.ErrNodeExists {
		t.Fatalf("second create: %v, want zk.ErrNodeExists", err)
	}
	for i := range 300 {
		if _, err := conn.Set("/a", []byte{byte(i)}, -1); err != nil {
			t.Fatal(err)
		}
		d, _, err := conn.Get("/a")
		if err != nil || d[0] != byte(i) {
			t.Fatalf("get %d: %v %v", i, d, err)
		}
	}
	if _, _, err := conn.Get("/nope"); err != zk.ErrNoNode {
		t.Fatalf("get missing: %v", err)
	}
	st := conn.Stats()
	for _, m := range st.Members {
		t.Logf("%s leader=%v ops=%v", m.Member.ID, m.Leader, m.Ops)
	}
	t.Logf("sessions per server %v", conn.SessionServers())
	for i := range c.Size() {
		m, _ := c.Mntr(context.Background(), i)
		t.Logf("z%d reads %s writes %s", i, m["zk_cnt_readlatency"], m["zk_cnt_updatelatency"])
	}
	_ = errors.Is
	_ = router.Hybrid
}

const sessionTimeout = 6 * time.Second
