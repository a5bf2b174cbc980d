package zk_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// probeLiar dials as the default dialer does. While armed for an address,
// a srvr probe sent there gets ZooKeeper's no-quorum answer instead of the
// server's: a probe result older than the server's state, as when a round
// that began during an election ends after the server serves again. It
// counts the session connections (the others) per address.
type probeLiar struct {
	armed    atomic.Pointer[string]
	lies     atomic.Int64
	mu       sync.Mutex
	sessions map[string]int
}

func (d *probeLiar) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &liarConn{Conn: c, d: d, addr: addr}, nil
}

func (d *probeLiar) sessionDials(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sessions[addr]
}

type liarConn struct {
	net.Conn
	d       *probeLiar
	addr    string
	written bool
	lie     io.Reader // set when this probe is answered with the lie
}

func (c *liarConn) Write(b []byte) (int, error) {
	if !c.written {
		c.written = true
		if string(b) == "srvr" {
			if a := c.d.armed.Load(); a != nil && *a == c.addr {
				c.d.lies.Add(1)
				c.lie = strings.NewReader("This ZooKeeper instance is not currently serving requests\n")
				return len(b), nil
			}
		} else {
			c.d.mu.Lock()
			if c.d.sessions == nil {
				c.d.sessions = map[string]int{}
			}
			c.d.sessions[c.addr]++
			c.d.mu.Unlock()
		}
	}
	return c.Conn.Write(b)
}

func (c *liarConn) Read(b []byte) (int, error) {
	if c.lie != nil {
		return c.lie.Read(b) // io.EOF after the answer, as the server closes
	}
	return c.Conn.Read(b)
}

// A probe that says a server does not serve while a session of the Conn is
// established there does not cut that session: a server without quorum
// closes its client connections itself, so the established session is the
// fresher news, and cutting it fails the calls in flight on it (as after
// an election, when a round that began while a follower synced ends after
// sessions are back on it). The server leaves the read pool all the same.
func TestStaleNotServingProbeKeepsSession(t *testing.T) {
	c := testbed.SharedZKT(t)
	d := &probeLiar{}
	// Probed every round even when settled: the lie must reach the router soon.
	conn, _ := connect(t, c, ozk.WithDialer(d.dial), ozk.WithRouterConfig(func(rc *router.Config) {
		rc.StableProbeInterval = router.DefaultProbeInterval
	}))
	if _, err := conn.Create("/ns", []byte("x"), 0, acl); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	x := (leader + 1) % 3
	testutil.Poll(t, 10*time.Second, "a session on the follower", func() bool {
		if _, _, err := conn.Get("/ns"); err != nil {
			t.Fatal(err)
		}
		return testhooks.ZKSessionServers(conn)[x] > 0
	})
	addr := c.Endpoints()[x]
	dials := d.sessionDials(addr)
	d.armed.Store(&addr)
	// Reads go on, so that the follower is in use and probed every round.
	testutil.Poll(t, 20*time.Second, "the follower out of reach to the router", func() bool {
		if _, _, err := conn.Get("/ns"); err != nil {
			t.Fatal(err)
		}
		return !conn.Stats().Members[x].Reachable
	})
	rounds := conn.Stats().ProbeRounds
	testutil.Poll(t, 30*time.Second, "two more probe rounds", func() bool { return conn.Stats().ProbeRounds >= rounds+2 })
	t.Logf("%d probes of m%d answered not serving", d.lies.Load(), x)
	if n := testhooks.ZKSessionServers(conn)[x]; n == 0 || d.sessionDials(addr) != dials {
		t.Errorf("the session on m%d was cut for a probe that said it does not serve: %d sessions there, %d session dials (was %d)", x, n, d.sessionDials(addr), dials)
	}
	if conn.Stats().Members[x].Reachable {
		t.Errorf("m%d reachable to the router while its probes say it does not serve", x)
	}
	d.armed.Store(nil)
	testutil.Poll(t, 20*time.Second, "the follower back", func() bool { return conn.Stats().Members[x].Reachable })
}
