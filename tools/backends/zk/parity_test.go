package zk_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// TestGoZookeeperParity: the calls of *zk.Conn that Conn adds — container
// and TTL znodes, incremental and whole reconfiguration — do on real
// servers what they do there, each routed as a write to the leader.
func TestGoZookeeperParity(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{Reconfig: true, ExtendedTypes: true, ContainerCheck: 100 * time.Millisecond})
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

	gone := func(path string) {
		t.Helper()
		testutil.Poll(t, 20*time.Second, path+" deleted by the servers", func() bool {
			ok, _, err := conn.Exists(path)
			return err == nil && !ok
		})
	}
	// The servers hide a container's and a TTL node's kind from clients'
	// stats (ephemeral owner 0): what shows it is what they delete.
	before := writesAtLeader()
	if _, err := conn.CreateContainer("/box", nil, zk.FlagContainer, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	routed("CreateContainer", before)
	if _, err := conn.Create("/box/item", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Delete("/box/item", -1); err != nil {
		t.Fatal(err)
	}
	gone("/box") // a container, emptied
	if _, err := conn.Create("/plain", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	before = writesAtLeader()
	if _, err := conn.CreateTTL("/ttl", nil, zk.FlagTTL, zk.WorldACL(zk.PermAll), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	routed("CreateTTL", before)
	gone("/ttl") // unchanged past its TTL
	// A plain znode, created before them and checked as often, stays.
	if ok, _, err := conn.Exists("/plain"); err != nil || !ok {
		t.Errorf("/plain: exists %v, %v; the servers deleted a plain znode", ok, err)
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

// TestWhitelistAndLogger: ZooKeeper answers srvr, the router's probe,
// whatever its 4lw.commands.whitelist says, so a Conn connects to servers
// whose list leaves it out; a word the list leaves out is refused with a
// text the test bed reads as ErrFourLetterWordRefused. Servers without extended
// types refuse a TTL znode, which is the caller's error, and flags that
// name no TTL znode are refused before any server sees them. And SetLogger
// reaches the sessions: their connections reset, go-zookeeper logs it to
// the new logger.
func TestWhitelistAndLogger(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{FourLetterWords: []string{"stat", "ruok"}})
	conn, _ := connect(t, c)
	if _, err := c.Mntr(t.Context(), 0); !errors.Is(err, testbed.ErrFourLetterWordRefused) {
		t.Errorf("mntr, left out of the whitelist: %v, want testbed.ErrFourLetterWordRefused", err)
	}
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatal(err)
	}
	// Without extended types the servers refuse a TTL znode as
	// unimplemented: the caller's error, no fault of the leader's.
	faults := func() (n uint64) {
		for _, m := range conn.Stats().Members {
			n += m.Errors[router.Write]
		}
		return n
	}
	before := faults()
	if _, err := conn.CreateTTL("/ttl", nil, zk.FlagTTL, zk.WorldACL(zk.PermAll), time.Hour); err == nil {
		t.Error("CreateTTL succeeded on servers without extended types")
	}
	if got := faults(); got != before {
		t.Errorf("the refused CreateTTL counted as %d member faults", got-before)
	}
	if _, err := conn.CreateTTL("/ttl", nil, zk.FlagTTL|zk.FlagSequence, zk.WorldACL(zk.PermAll), time.Hour); !errors.Is(err, zk.ErrInvalidFlags) {
		t.Errorf("CreateTTL with flags TTL|Sequence: %v, want zk.ErrInvalidFlags", err)
	}
	var got logLines
	conn.SetLogger(&got)
	for i := range c.Size() {
		c.ResetClients(i, true)
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.len() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling the logger, not synchronising
	}
	for i := range c.Size() {
		c.ResetClients(i, false)
	}
	if got.len() == 0 {
		t.Error("no line reached the logger SetLogger set while every session's connection was reset")
	}
}

// logLines is a zk.Logger that keeps what it is given.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Printf(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *logLines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}
