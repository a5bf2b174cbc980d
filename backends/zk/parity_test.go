package zk_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// TestGoZookeeperParity: the calls of *zk.Conn that Conn adds — container
// and TTL znodes, incremental and whole reconfiguration — do on real
// servers what they do there, each routed as a write to the leader.
func TestGoZookeeperParity(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{Reconfig: true, ExtendedTypes: true})
	conn, _ := connect(t, c)
	leader, err := c.Leader(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	leaderID := c.Endpoints()[leader]
	writesAtLeader := func() uint64 {
		for _, m := range conn.Stats().Members {
			if m.Member.ID == leaderID {
				return m.OK[router.Write]
			}
		}
		t.Fatalf("no member %s in the router's stats", leaderID)
		return 0
	}
	routed := func(what string, before uint64) {
		t.Helper()
		if got := writesAtLeader(); got != before+1 {
			t.Errorf("%s: %d writes answered at the leader, want %d", what, got, before+1)
		}
	}

	before := writesAtLeader()
	if _, err := conn.CreateContainer("/box", nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	routed("CreateContainer", before)
	// ZooKeeper marks a container by an ephemeral owner of Long.MIN_VALUE.
	if _, st, err := conn.Exists("/box"); err != nil || st.EphemeralOwner != math.MinInt64 {
		t.Errorf("/box: stat %+v, %v; want a container", st, err)
	}

	before = writesAtLeader()
	if _, err := conn.CreateTTL("/ttl", nil, zk.FlagTTL, zk.WorldACL(zk.PermAll), time.Hour); err != nil {
		t.Fatal(err)
	}
	routed("CreateTTL", before)
	// A TTL node's ephemeral owner is 0xFF in its top byte and the TTL in
	// milliseconds below.
	if _, st, err := conn.Exists("/ttl"); err != nil || uint64(st.EphemeralOwner)>>56 != 0xff || st.EphemeralOwner&0xffffffffff != time.Hour.Milliseconds() {
		t.Errorf("/ttl: stat %+v, %v; want a TTL node of an hour", st, err)
	}

	// A whole membership against a configuration version that is not the
	// current one is refused (before any change: a reconfiguration under
	// way would be refused for that instead).
	cfg, _, err := conn.Get("/zookeeper/config")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Reconfig(strings.Split(strings.TrimSpace(string(cfg)), "\n"), 1); !errors.Is(err, zk.ErrBadVersion) {
		t.Errorf("Reconfig at a stale version: %v, want zk.ErrBadVersion", err)
	}

	follower := (leader + 1) % c.Size()
	sid := fmt.Sprint(c.Server(follower).SID)
	before = writesAtLeader()
	if _, err := conn.IncrementalReconfig(nil, []string{sid}, -1); err != nil {
		t.Fatal(err)
	}
	routed("IncrementalReconfig", before)
	// Read at the leader: the server removed may serve no more.
	if cfg, _, err = conn.GetContext(ozk.WithLeader(t.Context()), "/zookeeper/config"); err != nil || strings.Contains(string(cfg), "server."+sid+"=") {
		t.Errorf("after removing server.%s the configuration reads %q (%v)", sid, cfg, err)
	}
}

// TestConnectNamesTheWhitelist: servers whose 4lw.commands.whitelist
// leaves out srvr, the router's probe, refuse it; Connect then fails with
// ErrUnreachable that names the cause, ErrSrvrNotAllowed.
func TestConnectNamesTheWhitelist(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{FourLetterWords: []string{"stat", "ruok", "mntr", "conf", "cons"}})
	conn, _, err := ozk.Connect(c.Endpoints(), sessionTimeout, ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(3*time.Second))
	if err == nil {
		conn.Close()
		t.Fatal("Connect succeeded with srvr refused by every server")
	}
	if !errors.Is(err, ozk.ErrUnreachable) || !errors.Is(err, ozk.ErrSrvrNotAllowed) {
		t.Errorf("Connect: %v; want ErrUnreachable naming ErrSrvrNotAllowed", err)
	}
}
