package testbed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// Removed reports whether the server was removed from the ensemble.
func (s *ZKServer) Removed() bool { return s.removed.Load() }

// serverLine is s's line in a dynamic configuration: direct peer ports,
// a voting member, its client port.
func (s *ZKServer) serverLine() string {
	return fmt.Sprintf("server.%d=127.0.0.1:%d:%d:participant;127.0.0.1:%d", s.SID, s.quorumPort, s.electionPort, s.clientPort)
}

// reconfigure asks server via (directly) for an incremental
// reconfiguration, as zkCli's reconfig -add / -remove. Removing the leader
// can cut the answer off (its followers drop their clients while they
// elect a new one): then the ensemble's configuration says whether the
// change took.
func (c *ZKCluster) reconfigure(ctx context.Context, via int, joining, leaving []string) error {
	err := c.withClient(ctx, via, func(conn *zk.Conn) error {
		_, err := conn.IncrementalReconfig(joining, leaving, -1)
		return err
	})
	if err == nil || !(errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrNoServer)) {
		return err
	}
	applied := func(cfg string) bool {
		for _, line := range joining {
			if !strings.Contains(cfg, line) {
				return false
			}
		}
		for _, sid := range leaving {
			if strings.Contains(cfg, "server."+sid+"=") {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for j, o := range c.servers {
			// Not the servers changing: a joining one has its own line in
			// its configuration from the start.
			if o.removed.Load() || o.PID() == 0 || slices.Contains(leaving, strconv.Itoa(o.SID)) || slices.Contains(joining, o.serverLine()) {
				continue
			}
			var cfg []byte
			if c.withClient(ctx, j, func(conn *zk.Conn) (err error) {
				cfg, _, err = conn.Get("/zookeeper/config")
				return err
			}) == nil {
				if applied(string(cfg)) {
					return nil
				}
				break // not yet on this server: ask again
			}
		}
		time.Sleep(200 * time.Millisecond) // an election under way
	}
	return fmt.Errorf("testbed: reconfig (+%v −%v): no answer, and not applied within 20 s: %w", joining, leaving, err)
}

// AddServer grows a Reconfig ensemble by a server in zone, as an operator
// does: the new server starts with the current ensemble and itself in its
// configuration, syncs with the leader as a non-voting follower, and a
// reconfig -add makes it a voting member. It returns the new server's
// index once it serves. Indexes never move. Not to be called concurrently
// with other calls on the ensemble.
func (c *ZKCluster) AddServer(ctx context.Context, zone string) (int, error) {
	if !c.opts.Reconfig {
		return -1, errors.New("testbed: AddServer needs ZKOptions.Reconfig")
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return -1, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return -1, err
	}
	i := len(c.servers)
	sid := 0
	for _, o := range c.servers {
		sid = max(sid, o.SID)
	}
	s := &ZKServer{Index: i, Name: fmt.Sprintf("z%d", i), Zone: zone, SID: sid + 1,
		clientPort: ports[0], quorumPort: ports[1], electionPort: ports[2]}
	s.server.name = s.Name
	if err := c.cpu.grow(i); err != nil {
		return -1, err
	}
	c.servers = append(c.servers, s)
	c.topo.Zones = append(c.topo.Zones, zone)
	c.grow(&s.server, i, zone, strconv.Itoa(i))
	if err := c.writeConfig(s, nil); err != nil {
		return -1, err
	}
	if err := c.launchJVM(s); err != nil {
		return -1, err
	}
	if err := c.reconfigure(ctx, leader, []string{s.serverLine()}, nil); err != nil {
		return -1, err
	}
	if err := c.waitServing(ctx, i); err != nil {
		return -1, err
	}
	return i, nil
}

// RemoveServer shrinks a Reconfig ensemble by server i (the leader too),
// as an operator does: reconfig -remove asked of another server, then the
// removed server's JVM is stopped. Its index stays, not running. Not to be
// called concurrently with other calls on the ensemble.
func (c *ZKCluster) RemoveServer(ctx context.Context, i int) error {
	if !c.opts.Reconfig {
		return errors.New("testbed: RemoveServer needs ZKOptions.Reconfig")
	}
	s := c.servers[i]
	if s.removed.Load() {
		return fmt.Errorf("testbed: %s was removed", s.Name)
	}
	via := -1
	for j, o := range c.servers {
		if j != i && !o.removed.Load() && o.PID() != 0 {
			via = j
			break
		}
	}
	if via < 0 {
		return fmt.Errorf("%w: no other server to ask", ErrNotRunning)
	}
	if err := c.reconfigure(ctx, via, nil, []string{strconv.Itoa(s.SID)}); err != nil {
		return err
	}
	s.removed.Store(true)
	if s.PID() != 0 {
		if err := c.Kill(i); err != nil && s.PID() != 0 {
			return err
		}
	}
	_, err := c.WaitLeader(ctx)
	return err
}
